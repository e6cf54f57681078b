//! Fair lock: strict FIFO across processes, dead waiters evicted, head-only hand-off, and a
//! clean queue afterwards. Real redis-server, real OS processes, both notification modes.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use fredlock::{Config, Lease, LockClient, NotificationMode};
use support::{
    emit_result, init_tracing, is_worker, spawn_worker_handle, worker_param, RedisServer, Resp,
    RespConn,
};
use support::{eventually, parse_mode, HANG, MODES};

/// One shard, so the test can name the keys: `{prefix:0}:fair.queue:<name>` etc.
fn config(url: &str, mode: NotificationMode, prefix: &str, waiter_lease: Duration) -> Config {
    let mut config = support::config(url, prefix, mode);
    config.shards = 1;
    config.waiter_lease = waiter_lease;
    config
}

fn queue_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:fair.queue:{name}")
}

fn alive_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:fair.alive:{name}")
}

/// Waits (bounded) until the queue of `name` holds `len` waiters.
fn wait_queue_len(server: &RedisServer, prefix: &str, name: &str, len: i64) {
    let deadline = std::time::Instant::now() + HANG;
    while server.cmd(&["LLEN", &queue_key(prefix, name)]).as_int() != len {
        assert!(
            std::time::Instant::now() < deadline,
            "queue never reached {len}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn worker_env(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    role: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("FAIR_URL", server.url()),
        ("FAIR_PORT", server.port().to_string()),
        ("FAIR_MODE", mode.as_str().to_owned()),
        ("FAIR_PREFIX", prefix.to_owned()),
        ("FAIR_ROLE", role.to_owned()),
    ]
}

/// Worker process: runs one role against the server given in its environment.
#[test]
#[ignore = "worker process of the fair lock tests"]
fn fair_worker() {
    if !is_worker() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run_worker());
}

async fn run_worker() {
    let param = |name: &str| worker_param(name).unwrap_or_else(|| panic!("missing {name}"));
    let waiter_lease = param("FAIR_WAITER_LEASE_MS").parse().expect("lease");
    let config = config(
        &param("FAIR_URL"),
        parse_mode(&param("FAIR_MODE")),
        &param("FAIR_PREFIX"),
        Duration::from_millis(waiter_lease),
    );
    let locks = LockClient::connect(config).await.expect("connect");
    let port: u16 = param("FAIR_PORT").parse().expect("port");
    match param("FAIR_ROLE").as_str() {
        "fifo" => fifo_worker(&locks, port, &param("FAIR_CONTROL")).await,
        "loop" => loop_worker(&locks, port, param("FAIR_PROC").parse().expect("proc")).await,
        "wait" => {
            let guard = locks
                .fair_mutex("dead-head")
                .unwrap()
                .lock()
                .await
                .expect("lock");
            emit_result(format!("ACQUIRED {}", guard.fencing_token()));
            guard.unlock().await.expect("unlock");
        }
        role => panic!("unknown role {role}"),
    }
    locks.shutdown().await.expect("shutdown");
}

/// Blocking pop of the next control message of this worker.
async fn next_command(port: u16, control: &str) -> String {
    let control = control.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn = RespConn::connect(port).expect("control connection");
        conn.set_timeout(Duration::from_secs(120)).expect("timeout");
        let reply = conn.cmd(&["BLPOP", &control, "0"]).expect("BLPOP");
        reply.as_array()[1].as_str().expect("command")
    })
    .await
    .expect("control task")
}

/// Starts one waiter per "start <i>" command; each records its acquisition rank.
async fn fifo_worker(locks: &LockClient, port: u16, control: &str) {
    let mutex = locks.fair_mutex("fifo").unwrap();
    let mut tasks = Vec::new();
    loop {
        let command = next_command(port, control).await;
        let Some(arrival) = command.strip_prefix("start ") else {
            break;
        };
        let arrival = arrival.to_owned();
        let mutex = mutex.clone();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            use fred::interfaces::KeysInterface;
            let guard = mutex.lock().await.expect("lock");
            let rank: i64 = redis.incr("fifo-rank").await.expect("INCR");
            emit_result(format!("{arrival} {rank}"));
            guard.unlock().await.expect("unlock");
        }));
    }
    for task in tasks {
        task.await.expect("waiter task");
    }
}

const LOOP_TASKS: usize = 4;
const LOOP_ROUNDS: usize = 25;

fn command(name: &'static str) -> fred::types::CustomCommand {
    fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::FirstKey, false)
}

/// 4 tasks loop on one fair lock: non-atomic counter increment, and the holder order logged.
async fn loop_worker(locks: &LockClient, _port: u16, proc_id: usize) {
    use fred::interfaces::{ClientLike, KeysInterface};
    let mut tasks = Vec::new();
    let queue = queue_key(&locks.config().key_prefix, "loop");
    for task in 0..LOOP_TASKS {
        let queue = queue.clone();
        let mutex = locks.fair_mutex("loop").unwrap();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            let id = proc_id * LOOP_TASKS + task;
            let mut violations = 0;
            for _ in 0..LOOP_ROUNDS {
                let guard = mutex.lock().await.expect("lock");
                let inside: i64 = redis.incr("loop-inside").await.expect("INCR");
                if inside != 1 {
                    violations += 1;
                }
                let value: Option<i64> = redis.get("loop-counter").await.expect("GET");
                tokio::task::yield_now().await;
                let _: () = redis
                    .set("loop-counter", value.unwrap_or(0) + 1, None, None, false)
                    .await
                    .expect("SET");
                // The queue as the holder sees it, for the FIFO check.
                let queue: Vec<String> = redis
                    .custom(
                        command("LRANGE"),
                        vec![queue.clone(), "0".into(), "-1".into()],
                    )
                    .await
                    .expect("LRANGE");
                let _: i64 = redis
                    .custom(
                        command("RPUSH"),
                        vec!["loop-log".to_owned(), format!("{id}:{}", queue.join(","))],
                    )
                    .await
                    .expect("RPUSH");
                let _: i64 = redis.decr("loop-inside").await.expect("DECR");
                guard.unlock().await.expect("unlock");
            }
            violations
        }));
    }
    let mut violations = 0;
    for task in tasks {
        violations += task.await.expect("loop task");
    }
    emit_result(format!("violations {violations}"));
}

#[test]
fn twelve_waiters_in_three_processes_acquire_in_arrival_order() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fifo-{}", mode.as_str());
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let locks = runtime
            .block_on(LockClient::connect(config(
                &server.url(),
                mode,
                &prefix,
                Duration::from_secs(3),
            )))
            .unwrap();
        let mutex = locks.fair_mutex("fifo").unwrap();
        let holder = runtime.block_on(mutex.lock()).unwrap();

        let workers: Vec<_> = (0..3)
            .map(|p| {
                let mut env = worker_env(&server, mode, &prefix, "fifo");
                env.push(("FAIR_CONTROL", format!("{prefix}-control-{p}")));
                env.push(("FAIR_WAITER_LEASE_MS", "3000".into()));
                spawn_worker_handle("fair_worker", &env)
            })
            .collect();
        // Arrivals 20 ms apart, each one queued in Redis before the next starts.
        for arrival in 0..12 {
            let control = format!("{prefix}-control-{}", arrival % 3);
            server.cmd(&["RPUSH", &control, &format!("start {arrival}")]);
            wait_queue_len(&server, &prefix, "fifo", arrival + 1);
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in 0..3 {
            server.cmd(&["RPUSH", &format!("{prefix}-control-{p}"), "done"]);
        }
        runtime.block_on(holder.unlock()).unwrap();

        let mut rank_of = HashMap::new();
        for worker in workers {
            for line in worker.wait() {
                let (arrival, rank) = line.split_once(' ').expect("arrival rank");
                rank_of.insert(
                    arrival.parse::<i64>().unwrap(),
                    rank.parse::<i64>().unwrap(),
                );
            }
        }
        server.cmd(&["DEL", "fifo-rank"]);
        assert_eq!(rank_of.len(), 12);
        let inversions = (0..12)
            .flat_map(|a| (a + 1..12).map(move |b| (a, b)))
            .filter(|(a, b)| rank_of[a] > rank_of[b])
            .count();
        assert_eq!(inversions, 0, "{mode:?}: ranks by arrival {rank_of:?}");
        assert_no_queue_left(&server, &prefix, "fifo");
        runtime.block_on(locks.shutdown()).unwrap();
    }
}

fn assert_no_queue_left(server: &RedisServer, prefix: &str, name: &str) {
    let deadline = std::time::Instant::now() + HANG;
    let bids = format!("{{{prefix}:0}}:fair.bids:{name}");
    loop {
        let queue = server.cmd(&["EXISTS", &queue_key(prefix, name)]).as_int();
        let alive = server.cmd(&["EXISTS", &alive_key(prefix, name)]).as_int();
        let bids = server.cmd(&["EXISTS", &bids]).as_int();
        if queue == 0 && alive == 0 && bids == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queue keys left behind"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_waiter_at_the_head_is_evicted_and_the_next_one_proceeds() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("dead-{}", mode.as_str());
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let lease = Duration::from_millis(900);
        let locks = runtime
            .block_on(LockClient::connect(config(
                &server.url(),
                mode,
                &prefix,
                lease,
            )))
            .unwrap();
        let mutex = locks
            .fair_mutex("dead-head")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_secs(120)))
            .unwrap();
        let holder = runtime.block_on(mutex.lock()).unwrap();
        let spawn = || {
            let mut env = worker_env(&server, mode, &prefix, "wait");
            env.push(("FAIR_WAITER_LEASE_MS", lease.as_millis().to_string()));
            spawn_worker_handle("fair_worker", &env)
        };
        let doomed = spawn();
        wait_queue_len(&server, &prefix, "dead-head", 1);
        let next = spawn();
        wait_queue_len(&server, &prefix, "dead-head", 2);
        doomed.kill();
        // The release grants the lock to the dead head, but only for what is left of its waiter
        // lease; when that runs out, the survivor's heartbeat finds the lock free and names
        // the survivor, the new head. The holder's 120 s lease plays no part.
        runtime.block_on(holder.unlock()).unwrap();
        let acquired = next.expect_result(HANG);
        assert!(acquired.starts_with("ACQUIRED"), "{acquired}");
        next.wait();
        assert_no_queue_left(&server, &prefix, "dead-head");
        runtime.block_on(locks.shutdown()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_gives_up_passes_the_turn_without_waiting_for_a_lease() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("leave-{}", mode.as_str());
        // Waiter leases and the holder's lease are far longer than the bound below, so only
        // the hand-off on leaving can let the second waiter in.
        let cfg = config(&server.url(), mode, &prefix, Duration::from_secs(120));
        let locks = LockClient::connect(cfg).await.unwrap();
        let mutex = locks
            .fair_mutex("turn")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_secs(120)))
            .unwrap();

        // 1. The head times out while the lock is held: the next waiter is first afterwards.
        let holder = mutex.lock().await.unwrap();
        let impatient = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock_timeout(Duration::from_millis(300)).await })
        };
        wait_queue_len_async(&server, &prefix, "turn", 1).await;
        let patient = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
        };
        wait_queue_len_async(&server, &prefix, "turn", 2).await;
        assert!(impatient.await.unwrap().unwrap().is_none(), "timed out");
        wait_queue_len_async(&server, &prefix, "turn", 1).await;
        holder.unlock().await.unwrap();
        tokio::time::timeout(HANG, patient)
            .await
            .unwrap()
            .unwrap()
            .unwrap();

        // 2. The release grants the lock to the head, which is dropped before it took the grant
        //    up: leaving frees the grant and hands the turn to the next waiter at once.
        let holder = mutex.lock().await.unwrap();
        let mut head = Box::pin(mutex.lock());
        while locks.stats().queued_in_redis < 1 {
            tokio::select! {
                biased;
                _ = &mut head => panic!("the head cannot acquire while the lock is held"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        let second = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
        };
        wait_queue_len_async(&server, &prefix, "turn", 2).await;
        holder.unlock().await.unwrap(); // grants to the head, which is never polled again
        drop(head);
        let token = tokio::time::timeout(HANG, second)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(token > 0);
        eventually("no orphaned attempts", || {
            locks.stats().orphaned_attempts == 0
        })
        .await;
        assert_no_queue_left(&server, &prefix, "turn");
        assert_eq!(locks.stats().queued_in_redis, 0);
        locks.shutdown().await.unwrap();
    }
}

async fn wait_queue_len_async(server: &RedisServer, prefix: &str, name: &str, len: i64) {
    let deadline = tokio::time::Instant::now() + HANG;
    while server.cmd(&["LLEN", &queue_key(prefix, name)]).as_int() != len {
        assert!(
            tokio::time::Instant::now() < deadline,
            "queue never reached {len}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn four_processes_by_four_tasks_are_exclusive_and_served_in_queue_order() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("loop-{}", mode.as_str());
        for key in ["loop-counter", "loop-log", "loop-inside"] {
            server.cmd(&["DEL", key]);
        }
        let workers: Vec<_> = (0..4)
            .map(|p| {
                let mut env = worker_env(&server, mode, &prefix, "loop");
                env.push(("FAIR_PROC", p.to_string()));
                env.push(("FAIR_WAITER_LEASE_MS", "3000".into()));
                spawn_worker_handle("fair_worker", &env)
            })
            .collect();
        let mut violations = 0;
        for worker in workers {
            for line in worker.wait() {
                violations += line
                    .strip_prefix("violations ")
                    .and_then(|n| n.parse::<i64>().ok())
                    .expect("violations line");
            }
        }
        let total = (4 * LOOP_TASKS * LOOP_ROUNDS) as i64;
        assert_eq!(violations, 0, "{mode:?}: overlapping critical sections");
        assert_eq!(
            server.cmd(&["GET", "loop-counter"]).as_int(),
            total,
            "{mode:?}: lost updates"
        );
        let log: Vec<Vec<String>> = server
            .cmd(&["LRANGE", "loop-log", "0", "-1"])
            .as_array()
            .iter()
            .map(|r: &Resp| {
                let entry = r.as_str().unwrap();
                let (_, queue) = entry.split_once(':').unwrap();
                queue
                    .split(',')
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .collect();
        assert_eq!(log.len() as i64, total);
        let contended = log.iter().filter(|queue| queue.len() >= 2).count();
        assert!(
            contended > log.len() / 2,
            "{mode:?}: the lock was hardly contended"
        );
        let inversions = queue_order_breaks(&log);
        assert_eq!(inversions, 0, "{mode:?}: the queue was not served in order");
        assert_no_queue_left(&server, &prefix, "loop");
    }
}

/// Each holder logged the queue it saw. Between two holders the queue may only lose its head
/// (the next holder: the acquire script pops the head only when the head acquires) and gain
/// waiters at the tail. Counts the hand-offs that broke that rule.
fn queue_order_breaks(log: &[Vec<String>]) -> usize {
    log.windows(2)
        .filter(|pair| {
            let (before, after) = (&pair[0], &pair[1]);
            let survivors = before.get(1..).unwrap_or(&[]);
            !after.starts_with(survivors)
        })
        .count()
}

/// In a real client, a queued waiter's `lock()` returns on the grant event alone: its client
/// runs no script for it after joining the queue. The granted hold (shorter than the lease, at
/// most the waiter lease) is then topped up to the full lease: for a watchdog lease and for a
/// fixed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_waiter_returns_without_a_script_and_gets_its_full_lease() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        for lease in [
            Lease::watchdog(Duration::from_secs(60)),
            Lease::fixed(Duration::from_secs(60)),
        ] {
            let prefix = format!("grant-{}", mode.as_str());
            let cfg = |lease_ms| {
                config(
                    &server.url(),
                    mode,
                    &prefix,
                    Duration::from_millis(lease_ms),
                )
            };
            let holder_client = LockClient::connect(cfg(9000)).await.unwrap();
            let waiter_client = LockClient::connect(cfg(9000)).await.unwrap();
            let holding = holder_client.fair_mutex("granted").unwrap();
            let waiting = waiter_client
                .fair_mutex("granted")
                .unwrap()
                .with_lease(lease)
                .unwrap();
            if mode == NotificationMode::PubSub {
                // A message published before the waiter's client has subscribed is lost (the
                // waiter then finds its grant by asking Redis, which is correct but not what
                // this test is about): wait until both clients listen.
                let channel = format!("{{{prefix}:events}}");
                eventually("both clients subscribed", || {
                    let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]).as_array();
                    reply.get(1).map(Resp::as_int) == Some(2)
                })
                .await;
            }
            let holder = holding.lock().await.unwrap();
            let waiter = tokio::spawn(async move { waiting.lock().await });
            wait_queue_len_async(&server, &prefix, "granted", 1).await;
            let attempts = waiter_client.stats().attempts;
            assert_eq!(attempts, 1, "one attempt that joined the queue");
            let token = holder.fencing_token();
            holder.unlock().await.unwrap();
            let guard = tokio::time::timeout(HANG, waiter)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            // The grant took the shard's next token: above the holder's, and the last the
            // shard issued.
            assert!(
                guard.fencing_token() > token,
                "{mode:?} {lease:?}: granted token {} after {token}",
                guard.fencing_token()
            );
            let fence = format!("{{{prefix}:0}}:fence");
            assert_eq!(
                support::fence_value(&server, &fence).0,
                guard.fencing_token()
            );
            let stats = waiter_client.stats();
            assert_eq!(
                (stats.attempts, stats.granted),
                (1, 1),
                "{mode:?} {lease:?}"
            );
            // The grant went to the waiter client's inbox, not to the stream or channel that
            // every process reads (in Pub/Sub mode, `granted` above shows it arrived there).
            let events = format!("{{{prefix}:events}}");
            let inboxes = format!("{events}:to:*");
            if mode == NotificationMode::Stream {
                let shared = server.cmd(&["XRANGE", &events, "-", "+"]);
                assert!(!format!("{shared:?}").contains("|grant|"), "{shared:?}");
                let found = server.cmd(&["KEYS", &inboxes]).as_array();
                let granted_here = found
                    .iter()
                    .filter_map(Resp::as_str)
                    .filter(|key| !key.ends_with(":seq"))
                    .any(|inbox| server.last_event(&inbox).0 == "grant");
                assert!(granted_here, "no inbox holds the grant: {found:?}");
            } else {
                let listening = server.cmd(&["PUBSUB", "CHANNELS", &inboxes]).as_array();
                assert!(listening.len() >= 2, "each client listens: {listening:?}");
            }
            // Topped up from at most the waiter lease (9 s: the clients' first heartbeat, at 3 s,
            // comes long after this hand-off, so nothing but the grant wakes the waiter) to the
            // 60 s lease, a third into the grant.
            let hold_key = format!("{{{prefix}:0}}:fair:granted");
            eventually("the granted hold is topped up to the full lease", || {
                server.cmd(&["PTTL", &hold_key]).as_int() > 10_000
            })
            .await;
            eventually("the guard's deadline follows the top-up", || {
                guard.lease_deadline() > tokio::time::Instant::now() + Duration::from_secs(10)
            })
            .await;
            assert_eq!(guard.lost_cause(), None);
            guard.unlock().await.unwrap();
            assert_no_queue_left(&server, &prefix, "granted");
            holder_client.shutdown().await.unwrap();
            waiter_client.shutdown().await.unwrap();
        }
    }
}
