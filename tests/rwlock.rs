//! Read-write lock: shared reads across processes, exclusive writes, writer-starvation
//! prevention, one event for many readers, downgrade, crashed readers and writers, no leftovers.
//! Real redis-server, real OS processes, both notification modes.

mod support;

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use fredlock::{Config, Error, Lease, LockClient, LockGuard, NotificationMode, Owner};
use support::{
    bounded, connect, emit_result, eventually_async, find_hold, init_tracing, is_worker,
    parse_mode, shutdown, spawn_worker_handle, take_over_deferred, tasks_hand_the_hold_on,
    worker_param, Intrudes, RedisServer, Take, HANG, MODES,
};

/// One shard, so the test can name the lock's hash: `{prefix:0}:rw:<name>`.
fn config(url: &str, mode: NotificationMode, prefix: &str) -> Config {
    let mut config = support::config(url, prefix, mode);
    config.shards = 1;
    config.waiter_lease = Duration::from_millis(900);
    config.watchdog_lease = Duration::from_millis(900);
    config
}

fn key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:rw:{name}")
}

fn worker_env(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    role: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("RW_URL", server.url()),
        ("RW_MODE", mode.as_str().to_owned()),
        ("RW_PREFIX", prefix.to_owned()),
        ("RW_ROLE", role.to_owned()),
    ]
}

/// One field of the lock's hash (`lua/lib/rw.lua`), "" when absent.
fn field(server: &RedisServer, prefix: &str, name: &str, field: &str) -> String {
    server
        .cmd(&["HGET", &key(prefix, name), field])
        .as_str_opt()
        .unwrap_or_default()
}

/// The lock's wait queue, a sorted set beside its hash (`lua/lib/rw.lua`).
fn queue_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:rw.wait:{name}")
}

/// How many waiters the lock's queue holds (its places: the members scored in µs).
fn queue_len(server: &RedisServer, prefix: &str, name: &str) -> usize {
    let places = server.cmd(&[
        "ZCOUNT",
        &queue_key(prefix, name),
        "(100000000000000",
        "+inf",
    ]);
    places.as_int() as usize
}

/// Worker process: runs one role against the server given in its environment.
#[test]
#[ignore = "worker process of the read-write lock tests"]
fn rw_worker() {
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
    let mode = parse_mode(&param("RW_MODE"));
    let role = param("RW_ROLE");
    let mut config = config(&param("RW_URL"), mode, &param("RW_PREFIX"));
    if role == "read-heavy" {
        config.waiter_lease = MIX_LEASE;
        config.watchdog_lease = MIX_LEASE;
    }
    let locks = LockClient::connect(config).await.expect("connect");
    match role.as_str() {
        "overlap" => overlap_worker(&locks).await,
        "read-heavy" => read_heavy_worker(&locks).await,
        "mixed" => mixed_worker(&locks).await,
        "queued-readers" => queued_readers_worker(&locks).await,
        "hold-read" => {
            let guard = locks.rwlock("crash").unwrap().read().await.expect("read");
            emit_result(format!("HELD {}", guard.fencing_token()));
            std::future::pending::<()>().await;
        }
        "wait-write" => {
            let guard = locks
                .rwlock("dead-writer")
                .unwrap()
                .write()
                .await
                .expect("write");
            emit_result("ACQUIRED");
            drop(guard);
        }
        role => panic!("unknown role {role}"),
    }
    locks.shutdown().await.expect("shutdown");
}

/// 4 readers each hold a read lock until 8 readers (over two processes) hold it at once.
async fn overlap_worker(locks: &LockClient) {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = locks.rwlock("overlap").unwrap();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.read().await.expect("read");
            let _: i64 = redis.incr("overlap-in").await.expect("INCR");
            let deadline = tokio::time::Instant::now() + HANG;
            loop {
                let inside: i64 = redis.get("overlap-in").await.expect("GET");
                if inside >= 8 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "readers never overlapped"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            guard.unlock().await.expect("unlock");
        }));
    }
    for task in tasks {
        task.await.expect("reader");
    }
    emit_result("overlapped");
}

const MIXED_ROUNDS: usize = 20;

/// 2 writers do a two-step update and a counter increment; 2 readers check they never see a
/// half-written state.
async fn mixed_worker(locks: &LockClient) {
    let mut tasks = Vec::new();
    for role in ["w", "w", "r", "r"] {
        let lock = locks.rwlock("mixed").unwrap();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            let mut torn = 0;
            for round in 0..MIXED_ROUNDS {
                if role == "w" {
                    let guard = lock.write().await.expect("write");
                    let stamp = format!("{}-{round}", guard.fencing_token());
                    let _: () = redis
                        .set("mixed-a", &stamp, None, None, false)
                        .await
                        .expect("SET");
                    tokio::task::yield_now().await;
                    let _: () = redis
                        .set("mixed-b", &stamp, None, None, false)
                        .await
                        .expect("SET");
                    let count: Option<i64> = redis.get("mixed-count").await.expect("GET");
                    let _: () = redis
                        .set("mixed-count", count.unwrap_or(0) + 1, None, None, false)
                        .await
                        .expect("SET");
                    guard.unlock().await.expect("unlock");
                } else {
                    let guard = lock.read().await.expect("read");
                    let a: Option<String> = redis.get("mixed-a").await.expect("GET");
                    tokio::task::yield_now().await;
                    let b: Option<String> = redis.get("mixed-b").await.expect("GET");
                    if a != b {
                        torn += 1;
                    }
                    guard.unlock().await.expect("unlock");
                }
            }
            torn
        }));
    }
    let mut torn = 0;
    for task in tasks {
        torn += task.await.expect("task");
    }
    emit_result(format!("torn {torn}"));
}

/// Processes, tasks per process and operations per task of the read-heavy mix.
const MIX_PROCESSES: usize = 4;
const MIX_TASKS: usize = 4;
const MIX_OPS: usize = 150;
/// Every lease of the read-heavy mix (holds, waiter leases, the watchdog): far longer than the
/// hang bound, so a waiter that misses its wakeup sleeps out its wait bound and the run fails
/// on the bound instead of passing slowly.
const MIX_LEASE: Duration = Duration::from_secs(600);

/// One operation in ten is a write, spread differently over each task.
fn mix_writes(task: usize, op: usize) -> bool {
    (op * 7 + task * 3) % 10 == 0
}

/// `MIX_TASKS` tasks do `MIX_OPS` operations each, 90 % reads: a writer increments a shared
/// counter with GET and SET and stamps two keys one after the other; a reader checks that it
/// never sees the two stamps differ. Reports the writes done and the torn reads seen.
async fn read_heavy_worker(locks: &LockClient) {
    let mut tasks = Vec::new();
    for task in 0..MIX_TASKS {
        let lock = locks
            .rwlock("read-heavy")
            .unwrap()
            .with_lease(Lease::fixed(MIX_LEASE))
            .unwrap();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            let (mut writes, mut torn) = (0u64, 0u64);
            for op in 0..MIX_OPS {
                if mix_writes(task, op) {
                    let guard = lock.write().await.expect("write");
                    let count: Option<i64> = redis.get("rh-count").await.expect("GET");
                    let next = count.unwrap_or(0) + 1;
                    let _: () = redis
                        .set("rh-a", next, None, None, false)
                        .await
                        .expect("SET");
                    tokio::task::yield_now().await;
                    let _: () = redis
                        .set("rh-b", next, None, None, false)
                        .await
                        .expect("SET");
                    let _: () = redis
                        .set("rh-count", next, None, None, false)
                        .await
                        .expect("SET");
                    guard.unlock().await.expect("write unlock");
                    writes += 1;
                } else {
                    let guard = lock.read().await.expect("read");
                    let a: Option<i64> = redis.get("rh-a").await.expect("GET");
                    tokio::task::yield_now().await;
                    let b: Option<i64> = redis.get("rh-b").await.expect("GET");
                    if a != b {
                        torn += 1;
                    }
                    guard.unlock().await.expect("read unlock");
                }
            }
            (writes, torn)
        }));
    }
    let (mut writes, mut torn) = (0, 0);
    for task in tasks {
        let (w, t) = task.await.expect("task");
        writes += w;
        torn += t;
    }
    emit_result(format!("writes {writes} torn {torn}"));
}

/// 4 readers queue behind a writer; reports how many acquired and the wakeups it took.
async fn queued_readers_worker(locks: &LockClient) {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = locks.rwlock("fanout").unwrap();
        let redis = locks.redis().clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.read().await.expect("read");
            // Hold until all 8 readers (both processes) hold: a reader that released early,
            // while readers of the other process were still queued, would make its release
            // the last read release with waiters queued, which emits an event of its own.
            let _: i64 = redis.incr("fanout-in").await.expect("INCR");
            let deadline = tokio::time::Instant::now() + HANG;
            loop {
                let inside: i64 = redis.get("fanout-in").await.expect("GET");
                if inside >= 8 {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "readers never all held"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            guard.unlock().await.expect("unlock");
        }));
    }
    for task in tasks {
        task.await.expect("reader");
    }
    emit_result(format!("acquired 4 wakeups {}", locks.stats().wakeups));
}

#[test]
fn eight_readers_in_two_processes_hold_the_lock_together() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("overlap-{}", mode.as_str());
        server.cmd(&["DEL", "overlap-in"]);
        let workers: Vec<_> = (0..2)
            .map(|_| {
                spawn_worker_handle("rw_worker", &worker_env(&server, mode, &prefix, "overlap"))
            })
            .collect();
        for worker in workers {
            assert_eq!(worker.wait(), vec!["overlapped".to_owned()]);
        }
        assert_eq!(server.cmd(&["GET", "overlap-in"]).as_int(), 8);
    }
}

#[test]
fn writers_exclude_readers_and_writers() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("mixed-{}", mode.as_str());
        for k in ["mixed-a", "mixed-b", "mixed-count"] {
            server.cmd(&["DEL", k]);
        }
        let workers: Vec<_> = (0..2)
            .map(|_| spawn_worker_handle("rw_worker", &worker_env(&server, mode, &prefix, "mixed")))
            .collect();
        for worker in workers {
            assert_eq!(worker.wait(), vec!["torn 0".to_owned()], "{mode:?}");
        }
        assert_eq!(
            server.cmd(&["GET", "mixed-count"]).as_int(),
            (2 * 2 * MIXED_ROUNDS) as i64,
            "{mode:?}: lost updates"
        );
        assert_no_leftovers(&server, &prefix, "mixed");
    }
}

/// The lost-wakeup regression: with many tasks per process, the order of a process's local
/// waiters differs from the order of the Redis queue, and a release event must still wake the
/// readers Redis admits. Every lease is longer than the workers' hang bound (120 s), so a lost
/// wakeup fails the test; nothing here is timed otherwise.
#[test]
fn a_read_heavy_mix_of_many_tasks_in_many_processes_loses_no_wakeup() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("read-heavy-{}", mode.as_str());
        for k in ["rh-a", "rh-b", "rh-count"] {
            server.cmd(&["DEL", k]);
        }
        let workers: Vec<_> = (0..MIX_PROCESSES)
            .map(|_| {
                spawn_worker_handle(
                    "rw_worker",
                    &worker_env(&server, mode, &prefix, "read-heavy"),
                )
            })
            .collect();
        let mut writes = 0;
        for worker in workers {
            let lines = worker.wait();
            let line = lines.first().expect("result");
            let (done, torn) = line
                .strip_prefix("writes ")
                .and_then(|rest| rest.split_once(" torn "))
                .and_then(|(w, t)| Some((w.parse::<i64>().ok()?, t.parse::<i64>().ok()?)))
                .unwrap_or_else(|| panic!("bad result {line:?}"));
            assert_eq!(torn, 0, "{mode:?}: a reader saw a half-done write");
            writes += done;
        }
        assert_eq!(
            writes,
            (MIX_PROCESSES * MIX_TASKS * MIX_OPS / 10) as i64,
            "{mode:?}: every task does one write in ten operations"
        );
        assert_eq!(
            server.cmd(&["GET", "rh-count"]).as_int(),
            writes,
            "{mode:?}: lost updates, writers overlapped"
        );
        assert_no_leftovers(&server, &prefix, "read-heavy");
    }
}

/// A writer at the head of the queue that gives up (its acquisition is dropped) lets the
/// readers queued behind it in at once, though readers hold the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_lets_the_readers_behind_it_in() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("giveup-{}", mode.as_str());
        let locks = LockClient::connect(config(&server.url(), mode, &prefix))
            .await
            .unwrap();
        let lock = locks
            .rwlock("doc")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_secs(60)))
            .unwrap();
        let holder = lock.read().await.unwrap();
        let writer = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.write().await.map(drop) })
        };
        eventually_async("writer queued", || async {
            queue_len(&server, &prefix, "doc") == 1
        })
        .await;
        let reader = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.read().await })
        };
        eventually_async("reader queued behind the writer", || async {
            queue_len(&server, &prefix, "doc") == 2
        })
        .await;
        writer.abort();
        // The holder's lease is 60 s: only the writer's leave can let the reader in in time.
        let second = tokio::time::timeout(HANG, reader)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(lock.state().await.unwrap().readers, 2, "{mode:?}");
        second.unlock().await.unwrap();
        holder.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "doc");
        locks.shutdown().await.unwrap();
    }
}

/// The lock `name` with a fixed 120 s lease: no hold ends on its own during a test.
fn long_lease(client: &LockClient, name: &str) -> fredlock::RwLock {
    client
        .rwlock(name)
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap()
}

/// Three clients A, B, C and what [`write_granted_with_a_reader_queued`] left them with.
struct Queued {
    clients: [LockClient; 3],
    /// A's write hold, granted with B's reader still queued behind it (so its release is
    /// deferred: A's client may take it over).
    writer: fredlock::WriteGuard,
    /// B's pending read.
    reader: tokio::task::JoinHandle<fredlock::Result<fredlock::ReadGuard>>,
}

/// C holds the write hold; A's writer, then B's reader queue behind it; C's release grants the
/// write hold to A, B still queued. The clients' `handover_limit` is zero: the strictly fair
/// read-write lock, whose writers never pass a queued waiter (a take-over included).
async fn write_granted_with_a_reader_queued(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    name: &str,
) -> Queued {
    write_granted_with_a_reader_queued_within(server, mode, prefix, name, Duration::ZERO).await
}

/// [`write_granted_with_a_reader_queued`] with the clients' `handover_limit` `limit`.
async fn write_granted_with_a_reader_queued_within(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    name: &str,
    limit: Duration,
) -> Queued {
    let connect = || {
        let mut config = config(&server.url(), mode, prefix);
        config.handover_limit = limit;
        LockClient::connect(config)
    };
    let (a, b, c) = (
        connect().await.unwrap(),
        connect().await.unwrap(),
        connect().await.unwrap(),
    );
    let c_guard = long_lease(&c, name).write().await.unwrap();
    let a_task = {
        let rw = long_lease(&a, name);
        tokio::spawn(async move { rw.write().await })
    };
    eventually_async("A queued", || async {
        queue_len(server, prefix, name) == 1
    })
    .await;
    let reader = {
        let rw = long_lease(&b, name);
        tokio::spawn(async move { rw.read().await })
    };
    eventually_async("B queued", || async {
        queue_len(server, prefix, name) == 2
    })
    .await;
    c_guard.unlock().await.unwrap();
    let writer = tokio::time::timeout(HANG, a_task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    Queued {
        clients: [a, b, c],
        writer,
        reader,
    }
}

/// On the strictly fair lock (`handover_limit` zero), a writer that asks again right after
/// its own write release (a worker loop) joins the queue's tail in that release's call: A's write hold came by a grant with reader B queued
/// behind it, so A's `unlock()` is deferred; A's next `write()` sends the release naming
/// itself, which grants B its read hold and queues A behind it, and A then waits for its own
/// grant without an attempt of its own.
#[tokio::test(flavor = "current_thread")]
async fn a_writer_that_writes_again_right_after_its_release_queues_behind_the_readers() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("rewrite-{}", mode.as_str());
        let Queued {
            clients: [a, b, c],
            writer: a_guard,
            reader: b_task,
        } = write_granted_with_a_reader_queued(&server, mode, &prefix, "loop").await;
        let lock = |client: &LockClient| long_lease(client, "loop");
        let first = a_guard.fencing_token();

        a_guard.unlock().await.unwrap();
        let attempts = a.stats().attempts;
        let a_lock = lock(&a);
        let what = format!("{mode:?}: A's write()");
        let again = take_over_deferred(&a, &what, async move { a_lock.write().await }).await;
        let b_guard = tokio::time::timeout(HANG, b_task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            b_guard.fencing_token() > first,
            "{mode:?}: B reads after A's write"
        );
        let b_token = b_guard.fencing_token();
        eventually_async("A queued behind B", || async {
            queue_len(&server, &prefix, "loop") == 1
        })
        .await;
        assert!(field(&server, &prefix, "loop", "o").is_empty(), "{mode:?}");
        b_guard.unlock().await.unwrap();
        let a_again = tokio::time::timeout(HANG, again)
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
        a_again.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "loop");
        for client in [a, b, c] {
            client.shutdown().await.unwrap();
        }
    }
}

/// With a reader queued that has not waited `handover_limit`, a writer that asks again right
/// after its own write release takes the write hold over ahead of it (writers barge, as on a
/// `Mutex`: here without a call); its next release, which nobody takes over, names the last
/// token and grants the reader its read hold, with a token above it.
#[tokio::test(flavor = "current_thread")]
async fn a_writer_that_writes_again_before_the_queue_is_due_takes_its_release_over() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("barge-{}", mode.as_str());
        let limit = Duration::from_secs(10);
        let Queued {
            clients: [a, b, c],
            writer: a_guard,
            reader: b_task,
        } = write_granted_with_a_reader_queued_within(&server, mode, &prefix, "loop", limit).await;
        let first = a_guard.fencing_token();

        a_guard.unlock().await.unwrap();
        assert_eq!(
            a.stats().deferred_releases,
            1,
            "{mode:?}: the release waits"
        );
        let a_again = tokio::time::timeout(HANG, long_lease(&a, "loop").write())
            .await
            .unwrap()
            .unwrap();
        assert!(a_again.fencing_token() > first, "{mode:?}");
        assert_eq!(a.stats().taken_over, 1, "{mode:?}");
        assert_eq!(queue_len(&server, &prefix, "loop"), 1, "{mode:?}: B waits");
        assert!(!b_task.is_finished(), "{mode:?}");

        let a_token = a_again.fencing_token();
        a_again.unlock().await.unwrap();
        let b_guard = tokio::time::timeout(HANG, b_task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(b_guard.fencing_token() > a_token, "{mode:?}: B after A");
        b_guard.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "loop");
        for client in [a, b, c] {
            client.shutdown().await.unwrap();
        }
    }
}

/// Only the write side takes a deferred write release over, with or without a call: a task
/// that asks for a read hold right after its write release waits like any reader (here it joins the wave that the
/// release grants to the reader queued before it), and is never handed the write hold.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_right_after_a_write_release_does_not_take_the_write_hold_over() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("reread-{}", mode.as_str());
        // Writers barge (a hand-over without a call would be allowed): still not to a reader.
        let limit = Duration::from_secs(10);
        let Queued {
            clients: [a, b, c],
            writer: a_guard,
            reader: b_task,
        } = write_granted_with_a_reader_queued_within(&server, mode, &prefix, "reread", limit)
            .await;
        let lock = |client: &LockClient| long_lease(client, "reread");
        a_guard.unlock().await.unwrap();
        assert_eq!(
            a.stats().deferred_releases,
            1,
            "{mode:?}: A's release waits"
        );
        let a_read = tokio::time::timeout(HANG, lock(&a).read())
            .await
            .unwrap()
            .unwrap();
        let b_guard = tokio::time::timeout(HANG, b_task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let state = lock(&c).state().await.unwrap();
        assert!(
            !state.write_locked,
            "{mode:?}: nobody was handed the write hold"
        );
        assert_eq!(state.readers, 2, "{mode:?}: A and B read together");
        assert_eq!(a.stats().taken_over, 0, "{mode:?}");
        a_read.unlock().await.unwrap();
        b_guard.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "reread");
        for client in [a, b, c] {
            client.shutdown().await.unwrap();
        }
    }
}

/// A write hold its owner took with nobody waiting becomes contended when a reader of another
/// client queues behind it: Redis tells the writer's client (one `held` event,
/// `lua/rw_acquire.lua`), and the write hold's release is deferred from then on, so `unlock()`
/// returns without a round trip; the deferred release grants the reader its hold.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_queued_behind_a_taken_write_hold_makes_its_release_deferred() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("behind-{}", mode.as_str());
        let connect = || LockClient::connect(config(&server.url(), mode, &prefix));
        let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
        let writer = tokio::time::timeout(HANG, long_lease(&a, "behind").write())
            .await
            .unwrap()
            .unwrap();
        let reader = tokio::spawn({
            let lock = long_lease(&b, "behind");
            async move { lock.read().await }
        });
        eventually_async("A hears of B's reader", || async {
            a.stats().queued_behind == 1
        })
        .await;
        assert_eq!(queue_len(&server, &prefix, "behind"), 1, "{mode:?}");
        let token = writer.fencing_token();
        writer.unlock().await.unwrap();
        assert_eq!(
            a.stats().deferred_releases,
            1,
            "{mode:?}: parked, not yet sent"
        );
        let read = tokio::time::timeout(HANG, reader)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(read.fencing_token() > token, "{mode:?}");
        assert_eq!(
            b.stats().queued_behind,
            0,
            "{mode:?}: readers ask for no notice"
        );
        read.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "behind");
        for client in [a, b] {
            client.shutdown().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_goes_before_every_reader_that_came_after_it() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("starve-{}", mode.as_str());
        let locks = LockClient::connect(config(&server.url(), mode, &prefix))
            .await
            .unwrap();
        let lock = locks.rwlock("doc").unwrap();
        let first_reader = lock.read().await.unwrap();
        // Readers come and go freely while no writer waits.
        let early = lock.try_read().await.unwrap().expect("readers share");
        early.unlock().await.unwrap();

        let redis = locks.redis().clone();
        let rank_key = format!("{prefix}-rank");
        let writer = {
            let (lock, redis, rank_key) = (lock.clone(), redis.clone(), rank_key.clone());
            tokio::spawn(async move {
                let guard = lock.write().await.unwrap();
                let rank: i64 = redis.incr(&rank_key).await.unwrap();
                guard.unlock().await.unwrap();
                rank
            })
        };
        eventually_async("writer queued", || async {
            queue_len(&server, &prefix, "doc") == 1
        })
        .await;

        // A stream of new readers: none may pass the waiting writer.
        let mut readers = Vec::new();
        for i in 0..6 {
            assert!(
                lock.try_read().await.unwrap().is_none(),
                "{mode:?}: a new reader passed a waiting writer"
            );
            let (lock, redis, rank_key) = (lock.clone(), redis.clone(), rank_key.clone());
            readers.push(tokio::spawn(async move {
                let guard = lock.read().await.unwrap();
                let rank: i64 = redis.incr(&rank_key).await.unwrap();
                guard.unlock().await.unwrap();
                rank
            }));
            eventually_async("reader queued", || async {
                queue_len(&server, &prefix, "doc") == 2 + i
            })
            .await;
        }
        first_reader.unlock().await.unwrap();
        let writer_rank = tokio::time::timeout(HANG, writer).await.unwrap().unwrap();
        assert_eq!(writer_rank, 1, "{mode:?}: the writer must go first");
        for reader in readers {
            let rank = tokio::time::timeout(HANG, reader).await.unwrap().unwrap();
            assert!(rank > writer_rank);
        }
        assert_no_leftovers(&server, &prefix, "doc");
        locks.shutdown().await.unwrap();
    }
}

#[test]
fn one_write_release_wakes_queued_readers_with_one_event_per_process() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fanout-{}", mode.as_str());
        server.cmd(&["DEL", "fanout-in"]);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let locks = runtime
            .block_on(LockClient::connect(config(&server.url(), mode, &prefix)))
            .unwrap();
        let lock = locks
            .rwlock("fanout")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_secs(120)))
            .unwrap();
        let writer = runtime.block_on(lock.write()).unwrap();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                spawn_worker_handle(
                    "rw_worker",
                    &worker_env(&server, mode, &prefix, "queued-readers"),
                )
            })
            .collect();
        let deadline = std::time::Instant::now() + HANG;
        while queue_len(&server, &prefix, "fanout") != 8 {
            assert!(std::time::Instant::now() < deadline, "readers never queued");
            std::thread::sleep(Duration::from_millis(10));
        }
        let shared_stream = format!("{{{prefix}:events}}");
        let shared_events = |server: &RedisServer| -> i64 {
            match mode {
                NotificationMode::Stream => server.cmd(&["XLEN", &shared_stream]).as_int(),
                _ => 0,
            }
        };
        let events_before = shared_events(&server);
        let inboxes = server.keys(&format!("{{{prefix}:events}}:to:*"));
        let inbox_events = |server: &RedisServer| -> i64 {
            match mode {
                NotificationMode::Stream => inboxes
                    .iter()
                    .map(|inbox| server.cmd(&["XLEN", inbox]).as_int())
                    .sum(),
                _ => 0,
            }
        };
        let inbox_events_before = inbox_events(&server);
        runtime.block_on(writer.unlock()).unwrap();
        let mut wakeups = 0;
        for worker in workers {
            let lines = worker.wait();
            let line = lines.first().expect("result");
            wakeups += line
                .strip_prefix("acquired 4 wakeups ")
                .and_then(|n| n.parse::<u64>().ok())
                .expect("wakeups");
        }
        // Readers release too, but the last read release only emits when waiters are queued,
        // and none are left then: the write release let 8 readers in with one event into the
        // inbox of each of the two processes, none on the shared stream or channel.
        let events = shared_events(&server) - events_before;
        assert_eq!(events, 0, "{mode:?}: an event for every process");
        if mode == NotificationMode::Stream {
            assert_eq!(
                inboxes.len(),
                3,
                "{mode:?}: this client's and two workers' inboxes"
            );
            assert_eq!(
                inbox_events(&server) - inbox_events_before,
                2,
                "{mode:?}: one event per process"
            );
        }
        assert!(wakeups >= 8, "{mode:?}: {wakeups} wakeups for 8 readers");
        assert_no_leftovers(&server, &prefix, "fanout");
        runtime.block_on(locks.shutdown()).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_the_read_hold_and_upgrade_is_refused() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("grade-{}", mode.as_str());
        let locks = LockClient::connect(config(&server.url(), mode, &prefix))
            .await
            .unwrap();
        let me = Owner::new();
        let mine = locks.rwlock("cfg").unwrap().with_owner(&me);
        let other = locks.rwlock("cfg").unwrap();

        let write = mine.write().await.unwrap();
        let read = mine.read().await.unwrap();
        assert_eq!(
            read.fencing_token(),
            write.fencing_token(),
            "downgrade keeps the token"
        );
        assert!(
            other.try_read().await.unwrap().is_none(),
            "the writer still excludes others"
        );
        // A reader waiting behind the writer is let in by the write half of the downgrade.
        let waiting_reader = {
            let other = other.clone();
            tokio::spawn(async move { other.read().await.map(|g| g.fencing_token()) })
        };
        eventually_async("reader queued", || async {
            queue_len(&server, &prefix, "cfg") == 1
        })
        .await;
        write.unlock().await.unwrap();
        let token = tokio::time::timeout(HANG, waiting_reader)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            token > read.fencing_token(),
            "{mode:?}: a read hold of its own, after the downgrade's"
        );
        // The reader task's guard was dropped: its release runs in the background.
        eventually_async("the other reader released", || async {
            mine.state().await.unwrap().readers == 1
        })
        .await;
        assert!(!mine.state().await.unwrap().write_locked);
        assert!(
            other.try_write().await.unwrap().is_none(),
            "read hold excludes writers"
        );

        // Asking for write while holding read is refused at once.
        match mine.write_timeout(Duration::from_secs(60)).await {
            Err(Error::UpgradeNotSupported(name)) => assert_eq!(name, "cfg"),
            other => panic!("expected UpgradeNotSupported, got {other:?}"),
        }
        read.unlock().await.unwrap();
        let write = other.try_write().await.unwrap().expect("free now");
        assert!(write.fencing_token() > token);
        write.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "cfg");
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_expire_on_their_own() {
    init_tracing();
    let server = RedisServer::start();
    let prefix = "own-expiry";
    let locks = LockClient::connect(config(&server.url(), NotificationMode::Stream, prefix))
        .await
        .unwrap();
    let short = locks
        .rwlock("split")
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_millis(300)))
        .unwrap();
    let long = locks
        .rwlock("split")
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(60)))
        .unwrap();
    let brief = short.read().await.unwrap();
    let lasting = long.read().await.unwrap();
    assert_eq!(long.state().await.unwrap().readers, 2);
    brief.lost().await;
    eventually_async("short read hold expired", || async {
        long.state().await.unwrap().readers == 1
    })
    .await;
    let remaining = long.state().await.unwrap().remaining.unwrap();
    assert!(
        remaining > Duration::from_secs(30),
        "the long hold was not cut: {remaining:?}"
    );
    assert!(lasting.lost_cause().is_none());
    lasting.unlock().await.unwrap();
    locks.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_reader_frees_its_hold_within_its_lease() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("crash-{}", mode.as_str());
        let locks = LockClient::connect(config(&server.url(), mode, &prefix))
            .await
            .unwrap();
        let reader = spawn_worker_handle(
            "rw_worker",
            &worker_env(&server, mode, &prefix, "hold-read"),
        );
        let held = reader.expect_result(HANG);
        assert!(held.starts_with("HELD"), "{held}");
        let lock = locks.rwlock("crash").unwrap();
        assert!(lock.try_write().await.unwrap().is_none());
        reader.kill();
        let guard = tokio::time::timeout(HANG, lock.write())
            .await
            .unwrap()
            .unwrap();
        guard.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "crash");
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_died_waiting_stops_blocking_new_readers() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("deadw-{}", mode.as_str());
        let locks = LockClient::connect(config(&server.url(), mode, &prefix))
            .await
            .unwrap();
        let lock = locks.rwlock("dead-writer").unwrap();
        let holder = lock.read().await.unwrap();
        let writer = spawn_worker_handle(
            "rw_worker",
            &worker_env(&server, mode, &prefix, "wait-write"),
        );
        eventually_async("writer queued", || async {
            queue_len(&server, &prefix, "dead-writer") == 1
        })
        .await;
        assert!(
            lock.try_read().await.unwrap().is_none(),
            "a live waiting writer blocks readers"
        );
        writer.kill();
        // Within the writer's waiter lease (900 ms here) new readers get in again.
        let reader = tokio::time::timeout(HANG, lock.read())
            .await
            .unwrap()
            .unwrap();
        reader.unlock().await.unwrap();
        holder.unlock().await.unwrap();
        assert_no_leftovers(&server, &prefix, "dead-writer");
        locks.shutdown().await.unwrap();
    }
}

/// After the runs the lock's hash holds no hold and no waiter, and is left at most as the
/// tombstone of the retry window (it keeps the lock's token and the last releases' op ids for a
/// few seconds, then expires).
fn assert_no_leftovers(server: &RedisServer, prefix: &str, name: &str) {
    let deadline = std::time::Instant::now() + HANG;
    let hash = key(prefix, name);
    loop {
        let held: Vec<String> = ["o"]
            .iter()
            .map(|f| field(server, prefix, name, f))
            .filter(|value| !value.is_empty())
            .collect();
        let queued = server.cmd(&["EXISTS", &queue_key(prefix, name)]).as_int();
        let reading = server
            .cmd(&["EXISTS", &format!("{{{prefix}:0}}:rw.read:{name}")])
            .as_int();
        if held.is_empty() && queued == 0 && reading == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "holds or waiters left behind: {held:?}, queue: {queued}, read holds: {reading}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if server.cmd(&["EXISTS", &hash]).as_int() == 1 {
        let ttl = server.cmd(&["PTTL", &hash]).as_int();
        assert!(ttl > 0, "the tombstone must expire: ttl {ttl}");
    }
}

/// Writers of one client taking turns through a handle without an owner pass the write hold on
/// without a call, as the barging `Mutex`'s tasks do (`src/engine/cohort.rs`): the hold in
/// Redis stays the first writer's, each guard's token is above the one before, another
/// client's reader cannot get in meanwhile, and once they are done the lock is let go in Redis
/// and the next hold, another client's read hold, has a token above every one handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_of_one_client_hand_the_write_hold_on_without_a_call() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("rwwithin-{}", mode.as_str());
        // A window and leases a loaded machine does not outlast.
        let mut config_a = support::config(&server.url(), &prefix, mode);
        config_a.handover_limit = Duration::from_secs(10);
        config_a.waiter_lease = Duration::from_secs(20);
        let a = connect(config_a).await;
        let b = connect(support::config(&server.url(), &prefix, mode)).await;
        let lock = a.rwlock("doc").unwrap();
        let rival = b.rwlock("doc").unwrap();

        let first = bounded("the first writer", lock.write()).await.unwrap();
        let hold_key = find_hold(&server, &prefix, "rw", "doc").expect("the hash");
        let take: Take = Arc::new(move || {
            let lock = lock.clone();
            Box::pin(async move { LockGuard::from(lock.write().await.unwrap()) })
        });
        let reader = rival.clone();
        let intrudes: Intrudes = Arc::new(move || {
            let reader = reader.clone();
            Box::pin(async move { reader.try_read().await.unwrap().is_some() })
        });
        let rival: Take = Arc::new(move || {
            let rival = rival.clone();
            Box::pin(async move { LockGuard::from(rival.read().await.unwrap()) })
        });
        let first = LockGuard::from(first);
        tasks_hand_the_hold_on(&server, &hold_key, &a, first, take, intrudes, rival).await;
        shutdown(&a).await;
        shutdown(&b).await;
    }
}
