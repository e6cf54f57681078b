//! Multi-process and connection-failure tests against a real `redis-server`.
//!
//! The test binary re-executes itself as worker processes (see `tests/support`): each
//! `worker_*` test is ignored and returns at once unless started by `spawn_worker`, and reads
//! its parameters from `FL_*` environment variables.
//!
//! Every scenario runs in both notification modes, each with its own key prefix:
//!
//! 1. mutual exclusion of 4 processes x 4 tasks on one mutex (non-atomic counter, in-Redis
//!    overlap detector, fencing-token order);
//! 2. a holder process is SIGKILLed: the waiter gets the lock after at most one lease;
//! 3. the notifier (and then every normal) connection is killed while 50 tasks wait on one
//!    lock / on 50 locks held with a 120 s lease: all 50 must still get their lock;
//! 4. a release in another process wakes a waiter in this one (120 s lease, so only the
//!    event can explain a prompt acquisition).

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::KeysInterface;
use fredlock::{Config, Lease, LockClient, MutexGuard, NotificationMode};
use support::{
    config, find_hold, fnv1a32, parse_mode, queued_waiters, RedisServer, Resp, WorkerHandle, HANG,
};

// ---------------------------------------------------------------------------
// Parameters and helpers
// ---------------------------------------------------------------------------

const ENV_URL: &str = "FL_URL";
const ENV_PREFIX: &str = "FL_PREFIX";
const ENV_MODE: &str = "FL_MODE";
const ENV_LOCK: &str = "FL_LOCK";
/// Namespace of the test's own (non-lock) keys.
const ENV_NS: &str = "FL_NS";
const ENV_LEASE_MS: &str = "FL_LEASE_MS";

/// Scenario 1: processes x tasks x rounds.
const COUNTER_WORKERS: usize = 4;
const COUNTER_TASKS: usize = 4;
const COUNTER_ROUNDS: usize = 50;
const COUNTER_TOTAL: usize = COUNTER_WORKERS * COUNTER_TASKS * COUNTER_ROUNDS;

/// Scenario 3: waiting tasks.
const WAITERS: usize = 50;
/// A lease far beyond every bound of this file: only events and re-checks can wake waiters.
const LONG_LEASE: Duration = Duration::from_secs(120);

fn param(name: &str) -> String {
    support::worker_param(name).unwrap_or_else(|| panic!("worker parameter {name} is not set"))
}

/// The worker's configuration and lock name from its environment.
fn worker_config() -> (Config, String) {
    let mut config = config(
        &param(ENV_URL),
        &param(ENV_PREFIX),
        parse_mode(&param(ENV_MODE)),
    );
    if let Some(ms) = support::worker_param(ENV_LEASE_MS) {
        let ms: u64 = ms.parse().expect("FL_LEASE_MS is a number");
        config.watchdog_lease = Duration::from_millis(ms);
    }
    (config, param(ENV_LOCK))
}

fn worker_env(
    server: &RedisServer,
    prefix: &str,
    mode: NotificationMode,
    lock: &str,
    ns: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (ENV_URL, server.url()),
        (ENV_PREFIX, prefix.to_owned()),
        (ENV_MODE, mode.as_str().to_owned()),
        (ENV_LOCK, lock.to_owned()),
        (ENV_NS, ns.to_owned()),
    ]
}

/// Runs blocking harness code (process waits, polling) off the async workers and re-raises
/// its panic with the original message.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(value) => value,
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

/// Takes the next `RESULT` line of a worker without blocking the runtime.
async fn next_result(worker: WorkerHandle, timeout: Duration) -> (WorkerHandle, String) {
    blocking(move || {
        let line = worker.expect_result(timeout);
        (worker, line)
    })
    .await
}

/// Parses `HELD <token>`.
fn held_token(line: &str) -> u64 {
    line.strip_prefix("HELD ")
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("expected `HELD <token>`, got {line:?}"))
}

/// Polls `check` every 10 ms until it is true; panics after `timeout`.
async fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether anyone is queued for mutex `lock` (any shard).
fn anyone_queued(server: &RedisServer, prefix: &str, lock: &str) -> bool {
    find_hold(server, prefix, "mutex", lock)
        .is_some_and(|hold| !queued_waiters(server, &hold).is_empty())
}

fn int_or_zero(reply: Resp) -> i64 {
    if reply.is_nil() {
        0
    } else {
        reply.as_int()
    }
}

/// Parses `CLIENT LIST` into one field map per connection.
fn client_list(server: &RedisServer) -> Vec<std::collections::HashMap<String, String>> {
    let text = server
        .cmd(&["CLIENT", "LIST"])
        .as_str()
        .expect("CLIENT LIST reply");
    text.lines()
        .map(|line| {
            line.split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

/// Ids of the notifier connections of `mode`: blocked in / last used `XREAD` (stream), or
/// subscribed to channels (pub/sub).
fn notifier_ids(server: &RedisServer, mode: NotificationMode) -> Vec<String> {
    client_list(server)
        .into_iter()
        .filter(|c| match mode {
            NotificationMode::Stream => c.get("cmd").map(String::as_str) == Some("xread"),
            _ => c
                .get("sub")
                .and_then(|s| s.parse::<u64>().ok())
                .is_some_and(|n| n > 0),
        })
        .filter_map(|c| c.get("id").cloned())
        .collect()
}

/// Waits (bounded) until `count` notifier connections other than `gone` exist.
fn wait_for_notifiers(server: &RedisServer, mode: NotificationMode, gone: &[String], count: usize) {
    let deadline = Instant::now() + HANG;
    loop {
        let fresh = notifier_ids(server, mode)
            .into_iter()
            .filter(|id| !gone.contains(id))
            .count();
        if fresh >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the notifier connections did not come back within {HANG:?} ({fresh} of {count}); \
             CLIENT LIST: {:?}",
            client_list(server)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the notifier connection(s) the mode-specific way and waits until they are back, then
/// kills every normal connection (`CLIENT KILL TYPE normal`: command connections, and in stream
/// mode the notifiers too) and waits again. Returns a description for the log.
fn kill_connections(server: &RedisServer, mode: NotificationMode) -> String {
    let notifiers = notifier_ids(server, mode);
    assert!(
        !notifiers.is_empty(),
        "no notifier connection found; CLIENT LIST: {:?}",
        client_list(server)
    );
    let killed_notifiers = match mode {
        NotificationMode::PubSub => server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int(),
        _ => notifiers
            .iter()
            .map(|id| server.cmd(&["CLIENT", "KILL", "ID", id]).as_int())
            .sum(),
    };
    assert!(
        killed_notifiers >= notifiers.len() as i64,
        "killed {killed_notifiers} of {} notifier connections",
        notifiers.len()
    );
    wait_for_notifiers(server, mode, &notifiers, notifiers.len());

    let before_normal = notifier_ids(server, mode);
    let killed_normal = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).as_int();
    assert!(killed_normal >= 1, "CLIENT KILL TYPE normal killed nothing");
    if mode == NotificationMode::Stream {
        wait_for_notifiers(server, mode, &before_normal, before_normal.len());
    }
    // Let the command connections reconnect (fred reconnects on its own; commands sent
    // meanwhile are queued or retried).
    std::thread::sleep(Duration::from_millis(200));
    format!("killed {killed_notifiers} notifier + {killed_normal} normal connections")
}

// ---------------------------------------------------------------------------
// 1. Mutual exclusion across processes
// ---------------------------------------------------------------------------

fn counter_keys(ns: &str) -> [String; 5] {
    [
        format!("{ns}:counter"),
        format!("{ns}:inside"),
        format!("{ns}:violations"),
        format!("{ns}:last-token"),
        format!("{ns}:start"),
    ]
}

fn mutual_exclusion(mode: NotificationMode) {
    support::init_tracing();
    let server = RedisServer::start();
    let prefix = format!("proc-excl-{}", mode.as_str());
    let ns = format!("test-excl-{}", mode.as_str());
    let lock = "shared-counter";
    let [counter, inside, violations, last_token, start] = counter_keys(&ns);

    let started = Instant::now();
    let workers: Vec<WorkerHandle> = (0..COUNTER_WORKERS)
        .map(|_| {
            support::spawn_worker_handle(
                "worker_counter",
                &worker_env(&server, &prefix, mode, lock, &ns),
            )
        })
        .collect();
    for worker in &workers {
        assert_eq!(worker.expect_result(HANG), "READY");
    }
    // Start barrier: every process is connected before the first acquisition.
    assert_eq!(server.cmd(&["SET", &start, "1"]), Resp::Simple("OK".into()));
    let go = Instant::now();

    let mut acquired = 0usize;
    let mut reported_violations = 0usize;
    let mut max_wait_ms = 0usize;
    for worker in workers {
        let pid = worker.pid();
        let lines = worker.wait();
        let done = lines
            .iter()
            .find_map(|l| l.strip_prefix("DONE "))
            .unwrap_or_else(|| panic!("worker {pid} reported no DONE line: {lines:?}"));
        let fields: std::collections::HashMap<&str, usize> = done
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k, v.parse().expect("numeric field")))
            .collect();
        assert_eq!(
            fields["acquired"],
            COUNTER_TASKS * COUNTER_ROUNDS,
            "worker {pid}: {done}"
        );
        acquired += fields["acquired"];
        reported_violations += fields["violations"];
        max_wait_ms = max_wait_ms.max(fields["max_wait_ms"]);
    }
    eprintln!(
        "[{}] mutual exclusion: {acquired} critical sections in {:?} (total {:?}); longest \
         single lock() wait {max_wait_ms} ms",
        mode.as_str(),
        go.elapsed(),
        started.elapsed()
    );

    assert_eq!(acquired, COUNTER_TOTAL);
    assert_eq!(
        reported_violations, 0,
        "critical sections overlapped or fencing tokens went backwards"
    );
    assert_eq!(int_or_zero(server.cmd(&["GET", &violations])), 0);
    assert_eq!(
        int_or_zero(server.cmd(&["GET", &counter])),
        COUNTER_TOTAL as i64,
        "lost updates: the non-atomic increments were not mutually exclusive"
    );
    assert_eq!(int_or_zero(server.cmd(&["GET", &inside])), 0);
    assert!(int_or_zero(server.cmd(&["GET", &last_token])) >= COUNTER_TOTAL as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_processes_stream() {
    blocking(|| mutual_exclusion(NotificationMode::Stream)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_processes_pubsub() {
    blocking(|| mutual_exclusion(NotificationMode::PubSub)).await;
}

/// Worker of scenario 1: `COUNTER_TASKS` tasks x `COUNTER_ROUNDS` critical sections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "worker process of the multi-process tests"]
async fn worker_counter() {
    if !support::is_worker() {
        return;
    }
    support::init_tracing();
    let (config, lock) = worker_config();
    let ns = param(ENV_NS);
    let locks = LockClient::connect(config).await.expect("connect");
    let mutex = locks.mutex(&lock).expect("mutex");
    let [_, _, _, _, start] = counter_keys(&ns);
    support::emit_result("READY");

    let deadline = Instant::now() + HANG;
    loop {
        let go: i64 = locks.redis().exists(start.as_str()).await.expect("EXISTS");
        if go == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no start signal");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..COUNTER_TASKS {
        let mutex = mutex.clone();
        let redis = locks.redis().clone();
        let ns = ns.clone();
        tasks.spawn(async move {
            let [counter, inside, violations, last_token, _] = counter_keys(&ns);
            let mut seen_violations = 0usize;
            let mut max_wait = Duration::ZERO;
            for round in 0..COUNTER_ROUNDS {
                let asked = Instant::now();
                let guard = mutex.lock().await.expect("lock");
                max_wait = max_wait.max(asked.elapsed());
                let token = guard.fencing_token();

                let entered: i64 = redis.incr(inside.as_str()).await.expect("INCR");
                let mut violated = entered != 1;
                let last: Option<u64> = redis.get(last_token.as_str()).await.expect("GET");
                if last.is_some_and(|last| token <= last) {
                    violated = true;
                }
                let value: Option<i64> = redis.get(counter.as_str()).await.expect("GET");
                tokio::task::yield_now().await;
                if round % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let _: () = redis
                    .set(counter.as_str(), value.unwrap_or(0) + 1, None, None, false)
                    .await
                    .expect("SET");
                let _: () = redis
                    .set(last_token.as_str(), token, None, None, false)
                    .await
                    .expect("SET");
                if violated {
                    seen_violations += 1;
                    let _: i64 = redis.incr(violations.as_str()).await.expect("INCR");
                    eprintln!("VIOLATION task {task} round {round}: inside={entered} token={token} last={last:?}");
                }
                let _: i64 = redis.decr(inside.as_str()).await.expect("DECR");
                assert_eq!(guard.lost_cause(), None, "lease lost inside the section");
                guard.unlock().await.expect("unlock");
            }
            (seen_violations, max_wait)
        });
    }
    let mut violations = 0;
    let mut acquired = 0;
    let mut max_wait = Duration::ZERO;
    while let Some(done) = tasks.join_next().await {
        let (seen, waited) = done.expect("counter task");
        violations += seen;
        max_wait = max_wait.max(waited);
        acquired += COUNTER_ROUNDS;
    }
    // max_wait_ms is only logged by the parent, never asserted.
    support::emit_result(format_args!(
        "DONE acquired={acquired} violations={violations} max_wait_ms={}",
        max_wait.as_millis()
    ));
    locks.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------------------
// 2. The holder process is SIGKILLed
// ---------------------------------------------------------------------------

const CRASH_LEASE: Duration = Duration::from_secs(2);

async fn holder_sigkill(mode: NotificationMode) {
    support::init_tracing();
    let server = RedisServer::start();
    let prefix = format!("proc-kill-{}", mode.as_str());
    let lock = "crash-lock";
    let mut env = worker_env(&server, &prefix, mode, lock, "unused");
    env.push((ENV_LEASE_MS, CRASH_LEASE.as_millis().to_string()));

    let holder = support::spawn_worker_handle("worker_hold_forever", &env);
    let (holder, line) = next_result(holder, HANG).await;
    let dead_token = held_token(&line);

    let mut cfg = config(&server.url(), &prefix, mode);
    cfg.watchdog_lease = CRASH_LEASE;
    let locks = LockClient::connect(cfg).await.expect("connect");
    let mutex = locks.mutex(lock).expect("mutex");
    let state = mutex.state().await.expect("state");
    assert!(state.locked, "the worker should hold the lock: {state:?}");
    assert_eq!(state.fencing_token, Some(dead_token));

    let waiter = {
        let mutex = mutex.clone();
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (guard, Instant::now())
        })
    };
    // The waiter has made at least one attempt (the marker is its trace) and waits.
    wait_until("the waiter waits", HANG, || {
        locks.stats().waiting == 1 && anyone_queued(&server, &prefix, lock)
    })
    .await;
    // Let the holder's watchdog renew at least once after the waiter's attempt, so the lease
    // the waiter saw is not the one that ends.
    tokio::time::sleep(CRASH_LEASE / 2).await;
    assert!(!waiter.is_finished(), "acquired while the holder was alive");

    let killed_at = Instant::now();
    blocking(move || holder.kill()).await;

    let (guard, acquired_at) = tokio::time::timeout(HANG, waiter)
        .await
        .unwrap_or_else(|_| panic!("no acquisition within {HANG:?} after the holder died"))
        .expect("waiter task");
    let guard: MutexGuard = guard.expect("lock after the holder died");
    let took = acquired_at.saturating_duration_since(killed_at);
    eprintln!(
        "[{}] holder SIGKILL: waiter acquired {took:?} after the kill (lease {CRASH_LEASE:?}); \
         token {} > dead holder's {dead_token}",
        mode.as_str(),
        guard.fencing_token()
    );
    assert!(guard.fencing_token() > dead_token);
    // Correctness bound: the wait is bounded by the holder's remaining lease, so at most one
    // lease expiry (plus slack for a loaded machine) may pass.
    let bound = CRASH_LEASE * 2 + Duration::from_secs(5);
    assert!(
        took <= bound,
        "the waiter needed {took:?} (> {bound:?}): more than one lease expiry"
    );
    guard.unlock().await.expect("unlock");
    assert!(!mutex.is_locked().await.expect("is_locked"));
    locks.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_sigkill_stream() {
    holder_sigkill(NotificationMode::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_sigkill_pubsub() {
    holder_sigkill(NotificationMode::PubSub).await;
}

/// Worker of scenario 2: takes the lock with the watchdog lease and never lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "worker process of the multi-process tests"]
async fn worker_hold_forever() {
    if !support::is_worker() {
        return;
    }
    support::init_tracing();
    let (config, lock) = worker_config();
    let locks = LockClient::connect(config).await.expect("connect");
    let guard = locks
        .mutex(&lock)
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    support::emit_result(format_args!("HELD {}", guard.fencing_token()));
    // Killed by the parent; the bound only matters if the parent died first.
    tokio::time::sleep(Duration::from_secs(300)).await;
    drop(guard);
}

// ---------------------------------------------------------------------------
// 3. The notifier connection is killed while 50 tasks wait
// ---------------------------------------------------------------------------

/// Spawns one task per mutex: lock, check, unlock; returns the lock names and tokens.
fn spawn_waiters(
    mutexes: Vec<fredlock::Mutex>,
    acquired: Arc<AtomicUsize>,
) -> tokio::task::JoinSet<fredlock::Result<(String, u64)>> {
    let mut set = tokio::task::JoinSet::new();
    for mutex in mutexes {
        let acquired = acquired.clone();
        set.spawn(async move {
            let guard = mutex.lock().await?;
            acquired.fetch_add(1, Ordering::SeqCst);
            let token = guard.fencing_token();
            tokio::task::yield_now().await;
            guard.unlock().await?;
            Ok((mutex.name().to_owned(), token))
        });
    }
    set
}

/// Collects every waiter result within 60 s; panics (with progress) on a hang.
async fn collect_waiters(
    mut set: tokio::task::JoinSet<fredlock::Result<(String, u64)>>,
    acquired: &AtomicUsize,
    locks: &LockClient,
) -> Vec<(String, u64)> {
    let bound = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + bound;
    let mut tokens = Vec::new();
    while !set.is_empty() {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(done)) => tokens.push(
                done.expect("waiter task panicked")
                    .expect("lock/unlock failed"),
            ),
            Ok(None) => break,
            Err(_) => panic!(
                "only {} of {WAITERS} waiters acquired within {bound:?} (lost wakeup?); stats {:?}",
                acquired.load(Ordering::SeqCst),
                locks.stats()
            ),
        }
    }
    tokens
}

async fn notifier_killed(mode: NotificationMode, many_locks: bool) {
    support::init_tracing();
    let server = Arc::new(RedisServer::start());
    let variant = if many_locks { "many" } else { "single" };
    let prefix = format!("proc-notifier-{variant}-{}", mode.as_str());
    let names: Vec<String> = if many_locks {
        (0..WAITERS).map(|i| format!("lock-{i}")).collect()
    } else {
        vec!["contended".to_owned()]
    };

    let holder = LockClient::connect(config(&server.url(), &prefix, mode))
        .await
        .expect("connect holder");
    let locks = LockClient::connect(config(&server.url(), &prefix, mode))
        .await
        .expect("connect waiters");

    let mut held: Vec<MutexGuard> = Vec::new();
    for name in &names {
        let guard = holder
            .mutex(name)
            .expect("mutex")
            .with_lease(Lease::fixed(LONG_LEASE))
            .expect("lease")
            .try_lock()
            .await
            .expect("try_lock")
            .expect("the lock is free");
        held.push(guard);
    }
    let max_held_token = held
        .iter()
        .map(|guard| guard.fencing_token())
        .max()
        .unwrap_or(0);
    let held_tokens: HashMap<String, u64> = held
        .iter()
        .map(|g| (g.name().to_owned(), g.fencing_token()))
        .collect();

    let mutexes: Vec<fredlock::Mutex> = (0..WAITERS)
        .map(|i| locks.mutex(&names[i % names.len()]).expect("mutex handle"))
        .collect();
    let acquired = Arc::new(AtomicUsize::new(0));
    let set = spawn_waiters(mutexes, acquired.clone());

    wait_until("all waiters wait", HANG, || {
        let stats = locks.stats();
        stats.waiting == WAITERS
            && stats.waiting_locks == names.len()
            && names
                .iter()
                .all(|name| anyone_queued(&server, &prefix, name))
    })
    .await;

    let killed = {
        let server = server.clone();
        blocking(move || kill_connections(&server, mode)).await
    };
    // Waiters re-checked after the reconnects; the holder still holds every lock.
    assert_eq!(acquired.load(Ordering::SeqCst), 0, "acquired a held lock");
    assert_eq!(locks.stats().waiting, WAITERS);
    assert!(held.iter().all(|g| g.lost_cause().is_none()));

    let released_at = Instant::now();
    for guard in held {
        guard.unlock().await.expect("holder unlock");
    }
    let tokens = collect_waiters(set, &acquired, &locks).await;
    let took = released_at.elapsed();
    eprintln!(
        "[{}] notifier killed ({variant} lock(s); {killed}): all {WAITERS} waiters acquired \
         {took:?} after the release; wakeups {}",
        mode.as_str(),
        locks.stats().wakeups
    );

    assert_eq!(tokens.len(), WAITERS);
    // Every waiter's token is above the token of its lock's holder.
    for (name, token) in &tokens {
        assert!(
            *token > held_tokens[name],
            "{name}: a waiter got token {token}, not above the holder's {}",
            held_tokens[name]
        );
    }
    if many_locks {
        // One waiter per lock.
        let names_seen: HashSet<&str> = tokens.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names_seen.len(), WAITERS, "tokens {tokens:?}");
    } else {
        assert!(
            tokens.iter().all(|&(_, t)| t > max_held_token),
            "a waiter got a token not above the holder's: {tokens:?}"
        );
    }
    // Each hand-off of a lock (a grant to a queued waiter, a local hand-over) takes its token
    // from the lock's hash, above the previous one, so the tokens of a lock's waiters are
    // distinct; and no waiter's take read the shard's fence key (every waiter got its lock
    // while the hash existed), so it still records the last of the holders' first takes.
    let mut per_lock: HashMap<&str, HashSet<u64>> = HashMap::new();
    for (name, token) in &tokens {
        assert!(
            per_lock.entry(name.as_str()).or_default().insert(*token),
            "{name}: token {token} issued twice: {tokens:?}"
        );
    }
    let shards = config(&server.url(), &prefix, mode).shards;
    let mut per_shard: HashMap<u32, Vec<u64>> = HashMap::new();
    for (name, token) in &held_tokens {
        let shard = fnv1a32(name.as_bytes()) % u32::from(shards);
        per_shard.entry(shard).or_default().push(*token);
    }
    for (shard, taken) in &per_shard {
        let fence = format!("{{{prefix}:{shard}}}:fence");
        let (last, _) = support::fence_value(&server, &fence);
        assert_eq!(
            Some(&last),
            taken.iter().max(),
            "shard {shard}: the fence key's last token is not the holders' last"
        );
    }
    assert_eq!(locks.stats().waiting, 0);
    assert_eq!(locks.stats().held, 0);
    locks.shutdown().await.expect("shutdown waiters");
    holder.shutdown().await.expect("shutdown holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_killed_while_50_wait_on_one_lock_stream() {
    notifier_killed(NotificationMode::Stream, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_killed_while_50_wait_on_one_lock_pubsub() {
    notifier_killed(NotificationMode::PubSub, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_killed_while_50_wait_on_50_locks_stream() {
    notifier_killed(NotificationMode::Stream, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_killed_while_50_wait_on_50_locks_pubsub() {
    notifier_killed(NotificationMode::PubSub, true).await;
}

// ---------------------------------------------------------------------------
// 4. A release in another process wakes a waiter in this one
// ---------------------------------------------------------------------------

async fn cross_process_release(mode: NotificationMode) {
    support::init_tracing();
    let server = RedisServer::start();
    let prefix = format!("proc-push-{}", mode.as_str());
    let ns = format!("test-push-{}", mode.as_str());
    let lock = "pushed";
    let go_key = format!("{ns}:go");

    let worker = support::spawn_worker_handle(
        "worker_hold_until_go",
        &worker_env(&server, &prefix, mode, lock, &ns),
    );
    let (worker, line) = next_result(worker, HANG).await;
    let worker_token = held_token(&line);

    let locks = LockClient::connect(config(&server.url(), &prefix, mode))
        .await
        .expect("connect");
    let mutex = locks.mutex(lock).expect("mutex");
    let remaining = mutex
        .state()
        .await
        .expect("state")
        .remaining
        .expect("held with a lease");
    assert!(
        remaining > Duration::from_secs(60),
        "the worker's lease must be long: {remaining:?}"
    );

    let waiter = {
        let mutex = mutex.clone();
        tokio::spawn(async move {
            let guard = mutex.lock().await;
            (guard, Instant::now())
        })
    };
    wait_until("the waiter waits", HANG, || {
        locks.stats().waiting == 1 && anyone_queued(&server, &prefix, lock)
    })
    .await;
    let wakeups_before = locks.stats().wakeups;

    let go_at = Instant::now();
    assert_eq!(
        server.cmd(&["SET", &go_key, "1"]),
        Resp::Simple("OK".into())
    );
    let (guard, acquired_at) = tokio::time::timeout(HANG, waiter)
        .await
        .unwrap_or_else(|_| {
            panic!("not woken within {HANG:?} by the other process's release (lease 120 s)")
        })
        .expect("waiter task");
    let guard = guard.expect("lock");
    let took = acquired_at.saturating_duration_since(go_at);
    eprintln!(
        "[{}] cross-process release: waiter acquired {took:?} after GO (worker polls every \
         20 ms); wakeups {} -> {}",
        mode.as_str(),
        wakeups_before,
        locks.stats().wakeups
    );
    assert!(guard.fencing_token() > worker_token);
    assert!(
        locks.stats().wakeups > wakeups_before,
        "the waiter acquired without a wakeup"
    );

    let lines = blocking(move || worker.wait()).await;
    assert!(
        lines.iter().any(|l| l == "RELEASED"),
        "worker output: {lines:?}"
    );
    guard.unlock().await.expect("unlock");
    locks.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_in_another_process_wakes_waiter_stream() {
    cross_process_release(NotificationMode::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_in_another_process_wakes_waiter_pubsub() {
    cross_process_release(NotificationMode::PubSub).await;
}

/// Worker of scenario 4: holds the lock with a 120 s fixed lease until the GO key appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "worker process of the multi-process tests"]
async fn worker_hold_until_go() {
    if !support::is_worker() {
        return;
    }
    support::init_tracing();
    let (config, lock) = worker_config();
    let go_key = format!("{}:go", param(ENV_NS));
    let locks = LockClient::connect(config).await.expect("connect");
    let guard = locks
        .mutex(&lock)
        .expect("mutex")
        .with_lease(Lease::fixed(LONG_LEASE))
        .expect("lease")
        .lock()
        .await
        .expect("lock");
    support::emit_result(format_args!("HELD {}", guard.fencing_token()));

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let go: i64 = locks.redis().exists(go_key.as_str()).await.expect("EXISTS");
        if go == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no GO signal");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.unlock().await.expect("unlock");
    support::emit_result("RELEASED");
    locks.shutdown().await.expect("shutdown");
}
