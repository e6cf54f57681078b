//! Inspection against a real redis-server, in both notification modes: every lock kind's
//! holders and waiters as `LockClient::inspect` reports them, `LockClient::list`, and
//! `LockClient::connect_as_recorded`, which takes the layout other clients recorded.

mod support;

use fred::interfaces::KeysInterface;
use fredlock::{
    Config, Error, HoldSide, Inspector, LockClient, LockKind, LockReport, Mutex, MutexGuard,
    NotificationMode, Owner, INSPECT_LIMIT,
};
use support::{
    config, connect, eventually, in_both_modes, in_both_modes_on, layout_key, mutex_keys, shutdown,
    RedisServer, MODES,
};

/// Spawns `acquire` on a task and returns once `locks` shows it waiting (locally or in Redis).
async fn waiting<F>(locks: &LockClient, acquire: F) -> tokio::task::JoinHandle<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let before = locks.stats().queued_in_redis;
    let task = tokio::spawn(acquire);
    eventually("the waiter queued in Redis", || {
        locks.stats().queued_in_redis > before
    })
    .await;
    task
}

async fn report(locks: &LockClient, kind: LockKind, name: &str) -> LockReport {
    locks.inspect(kind, name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_locks_show_their_holder_and_queue() {
    in_both_modes("inspect-excl", |mode, locks, other| async move {
        for kind in [LockKind::Mutex, LockKind::FairMutex] {
            let owner = Owner::new();
            let handle = |locks: &LockClient| {
                if kind == LockKind::Mutex {
                    locks.mutex("m").unwrap()
                } else {
                    Mutex::from(locks.fair_mutex("m").unwrap())
                }
            };
            let mine = handle(&locks).with_owner(&owner).lock().await.unwrap();
            let theirs = handle(&other);
            let waiter = waiting(&other, async move {
                drop(theirs.lock().await.unwrap());
            })
            .await;
            let seen = report(&locks, kind, "m").await;
            assert_eq!((seen.kind, seen.name.as_str()), (kind, "m"));
            assert_eq!(seen.held, 1, "{mode:?} {kind}");
            let holder = &seen.holders[0];
            assert_eq!(holder.owner, owner.id(), "{mode:?} {kind}");
            assert_eq!(holder.side, HoldSide::Exclusive);
            assert_eq!(holder.hold_count, 1);
            assert_eq!(holder.fencing_token, mine.fencing_token());
            assert!(holder.remaining.is_some());
            assert_eq!(seen.queued, 1, "{mode:?} {kind}: {seen:?}");
            assert_eq!(seen.waiters.len(), 1);
            assert!(seen.waiters[0].waited.is_some());
            assert_ne!(seen.waiters[0].owner, owner.id());
            assert_eq!(seen.waiters[0].listening, Some(true), "{mode:?} {kind}");
            mine.unlock().await.unwrap();
            support::joined("the waiter", waiter).await;

            // The waiter's guard was dropped: its release runs in the background.
            support::eventually_async("the lock freed", || {
                let locks = locks.clone();
                async move { report(&locks, kind, "m").await.held == 0 }
            })
            .await;
            let free = report(&locks, kind, "m").await;
            assert_eq!(
                (free.held, free.queued),
                (0, 0),
                "{mode:?} {kind}: {free:?}"
            );
            assert!(free.last_token.is_some(), "the tombstone keeps the token");
        }
        let never = report(&locks, LockKind::Mutex, "never-used").await;
        assert_eq!((never.held, never.queued, never.last_token), (0, 0, None));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holds_permits_and_latches_are_reported() {
    in_both_modes("inspect-shared", |mode, locks, other| async move {
        // A read-write lock: two readers, a writer queued behind them.
        let rw = locks.rwlock("rw").unwrap();
        let readers = [rw.read().await.unwrap(), rw.read().await.unwrap()];
        let writer = other.rwlock("rw").unwrap();
        let queued = waiting(&other, async move {
            drop(writer.write().await.unwrap());
        })
        .await;
        let seen = report(&other, LockKind::RwLock, "rw").await;
        assert_eq!((seen.held, seen.queued), (2, 1), "{mode:?}: {seen:?}");
        assert!(seen.holders.iter().all(|h| h.side == HoldSide::Shared));
        let mut tokens: Vec<u64> = seen.holders.iter().map(|h| h.fencing_token).collect();
        tokens.sort_unstable();
        let mut expected: Vec<u64> = readers.iter().map(|g| g.fencing_token()).collect();
        expected.sort_unstable();
        assert_eq!(tokens, expected, "{mode:?}");
        assert!(seen.waiters[0].waiter.starts_with('w'));
        assert_eq!(
            seen.waiters[0].waited, None,
            "only an exclusive queue keeps the time"
        );
        assert_eq!(seen.waiters[0].listening, Some(true), "{mode:?}");
        assert_eq!(seen.permits, None);
        drop(readers);
        support::joined("the writer", queued).await;

        // A semaphore: its count, its permits.
        let pool = locks.semaphore("pool", 3).unwrap();
        let permits = [pool.acquire().await.unwrap(), pool.acquire().await.unwrap()];
        let seen = report(&locks, LockKind::Semaphore, "pool").await;
        assert_eq!(
            (seen.held, seen.permits),
            (2, Some(3)),
            "{mode:?}: {seen:?}"
        );
        drop(permits);

        // A latch: its count and its waiting clients.
        let latch = locks.count_down_latch("gate").unwrap();
        assert!(latch.try_set_count(2).await.unwrap());
        let theirs = other.count_down_latch("gate").unwrap();
        let before = other.stats().waiting;
        let wait = tokio::spawn(async move { theirs.wait().await.unwrap() });
        eventually("the latch waiter", || other.stats().waiting > before).await;
        support::eventually_async("the waiting client listed", || {
            let locks = locks.clone();
            async move { report(&locks, LockKind::Latch, "gate").await.queued == 1 }
        })
        .await;
        let seen = report(&locks, LockKind::Latch, "gate").await;
        assert_eq!(seen.count, Some(2), "{mode:?}");
        assert_eq!(seen.waiters[0].listening, Some(true), "{mode:?}");
        assert!(latch.delete().await.unwrap());
        support::joined("the latch waiter", wait).await;

        let listed = locks.list().await.unwrap();
        for (kind, name) in [(LockKind::RwLock, "rw"), (LockKind::Semaphore, "pool")] {
            assert!(
                listed.contains(&(kind, name.to_owned())),
                "{mode:?}: {kind} {name} in {listed:?}"
            );
        }
    })
    .await;
}

/// What a tool must see of the service in `a_tool_connects_with_the_recorded_layout`: its
/// layout (4 shards, `mode`) and its one lock, held under `guard`.
fn sees_the_service(
    config: &Config,
    listed: Vec<(LockKind, String)>,
    seen: LockReport,
    mode: NotificationMode,
    guard: &MutexGuard,
) {
    assert_eq!((config.shards, config.notification), (4, mode));
    assert_eq!(listed, vec![(LockKind::Mutex, "orders".to_owned())]);
    assert_eq!(seen.holders[0].fencing_token, guard.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_connects_with_the_recorded_layout() {
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("recorded-{}", mode.as_str());
        let mut used = config(&server, &prefix, mode);
        used.shards = 4;
        let service = connect(used).await;
        let guard = service.mutex("orders").unwrap().lock().await.unwrap();

        // The tool knows neither the shard count nor the mode: a full client, then the
        // read-only inspector, give the same answers.
        let tool = LockClient::connect_as_recorded(config(&server, &prefix, MODES[0]))
            .await
            .unwrap();
        let seen = tool.inspect(LockKind::Mutex, "orders").await.unwrap();
        sees_the_service(
            tool.config(),
            tool.list().await.unwrap(),
            seen,
            mode,
            &guard,
        );
        shutdown(&tool).await;
        let inspector = Inspector::connect(config(&server, &prefix, MODES[0]))
            .await
            .unwrap();
        let seen = inspector.inspect(LockKind::Mutex, "orders").await.unwrap();
        let listed = inspector.list().await.unwrap();
        sees_the_service(inspector.config(), listed, seen, mode, &guard);
        inspector.close().await.unwrap();
        guard.unlock().await.unwrap();
        shutdown(&service).await;
    }
    match LockClient::connect_as_recorded(config(&server, "nobody-here", MODES[0])).await {
        Err(Error::NoLayout(prefix)) => assert_eq!(prefix, "nobody-here"),
        other => panic!("an unused prefix: {other:?}"),
    }
    match Inspector::connect(config(&server, "nobody-here", MODES[0])).await {
        Err(Error::NoLayout(_)) => {}
        other => panic!("an unused prefix: {other:?}"),
    }
    // A record this version cannot read (another version's, or damaged) is refused.
    server.cmd(&[
        "SET",
        &layout_key("damaged"),
        "v12 shards=60000 notification=stream",
    ]);
    server.cmd(&[
        "SET",
        &layout_key("older"),
        "v9 shards=16 notification=stream",
    ]);
    for prefix in ["damaged", "older"] {
        match Inspector::connect(config(&server, prefix, MODES[0])).await {
            Err(Error::LayoutMismatch { .. } | Error::InvalidConfig(_)) => {}
            other => panic!("{prefix}: {other:?}"),
        }
    }
    assert!(server.keys("*nobody-here*").is_empty(), "nothing recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_are_cut_a_write_hold_is_shown_and_a_foreign_value_is_refused() {
    in_both_modes("inspect-limits", |mode, locks, other| async move {
        // More permits held than an inspection lists: every one counted, INSPECT_LIMIT shown.
        let pool = locks.semaphore("wide", 150).unwrap();
        let mut permits = Vec::new();
        for _ in 0..150 {
            permits.push(pool.try_acquire().await.unwrap().expect("a free permit"));
        }
        let theirs = other.semaphore("wide", 150).unwrap();
        let queued = waiting(&other, async move {
            drop(theirs.acquire().await.unwrap());
        })
        .await;
        let seen = report(&locks, LockKind::Semaphore, "wide").await;
        assert_eq!((seen.held, seen.permits), (150, Some(150)), "{mode:?}");
        assert_eq!(seen.holders.len(), INSPECT_LIMIT, "{mode:?}");
        assert_eq!(seen.queued, 1, "{mode:?}");
        assert!(
            seen.waiters[0].waiter.starts_with('r'),
            "{mode:?}: {seen:?}"
        );
        drop(permits);
        support::joined("the semaphore waiter", queued).await;

        // A write hold and its writer's own read hold (a downgrade): both listed.
        let owner = Owner::new();
        let rw = locks.rwlock("down").unwrap().with_owner(&owner);
        let write = rw.write().await.unwrap();
        let read = rw.read().await.unwrap();
        let seen = report(&other, LockKind::RwLock, "down").await;
        assert_eq!(seen.held, 2, "{mode:?}: {seen:?}");
        assert_eq!(seen.holders[0].side, HoldSide::Exclusive);
        assert_eq!(seen.holders[0].fencing_token, write.fencing_token());
        assert!(seen.holders.iter().all(|h| h.owner == owner.id()));
        drop((read, write));

        // A value fredlock did not write where a lock lives: a typed error, nothing changed.
        let prefix = format!("inspect-limits-{}", mode.as_str());
        let key = mutex_keys(&prefix, locks.config().shards, "foreign").hold;
        let _: () = locks
            .redis()
            .set(key.as_str(), "not a lock", None, None, false)
            .await
            .unwrap();
        match locks.inspect(LockKind::Mutex, "foreign").await {
            Err(Error::WrongType { .. }) => {}
            other => panic!("{mode:?}: a foreign value: {other:?}"),
        }
        let kept: Option<String> = locks.redis().get(key.as_str()).await.unwrap();
        assert_eq!(kept.as_deref(), Some("not a lock"), "{mode:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_text_does_not_hide_the_locks() {
    support::init_tracing();
    let server = RedisServer::start();
    let locks = connect(config(&server, "odd", MODES[0])).await;
    // A name with every kind of odd character a name may hold, and a key under the prefix,
    // where a lock would live, whose bytes are not UTF-8 (someone else's: names are text).
    let odd = "a b\n{c}:d:\u{e9}\u{0}";
    let guard = locks.mutex(odd).unwrap().lock().await.unwrap();
    let foreign = b"{odd:3}:mutex:\xff\xfe";
    server.cmd_bytes(&[b"SET", foreign, b"x"]);

    let listed = locks.list().await.unwrap();
    assert_eq!(listed, vec![(LockKind::Mutex, odd.to_owned())]);
    let inspector = Inspector::connect(config(&server, "odd", MODES[0]))
        .await
        .unwrap();
    assert_eq!(inspector.list().await.unwrap(), listed);
    let seen = inspector.inspect(LockKind::Mutex, odd).await.unwrap();
    assert_eq!(seen.name, odd);
    assert_eq!(seen.holders[0].fencing_token, guard.fencing_token());
    inspector.close().await.unwrap();
    let kept = server.cmd_bytes(&[b"GET", foreign]);
    assert_eq!(kept.as_bytes().as_deref(), Some(&b"x"[..]), "left alone");
    guard.unlock().await.unwrap();
    shutdown(&locks).await;
}

/// A waiter whose client is gone (its entry names an inbox nobody reads: no stream in Stream
/// mode, no subscriber in Pub/Sub mode) is listed as not listening, beside a live one; so is a
/// latch's waiting client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_client_is_gone_is_listed_as_not_listening() {
    support::init_tracing();
    let server = RedisServer::start();
    let server = &server;
    in_both_modes_on(server, "inspect-gone", |mode, locks, other| async move {
        let prefix = format!("inspect-gone-{}", mode.as_str());
        let held = locks.mutex("m").unwrap().lock().await.unwrap();
        let theirs = other.mutex("m").unwrap();
        let live = waiting(&other, async move {
            drop(theirs.lock().await.unwrap());
        })
        .await;
        // The entry of a waiter whose process died: its client's inbox tag is read by nobody.
        let queue = support::find_hold(server, &prefix, "mutex.wait", "m").expect("the queue");
        let gone = "wgone gonetag owner-of-a-dead-client 30000 3000";
        server.cmd(&["ZADD", &queue, "1", gone]);
        let seen = report(&locks, LockKind::Mutex, "m").await;
        assert_eq!(seen.queued, 2, "{mode:?}: {seen:?}");
        let listening: Vec<(&str, Option<bool>)> = seen
            .waiters
            .iter()
            .map(|w| (w.client.as_str(), w.listening))
            .collect();
        assert_eq!(
            listening[0],
            ("gonetag", Some(false)),
            "{mode:?}: the head, queued first"
        );
        assert_eq!(listening[1].1, Some(true), "{mode:?}: {seen:?}");
        server.cmd(&["ZREM", &queue, gone]);
        held.unlock().await.unwrap();
        support::joined("the live waiter", live).await;

        let latch = locks.count_down_latch("gate").unwrap();
        assert!(latch.try_set_count(1).await.unwrap());
        let count = support::find_hold(server, &prefix, "latch", "gate").expect("the count");
        let waiting_clients = count.replacen(":latch:", ":latch.wait:", 1);
        server.cmd(&["SADD", &waiting_clients, "gonetag"]);
        let seen = report(&locks, LockKind::Latch, "gate").await;
        assert_eq!(seen.waiters.len(), 1, "{mode:?}: {seen:?}");
        assert_eq!(seen.waiters[0].listening, Some(false), "{mode:?}");
        assert!(latch.delete().await.unwrap());
    })
    .await;
}
