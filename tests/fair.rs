//! Fair lock: strict FIFO across processes, waiters of killed processes passed over, head-only
//! hand-off, and a clean queue afterwards. Real redis-server, real OS processes, both
//! notification modes.
//!
//! The queue is field `q` of the lock's hash (`{prefix:0}:fair:<name>`, `lua/lib/hold.lua`):
//! one line per waiter, "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>".

mod support;

use std::collections::HashMap;
use std::time::Duration;

use fredlock::{Config, Lease, LockClient, NotificationMode};
use support::{
    emit_result, hold_owner, init_tracing, is_worker, queue_key, queue_members, queued_waiters,
    spawn_worker_handle, worker_param, RedisServer, Resp, RespConn,
};
use support::{eventually, parse_mode, take_over_deferred, HANG, MODES};

/// One shard, so the test can name the lock's hash: `{prefix:0}:fair:<name>`.
fn config(url: &str, mode: NotificationMode, prefix: &str, waiter_lease: Duration) -> Config {
    let mut config = support::config(url, prefix, mode);
    config.shards = 1;
    config.waiter_lease = waiter_lease;
    config
}

/// The hash of fair lock `name`: its hold and its wait queue.
fn hold_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:fair:{name}")
}

/// The queue of fair lock `name`: (waiter id, inbox tag) per waiter, in queue order.
fn queue_lines(server: &RedisServer, prefix: &str, name: &str) -> Vec<(String, String)> {
    queue_members(server, &hold_key(prefix, name))
        .into_iter()
        .map(|(member, _)| {
            let mut fields = member.split(' ');
            let waiter = fields.next().expect("waiter id").to_owned();
            let inbox = fields.next().expect("inbox tag").to_owned();
            (waiter, inbox)
        })
        .collect()
}

/// The inbox (stream or channel) of the client with inbox tag `tag` (one server, one shard).
fn inbox_key(prefix: &str, tag: &str) -> String {
    format!("{{{prefix}:events}}:to:{tag}")
}

/// Waits (bounded) until the queue of `name` holds `len` waiters.
fn wait_queue_len(server: &RedisServer, prefix: &str, name: &str, len: usize) {
    let deadline = std::time::Instant::now() + HANG;
    let hold = hold_key(prefix, name);
    while queued_waiters(server, &hold).len() != len {
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
    let ms = |name: &str| Duration::from_millis(param(name).parse().expect(name));
    let mut config = config(
        &param("FAIR_URL"),
        parse_mode(&param("FAIR_MODE")),
        &param("FAIR_PREFIX"),
        ms("FAIR_WAITER_LEASE_MS"),
    );
    if worker_param("FAIR_LEASE_MS").is_some() {
        config.watchdog_lease = ms("FAIR_LEASE_MS");
    }
    let locks = LockClient::connect(config).await.expect("connect");
    let port: u16 = param("FAIR_PORT").parse().expect("port");
    match param("FAIR_ROLE").as_str() {
        "fifo" => fifo_worker(&locks, port, &param("FAIR_CONTROL")).await,
        "loop" => loop_worker(&locks, port, param("FAIR_PROC").parse().expect("proc")).await,
        // One lock() of lock FAIR_LOCK, with a watchdog lease of FAIR_LEASE_MS.
        "wait" => {
            let guard = locks
                .fair_mutex(&param("FAIR_LOCK"))
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
    let hold = hold_key(&locks.config().key_prefix, "loop");
    for task in 0..LOOP_TASKS {
        let hold = hold.clone();
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
                // The queue as the holder sees it (the waiter ids of the lock's queue), for the
                // FIFO check.
                let queue: Vec<String> = redis
                    .custom(
                        command("ZRANGE"),
                        vec![queue_key(&hold), "0".to_owned(), "-1".to_owned()],
                    )
                    .await
                    .expect("ZRANGE");
                let queue: Vec<&str> = queue
                    .iter()
                    .filter_map(|member| member.split(' ').next())
                    .collect();
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

/// Waits (bounded) until lock `name` is free with nobody queued, and checks that its hash is
/// the only key of the lock.
fn assert_no_queue_left(server: &RedisServer, prefix: &str, name: &str) {
    let deadline = std::time::Instant::now() + HANG;
    let hold = hold_key(prefix, name);
    while hold_owner(server, &hold).is_some() || !queued_waiters(server, &hold).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "lock {name} still held or queued for: {:?}",
            server.cmd(&["HGETALL", &hold])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let keys = server.keys(&format!("{{{prefix}:0}}:*:{name}"));
    assert!(
        keys.iter().all(|key| *key == hold),
        "keys of lock {name} besides its hash: {keys:?}"
    );
}

/// A `wait` worker: one `lock()` of fair lock `name` with a watchdog lease of `lease`.
fn spawn_waiter(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    name: &str,
    lease: Duration,
    waiter_lease: Duration,
) -> support::WorkerHandle {
    let mut env = worker_env(server, mode, prefix, "wait");
    env.push(("FAIR_LOCK", name.to_owned()));
    env.push(("FAIR_LEASE_MS", lease.as_millis().to_string()));
    env.push(("FAIR_WAITER_LEASE_MS", waiter_lease.as_millis().to_string()));
    spawn_worker_handle("fair_worker", &env)
}

/// The parsed `ACQUIRED <token>` line of a `wait` worker.
fn acquired_token(line: &str) -> u64 {
    line.strip_prefix("ACQUIRED ")
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("expected `ACQUIRED <token>`, got {line:?}"))
}

/// How long the inbox of a client that died may outlive it in Stream mode (its reader keeps it
/// with a 30 s ttl, `INBOX_TTL` in src/notify/stream.rs), plus [`HANG`].
const INBOX_GONE: Duration = Duration::from_secs(30 + 30);

/// A release grants the lock to the first queued waiter whose client is there; a waiter whose
/// process was SIGKILLed is passed over once its client is gone: in Pub/Sub mode when Redis
/// has closed its connection (nobody subscribes to its inbox channel any more), in Stream mode
/// when its inbox stream has expired. Every lease here (the holder's, the waiters', the waiter
/// lease that bounds a grant) is 120 s, so only the pass-over can let the next waiter in.
#[test]
fn a_killed_waiter_at_the_head_is_passed_over_once_its_client_is_gone() {
    init_tracing();
    let server = RedisServer::start();
    let long = Duration::from_secs(120);
    for mode in MODES {
        let prefix = format!("dead-{}", mode.as_str());
        let name = "dead-head";
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let locks = runtime
            .block_on(LockClient::connect(config(
                &server.url(),
                mode,
                &prefix,
                long,
            )))
            .unwrap();
        let mutex = locks
            .fair_mutex(name)
            .unwrap()
            .with_lease(Lease::fixed(long))
            .unwrap();
        let holder = runtime.block_on(mutex.lock()).unwrap();
        let doomed = spawn_waiter(&server, mode, &prefix, name, long, long);
        wait_queue_len(&server, &prefix, name, 1);
        let next = spawn_waiter(&server, mode, &prefix, name, long, long);
        wait_queue_len(&server, &prefix, name, 2);
        let queue = queue_lines(&server, &prefix, name);
        let (doomed_id, doomed_tag) = queue[0].clone();
        let next_id = queue[1].0.clone();
        assert_ne!(doomed_tag, queue[1].1, "one inbox per client");
        doomed.kill();

        // Wait until Redis no longer counts the doomed client as there.
        let inbox = inbox_key(&prefix, &doomed_tag);
        let deadline = std::time::Instant::now() + INBOX_GONE;
        loop {
            let gone = match mode {
                NotificationMode::Stream => server.cmd(&["EXISTS", &inbox]).as_int() == 0,
                _ => {
                    let reply = server.cmd(&["PUBSUB", "NUMSUB", &inbox]).as_array();
                    reply.get(1).map(Resp::as_int) == Some(0)
                }
            };
            if gone {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: the inbox of the killed client is still there"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Nothing but a release looks at the queue: the dead waiter is still at its head.
        assert_eq!(
            queued_waiters(&server, &hold_key(&prefix, name)),
            [doomed_id, next_id],
            "{mode:?}"
        );

        let token = holder.fencing_token();
        runtime.block_on(holder.unlock()).unwrap();
        // The release itself granted the lock to the survivor: a token above the holder's,
        // not drawn from the shard's fence key (a take of a lock whose hash is gone would).
        let acquired = acquired_token(&next.expect_result(HANG));
        assert!(acquired > token, "{mode:?}: token {acquired} after {token}");
        let fence = support::fence_value(&server, &format!("{{{prefix}:0}}:fence")).0;
        assert_eq!(fence, token, "{mode:?}: not granted by the release");
        next.wait();
        assert_no_queue_left(&server, &prefix, name);
        runtime.block_on(locks.shutdown()).unwrap();
    }
}

/// Stream mode, released at once after the kill, while the killed client's inbox still
/// exists: the release grants the lock to the dead waiter, but the grant lasts only the waiter
/// lease (shorter than the waiter's lease), and when it lapses the next waiter, which looks
/// again within one lease, takes the lock. (In Pub/Sub mode Redis closes the connection of a
/// killed process at once, so its waiters are passed over: the test above.)
#[test]
fn a_grant_to_a_killed_waiter_lasts_the_waiter_lease_and_then_the_next_one_proceeds() {
    init_tracing();
    let server = RedisServer::start();
    let mode = NotificationMode::Stream;
    let prefix = "lapse";
    let name = "dead-grantee";
    // Every hold's lease: the bound after which a waiter looks again.
    let lease = Duration::from_secs(5);
    let waiter_lease = Duration::from_secs(2);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let locks = runtime
        .block_on(LockClient::connect(config(
            &server.url(),
            mode,
            prefix,
            waiter_lease,
        )))
        .unwrap();
    let mutex = locks
        .fair_mutex(name)
        .unwrap()
        .with_lease(Lease::watchdog(lease))
        .unwrap();
    let holder = runtime.block_on(mutex.lock()).unwrap();
    let doomed = spawn_waiter(&server, mode, prefix, name, lease, waiter_lease);
    wait_queue_len(&server, prefix, name, 1);
    let next = spawn_waiter(&server, mode, prefix, name, lease, waiter_lease);
    wait_queue_len(&server, prefix, name, 2);
    let queue = queue_lines(&server, prefix, name);
    let (doomed_id, doomed_tag) = queue[0].clone();
    let next_id = queue[1].0.clone();
    doomed.kill();
    assert_eq!(
        server
            .cmd(&["EXISTS", &inbox_key(prefix, &doomed_tag)])
            .as_int(),
        1,
        "the killed client's inbox lives on for its ttl"
    );

    let token = holder.fencing_token();
    runtime.block_on(holder.unlock()).unwrap();
    // Granted to the dead head (its inbox exists) for the waiter lease, not for its lease.
    // Waiters queued behind the hold, so its release was deferred: sent once unlock() returned.
    let hold = hold_key(prefix, name);
    runtime.block_on(eventually(
        "the release grants the lock to the dead head",
        || server.cmd(&["HGET", &hold, "r"]).as_str().as_deref() == Some(doomed_id.as_str()),
    ));
    let granted = server.cmd(&["HMGET", &hold, "r", "f"]).as_array();
    assert_eq!(
        granted[0].as_str(),
        Some(doomed_id),
        "granted to the dead head"
    );
    let granted_token: u64 = granted[1].as_str().expect("token").parse().expect("token");
    assert!(
        granted_token > token,
        "granted {granted_token} after {token}"
    );
    let ttl = server.cmd(&["PTTL", &hold]).as_int();
    assert!(
        ttl > 0 && ttl <= waiter_lease.as_millis() as i64,
        "a grant lasts at most the waiter lease: pttl {ttl}"
    );
    assert_eq!(queued_waiters(&server, &hold), [next_id]);

    // The grant lapses (the hash with it); the survivor's next look takes the free lock, with
    // a token from the shard's fence key, above the one the dead waiter was granted.
    let acquired = acquired_token(&next.expect_result(HANG));
    assert!(
        acquired > granted_token,
        "token {acquired} after {granted_token}"
    );
    let fence = support::fence_value(&server, &format!("{{{prefix}:0}}:fence")).0;
    assert_eq!(fence, acquired, "the survivor took a lock with no hash");
    next.wait();
    assert_no_queue_left(&server, prefix, name);
    runtime.block_on(locks.shutdown()).unwrap();
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
        let hold = hold_key(&prefix, "turn");
        while queued_waiters(&server, &hold).is_empty() {
            tokio::select! {
                biased;
                done = &mut head => panic!(
                    "the head cannot acquire while the lock is held: {:?}",
                    done.map(|guard| guard.fencing_token())
                ),
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
        locks.shutdown().await.unwrap();
    }
}

async fn wait_queue_len_async(server: &RedisServer, prefix: &str, name: &str, len: usize) {
    let deadline = tokio::time::Instant::now() + HANG;
    let hold = hold_key(prefix, name);
    while queued_waiters(server, &hold).len() != len {
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
/// (the next holder: a release grants the lock to the head and takes it off the queue; every
/// waiter here is alive, so none is passed over) and gain waiters at the tail. Counts the hand-offs that broke that rule.
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
                // A grant published while nobody subscribes to the waiter's inbox channel passes
                // the waiter over (it then takes the lock when it looks again, after the
                // holder's lease, which is correct but not what this test is about): wait until
                // both clients listen on their inboxes.
                let inboxes = format!("{{{prefix}:events}}:to:*");
                eventually("both clients subscribed", || {
                    let reply = server.cmd(&["PUBSUB", "CHANNELS", &inboxes]).as_array();
                    reply.len() == 2
                })
                .await;
            }
            let holder = holding.lock().await.unwrap();
            let waiter = tokio::spawn(async move { waiting.lock().await });
            wait_queue_len_async(&server, &prefix, "granted", 1).await;
            let (waiter_id, waiter_inbox) = queue_lines(&server, &prefix, "granted").remove(0);
            let attempts = waiter_client.stats().attempts;
            assert_eq!(attempts, 1, "one attempt that joined the queue");
            let token = holder.fencing_token();
            holder.unlock().await.unwrap();
            let guard = tokio::time::timeout(HANG, waiter)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            // The grant took a token above the holder's from the lock's hash, without reading
            // the shard's fence key, which issued no token since the holder's.
            assert!(
                guard.fencing_token() > token,
                "{mode:?} {lease:?}: granted token {} after {token}",
                guard.fencing_token()
            );
            let fence = format!("{{{prefix}:0}}:fence");
            let last = support::fence_value(&server, &fence).0;
            assert!(
                last <= token,
                "{mode:?} {lease:?}: fence {last} after {token}"
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
            if mode == NotificationMode::Stream {
                let shared = server.cmd(&["XRANGE", &events, "-", "+"]);
                assert!(!format!("{shared:?}").contains("|grant|"), "{shared:?}");
                let (rule, target) = server.last_event(&inbox_key(&prefix, &waiter_inbox));
                assert_eq!(rule, "grant");
                let granted = format!("{waiter_id},{},", guard.fencing_token());
                assert!(target.starts_with(&granted), "{target} for {granted}");
            } else {
                let inboxes = format!("{events}:to:*");
                let listening = server.cmd(&["PUBSUB", "CHANNELS", &inboxes]).as_array();
                assert!(listening.len() >= 2, "each client listens: {listening:?}");
            }
            // Topped up from at most the waiter lease (9 s; nothing but the grant woke the
            // waiter, whose bound is the holder's 30 s lease) to the 60 s lease, a third into
            // the grant.
            let hold = hold_key(&prefix, "granted");
            eventually("the granted hold is topped up to the full lease", || {
                server.cmd(&["PTTL", &hold]).as_int() > 10_000
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

/// A task that asks again right after its own release (a worker loop) joins the queue's tail in
/// that release's call: A's hold came by a grant with B queued behind it, so A's `unlock()` is
/// deferred; A's next `lock()` sends the release naming itself, which grants the lock to B and
/// queues A behind it, and A then waits for its own grant without an attempt of its own.
#[tokio::test(flavor = "current_thread")]
async fn a_relock_after_a_release_queues_behind_the_waiters_in_the_same_call() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("relock-{}", mode.as_str());
        let cfg = || config(&server.url(), mode, &prefix, Duration::from_secs(120));
        let (a, b, c) = (
            LockClient::connect(cfg()).await.unwrap(),
            LockClient::connect(cfg()).await.unwrap(),
            LockClient::connect(cfg()).await.unwrap(),
        );
        let lock = |client: &LockClient| client.fair_mutex("relock").unwrap();
        let c_guard = lock(&c).lock().await.unwrap();
        let a_task = {
            let mutex = lock(&a);
            tokio::spawn(async move { mutex.lock().await })
        };
        wait_queue_len_async(&server, &prefix, "relock", 1).await;
        let b_task = {
            let mutex = lock(&b);
            tokio::spawn(async move { mutex.lock().await })
        };
        wait_queue_len_async(&server, &prefix, "relock", 2).await;
        c_guard.unlock().await.unwrap();
        let a_guard = tokio::time::timeout(HANG, a_task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let first = a_guard.fencing_token();

        a_guard.unlock().await.unwrap();
        let attempts = a.stats().attempts;
        let a_mutex = lock(&a);
        let what = format!("{mode:?}: A's lock()");
        let relock = take_over_deferred(&a, &what, async move { a_mutex.lock().await }).await;
        let b_guard = tokio::time::timeout(HANG, b_task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            b_guard.fencing_token() > first,
            "{mode:?}: B after A's hold"
        );
        wait_queue_len_async(&server, &prefix, "relock", 1).await;
        assert_eq!(
            hold_owner(&server, &hold_key(&prefix, "relock")).as_deref(),
            Some(b_guard.owner().id()),
            "{mode:?}"
        );
        let b_token = b_guard.fencing_token();
        b_guard.unlock().await.unwrap();
        let a_again = tokio::time::timeout(HANG, relock)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(a_again.fencing_token() > b_token, "{mode:?}: A after B");
        assert_eq!(
            a.stats().attempts,
            attempts,
            "{mode:?}: A queued by its release's call, granted by B's"
        );
        assert_eq!(
            a.stats().taken_over,
            0,
            "{mode:?}: a fair lock hands nothing over"
        );
        a_again.unlock().await.unwrap();
        assert_no_queue_left(&server, &prefix, "relock");
        for client in [a, b, c] {
            client.shutdown().await.unwrap();
        }
    }
}
