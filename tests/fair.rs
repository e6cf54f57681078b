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

/// The keys of fair lock `x` under prefix `t` (one shard), for the tests that call the scripts
/// themselves: hold, fence (the shard's, `lua/lib/fence.lua`), queue, alive, bids, events, seq.
const FAIR_X_KEYS: [&str; 7] = [
    "{t:0}:fair:x",
    "{t:0}:fence",
    "{t:0}:fair.queue:x",
    "{t:0}:fair.alive:x",
    "{t:0}:fair.bids:x",
    "{t:0}:events",
    "{t:0}:events:seq",
];

/// The layout stamp the Lua-level tests pass in their fence argument (any fixed string works:
/// the scripts only compare it with the fence key's stamp).
const LAYOUT: &str = "v-test shards=1 notification=stream";

/// The fence argument `"<0|1><layout>"` (`lua/lib/fence.lua`): `create` lets a script create a
/// missing fence key (a client passes it only after checking the layout record; a release
/// never does).
fn fence_arg(create: bool) -> String {
    format!("{}{LAYOUT}", u8::from(create))
}

/// The last token recorded in a fence key (`"<last>|<layout>"`), and its stamp.
fn fence_last(server: &RedisServer, fence: &str) -> (i64, String) {
    let value = server
        .cmd(&["GET", fence])
        .as_str()
        .unwrap_or_else(|| panic!("no fence key {fence}"));
    let (last, stamp) = value
        .split_once('|')
        .unwrap_or_else(|| panic!("{fence}: {value:?}"));
    (
        last.parse()
            .unwrap_or_else(|e| panic!("{fence}: {value:?}: {e}")),
        stamp.to_owned(),
    )
}

/// The hand-off protocol at the Lua level (`lua/lib/fair.lua`), step by step: a release grants
/// the lock to the live head (its owner, its waiter id as op id, a lease no longer than what is
/// left of its waiter lease, the next fencing token) and emits one `grant` event; a head whose
/// event was lost is answered "acquired" by its next attempt without a second hold level; a
/// head that gives up frees the grant it never took up; re-sent releases stay answered. The
/// shard's fence key (`lua/lib/fence.lua`) refuses to issue a token when it is missing (unless
/// the call may create it) or stamped with another layout, and a release then only names the
/// head instead of granting.
#[test]
fn a_release_grants_the_lock_to_the_live_head_in_one_script() {
    init_tracing();
    let server = RedisServer::start();
    let (hold_lib, queue_lib, fence_lib) = (
        include_str!("../lua/lib/hold.lua"),
        include_str!("../lua/lib/queue.lua"),
        include_str!("../lua/lib/fence.lua"),
    );
    let (notify_lib, fair_lib, rw_lib) = (
        include_str!("../lua/lib/notify.lua"),
        include_str!("../lua/lib/fair.lua"),
        include_str!("../lua/lib/rw.lua"),
    );
    let granting = [hold_lib, fence_lib, queue_lib, notify_lib, fair_lib];
    let acquire = support::composed(&granting, include_str!("../lua/fair_acquire.lua"));
    let release = support::composed(&granting, include_str!("../lua/fair_release.lua"));
    let leave = support::composed(
        &[queue_lib, notify_lib, rw_lib],
        include_str!("../lua/fair_leave.lua"),
    );
    let [hold, fence, queue, alive, bids, events, seq] = FAIR_X_KEYS;
    let ints = |reply: Resp| {
        assert!(!reply.is_error(), "{reply:?}");
        reply
            .as_array()
            .iter()
            .map(Resp::as_int)
            .collect::<Vec<_>>()
    };
    let attempt = |owner: &str, op: &str, waiter: &str, waiter_lease: &str, fence_arg: &str| {
        server.cmd(&[
            "EVAL",
            &acquire,
            "7",
            hold,
            fence,
            queue,
            alive,
            events,
            seq,
            bids,
            owner,
            "30000",
            op,
            waiter,
            waiter_lease,
            "stream",
            "1000",
            "fair:x",
            &format!("in-{owner}"),
            fence_arg,
        ])
    };
    let try_take = |owner: &str, op: &str, waiter: &str, waiter_lease: &str| {
        ints(attempt(owner, op, waiter, waiter_lease, &fence_arg(true)))
    };
    // A release never may create the fence key (the client passes 0).
    let give_back = |owner: &str, token: i64, op: &str| {
        ints(server.cmd(&[
            "EVAL",
            &release,
            "7",
            hold,
            queue,
            alive,
            events,
            seq,
            bids,
            fence,
            owner,
            &token.to_string(),
            op,
            "0",
            "5000",
            "stream",
            "1000",
            "fair:x",
            &fence_arg(false),
        ]))
    };
    let leave_queue = |waiter: &str| {
        ints(server.cmd(&[
            "EVAL", &leave, "6", hold, queue, alive, events, seq, bids, waiter, "stream", "1000",
            "fair:x",
        ]))
    };
    let field = |name: &str| server.cmd(&["HGET", hold, name]).as_str();
    let held_token = || -> i64 {
        field("f")
            .expect("a hold")
            .parse()
            .expect("a numeric token")
    };
    // Grants go to the inbox of the head's client alone (the bid's tag, "in-<owner>" here).
    let inbox = |owner: &str| format!("{events}:to:in-{owner}");
    let last_grant = |owner: &str| server.last_event(&inbox(owner));
    let dump = || -> Vec<Option<Vec<u8>>> {
        FAIR_X_KEYS
            .iter()
            .map(|key| server.cmd(&["DUMP", key]).as_bytes())
            .collect()
    };
    // Every token issued so far (they strictly increase: one shard).
    let mut tokens: Vec<i64> = Vec::new();
    let mut issued = |token: i64, what: &str| {
        assert!(
            tokens.iter().all(|&earlier| token > earlier),
            "{what}: token {token} not above every earlier one {tokens:?}"
        );
        tokens.push(token);
    };

    // The shard's first token: a call that may not create the fence key is refused, and so is
    // a fence key stamped with another layout; neither changes anything.
    let refused = attempt("a", "a-take", "wa", "3000", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(dump(), vec![None; FAIR_X_KEYS.len()], "a key was written");
    server.cmd(&["SET", fence, "17|v-other shards=2 notification=stream"]);
    let stamped = dump();
    for create in [false, true] {
        let refused = attempt("a", "a-take", "wa", "3000", &fence_arg(create));
        assert_eq!(
            refused.error_message(),
            Some("FLFENCE layout v-other shards=2 notification=stream"),
            "{refused:?}"
        );
        assert_eq!(dump(), stamped, "a key changed");
    }
    server.cmd(&["DEL", fence]);

    let taken = try_take("a", "a-take", "wa", "3000");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_a = taken[1];
    issued(token_a, "a");
    assert_eq!(fence_last(&server, fence), (token_a, LAYOUT.to_owned()));
    // A retry of the same call is answered with the same token.
    assert_eq!(try_take("a", "a-take", "wa", "3000"), vec![1, token_a, 1]);
    let busy = try_take("b", "b-try", "wb", "3000");
    assert_eq!((busy.len(), busy[0]), (3, 0), "b queues: {busy:?}");
    assert_eq!(
        server.cmd(&["HGET", bids, "wb"]).as_str().as_deref(),
        Some("30000|in-b|b")
    );

    // a's release grants the lock to b, the head: b's owner, b's waiter id, the next token,
    // and no longer than b's waiter lease. The queue is empty and one `grant` event names b.
    assert_eq!(give_back("a", token_a, "a-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("b"));
    assert_eq!(field("r").as_deref(), Some("wb"));
    let token_b = held_token();
    issued(token_b, "b's grant");
    assert_eq!(fence_last(&server, fence), (token_b, LAYOUT.to_owned()));
    assert_eq!(field("c").as_deref(), Some("1"));
    let lasts = server.cmd(&["PTTL", hold]).as_int();
    assert!(lasts > 0 && lasts <= 3000, "granted for {lasts} ms");
    assert_eq!(server.cmd(&["LLEN", queue]).as_int(), 0);
    assert_eq!(server.cmd(&["EXISTS", alive, bids]).as_int(), 0);
    let (rule, target) = last_grant("b");
    assert_eq!(rule, "grant");
    assert_eq!(
        server.cmd(&["XLEN", events]).as_int(),
        0,
        "nothing on the stream every process reads"
    );
    // The inbox numbers its events itself (its reader checks them for gaps); the inbox and
    // its counter expire.
    let counter = format!("{}:seq", inbox("b"));
    assert_eq!(
        server.cmd(&["GET", &counter]).as_str().as_deref(),
        Some("1")
    );
    for key in [inbox("b"), counter] {
        let ttl = server.cmd(&["PTTL", &key]).as_int();
        assert!(ttl > 0 && ttl <= 300_000, "{key}: {ttl}");
    }
    let parts: Vec<&str> = target.split(',').collect();
    let token_b_text = token_b.to_string();
    assert_eq!(
        (parts.len(), parts[0], parts[1]),
        (4, "wb", token_b_text.as_str()),
        "{target}"
    );

    // b never saw the event: its next attempt (another op) is answered with the grant (the
    // same token), and the hold count stays 1.
    let answered = try_take("b", "b-recheck", "wb", "3000");
    assert_eq!(answered[..3], [1, token_b, 1], "{answered:?}");
    assert!(answered[3] > 0 && answered[3] <= 3000, "{answered:?}");
    assert_eq!(field("c").as_deref(), Some("1"));
    // a's release, re-sent after the grant, is still answered "released"; b is unharmed.
    assert_eq!(give_back("a", token_a, "a-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("b"));
    assert_eq!(held_token(), token_b);

    // c queues; b's release grants to c; c gives up before taking it up: the hold is freed,
    // the tombstone of b's release stays, and b's re-sent release is still answered.
    let busy = try_take("c", "c-try", "wc", "3000");
    assert_eq!(busy[0], 0);
    assert_eq!(give_back("b", token_b, "b-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("c"));
    let token_c = held_token();
    issued(token_c, "c's grant");
    assert_eq!(leave_queue("wc"), vec![1]);
    assert_eq!(field("o"), None, "the unused grant is freed");
    // The tombstone keeps the ids of the releases that freed the lock, b's first.
    let freed_by = field("x").unwrap_or_default();
    assert_eq!(freed_by.split(',').next(), Some("b-release"), "{freed_by}");
    assert_eq!(give_back("b", token_b, "b-release"), vec![1, 0]);
    // Giving up took no token.
    assert_eq!(fence_last(&server, fence).0, token_c);

    // A head whose waiter lease is short gets the lock for no longer than that lease.
    let taken = try_take("d", "d-take", "wd", "3000");
    assert_eq!(taken[0], 1);
    let token_d = taken[1];
    issued(token_d, "d");
    assert_eq!(try_take("e", "e-try", "we", "200")[0], 0);
    assert_eq!(give_back("d", token_d, "d-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("e"));
    let token_e = held_token();
    issued(token_e, "e's grant");
    let lasts = server.cmd(&["PTTL", hold]).as_int();
    assert!(lasts > 0 && lasts <= 200, "granted for {lasts} ms");
    assert_eq!(server.cmd(&["EXISTS", queue, alive, bids]).as_int(), 0);
    assert_eq!(last_grant("e").0, "grant");
    assert_eq!(give_back("e", token_e, "e-release"), vec![1, 0]);

    // A foreign value under the head's inbox, or under its counter, is left alone, and the
    // grant goes to the shared stream instead: nothing is lost.
    let foreign = [inbox("g"), format!("{}:seq", inbox("h"))];
    for key in &foreign {
        server.cmd(&["SADD", key, "foreign"]);
    }
    let taken = try_take("f", "f-take", "wf", "3000");
    assert_eq!(taken[0], 1);
    let mut token = taken[1];
    issued(token, "f");
    // f's release grants to g (foreign inbox), g's to h (foreign counter).
    for (holder, next) in [("f", "g"), ("g", "h")] {
        assert_eq!(
            try_take(next, &format!("{next}-try"), &format!("w{next}"), "3000")[0],
            0
        );
        assert_eq!(
            give_back(holder, token, &format!("{holder}-release")),
            vec![1, 0]
        );
        assert_eq!(field("o").as_deref(), Some(next));
        token = held_token();
        issued(token, &format!("{next}'s grant"));
        let (rule, target) = server.last_event(events);
        let head = format!("w{next}");
        let token_text = token.to_string();
        assert_eq!(
            (rule.as_str(), target.split(',').next()),
            ("grant", Some(head.as_str()))
        );
        assert_eq!(target.split(',').nth(1), Some(token_text.as_str()));
    }
    for key in &foreign {
        let kept = server.cmd(&["SMEMBERS", key]).as_array();
        assert_eq!(kept.len(), 1, "{key}: {kept:?}");
    }
    assert_eq!(server.cmd(&["EXISTS", &inbox("h")]).as_int(), 0);
    assert_eq!(give_back("h", token, "h-release"), vec![1, 0]);

    // A release that finds the fence key missing (a data loss) or stamped with another layout
    // issues no token: it frees the lock and only names the head (rule `name`), whose own
    // attempt then needs a token from a fence key it may create (after the layout check).
    let taken = try_take("i", "i-take", "wi", "3000");
    assert_eq!(taken[0], 1);
    let token_i = taken[1];
    issued(token_i, "i");
    assert_eq!(try_take("j", "j-try", "wj", "3000")[0], 0);
    server.cmd(&["DEL", fence]);
    assert_eq!(give_back("i", token_i, "i-release"), vec![1, 0]);
    assert_eq!(field("o"), None, "no grant without a token");
    assert_eq!(server.cmd(&["EXISTS", fence]).as_int(), 0, "fence created");
    assert_eq!(
        server.last_event(events),
        ("name".to_owned(), "wj".to_owned())
    );
    assert_eq!(
        server.cmd(&["LINDEX", queue, "0"]).as_str().as_deref(),
        Some("wj")
    );
    let before = dump();
    let refused = attempt("j", "j-retry", "wj", "3000", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(dump(), before, "a refused attempt changed a key");
    let taken = try_take("j", "j-retry", "wj", "3000");
    assert_eq!(taken[0], 1, "{taken:?}");
    let token_j = taken[1];
    // The fence key was lost: the new one starts from the server clock, above every token
    // issued before (as long as the clock does not step back).
    issued(token_j, "j after the loss");
    assert_eq!(server.cmd(&["LLEN", queue]).as_int(), 0);

    assert_eq!(try_take("k", "k-try", "wk", "3000")[0], 0);
    let other = format!("{token_j}|v-other shards=2 notification=stream");
    server.cmd(&["SET", fence, &other]);
    assert_eq!(give_back("j", token_j, "j-release"), vec![1, 0]);
    assert_eq!(field("o"), None, "no grant under another layout");
    assert_eq!(server.cmd(&["GET", fence]).as_str(), Some(other.clone()));
    assert_eq!(
        server.last_event(events),
        ("name".to_owned(), "wk".to_owned())
    );
    let before = dump();
    let refused = attempt("k", "k-retry", "wk", "3000", &fence_arg(true));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE layout v-other shards=2 notification=stream"),
        "{refused:?}"
    );
    assert_eq!(dump(), before, "a refused attempt changed a key");
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
            assert_eq!(fence_last(&server, &fence).0, guard.fencing_token() as i64);
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

/// The fair scripts check each key's type before their first write, mostly through typed reads
/// instead of `TYPE` calls (`lua/fair_release.lua`, `lua/lib/queue.lua`). For every key a
/// release (that grants the lock to a queued head) and a queueing attempt touch: with a foreign
/// value there, the script fails with WRONGTYPE and no key changes, neither ours nor the
/// foreign one.
#[test]
fn fair_scripts_refuse_a_foreign_key_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let granting = [
        include_str!("../lua/lib/hold.lua"),
        include_str!("../lua/lib/fence.lua"),
        include_str!("../lua/lib/queue.lua"),
        include_str!("../lua/lib/notify.lua"),
        include_str!("../lua/lib/fair.lua"),
    ];
    let acquire = support::composed(&granting, include_str!("../lua/fair_acquire.lua"));
    let release = support::composed(&granting, include_str!("../lua/fair_release.lua"));
    let [hold, fence, queue, alive, bids, events, seq] = FAIR_X_KEYS;
    let all = FAIR_X_KEYS;
    let (create, no_create) = (fence_arg(true), fence_arg(false));
    let attempt = |owner: &str, waiter: &str| {
        server.cmd(&[
            "EVAL", &acquire, "7", hold, fence, queue, alive, events, seq, bids, owner, "30000",
            waiter, waiter, "3000", "stream", "1000", "fair:x", "", &create,
        ])
    };
    let give_back = |owner: &str, token: &str| {
        server.cmd(&[
            "EVAL",
            &release,
            "7",
            hold,
            queue,
            alive,
            events,
            seq,
            bids,
            fence,
            owner,
            token,
            "a-release",
            "0",
            "5000",
            "stream",
            "1000",
            "fair:x",
            &no_create,
        ])
    };
    let dump = || -> Vec<Option<Vec<u8>>> {
        all.iter()
            .map(|key| server.cmd(&["DUMP", key]).as_bytes())
            .collect()
    };
    // A foreign value of a type none of our keys has; at the fence key also strings that are
    // not "<token>|<layout>".
    let plant = |key: &str, value: &str| {
        server.cmd(&["DEL", key]);
        if value.is_empty() {
            server.cmd(&["SADD", key, "foreign"]);
        } else {
            server.cmd(&["SET", key, value]);
        }
    };
    let mut last_token = 0;
    for key in all {
        let values: &[&str] = if key == fence {
            &["", "hello", "12"]
        } else {
            &[""]
        };
        for &value in values {
            for &(script, queued) in &[("release", true), ("release", false), ("acquire", true)] {
                server.cmd(&["DEL", hold, queue, alive, bids, events, seq]);
                // a holds the lock; with `queued`, b waits at the head of the queue.
                let taken = attempt("a", "wa").as_array();
                assert_eq!(taken[0].as_int(), 1, "{taken:?}");
                let token = taken[1].as_int();
                assert!(token > last_token, "token {token} after {last_token}");
                last_token = token;
                if queued {
                    assert_eq!(attempt("b", "wb").as_array()[0].as_int(), 0);
                }
                server.cmd(&["XADD", events, "*", "k", "v"]); // so that the stream exists
                plant(key, value);
                let before = dump();
                let reply = match script {
                    "release" => give_back("a", &token.to_string()),
                    _ => attempt("c", "wc"),
                };
                let what = format!("{script} (queued: {queued}) with a foreign {key} {value:?}");
                // Keys a call does not need stay unread: a release nobody waits for needs only
                // the hold and the queue; an attempt on a held lock never needs the fence or
                // the events.
                let needed = match (script, queued) {
                    ("release", false) => [hold, queue].contains(&key),
                    ("acquire", _) => ![fence, events, seq].contains(&key),
                    _ => true,
                };
                if needed {
                    assert!(
                        reply
                            .error_message()
                            .is_some_and(|e| e.contains("WRONGTYPE")),
                        "{what}: {reply:?}"
                    );
                    assert_eq!(dump(), before, "{what}: a key changed");
                } else {
                    assert!(!reply.is_error(), "{what}: {reply:?}");
                    let at = all.iter().position(|k| *k == key).unwrap_or_default();
                    assert_eq!(dump()[at], before[at], "{what}: the foreign value changed");
                }
                if key == fence {
                    // The next round's first token comes from a fence key created anew.
                    server.cmd(&["DEL", fence]);
                }
            }
        }
    }
}
