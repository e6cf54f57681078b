//! A server that misbehaves under a working client (SPEC §5): its script cache flushed, its
//! memory full (OOM), or no answer for longer than the command timeout. Every test talks to its
//! own throwaway `redis-server` (see `tests/support`).

mod support;

use std::time::Duration;

use fredlock::{Error, Lease, LockClient, NotificationMode, Owner};
use support::{
    bounded, connect, eventually, fence_value, hold_fields, hold_owner, info_field, mutex_keys,
    queued_waiters, sharded_config, shown, shutdown, snapshot, RedisServer, Resp, MODES,
};

// ---------------------------------------------------------------------------
// SCRIPT FLUSH
// ---------------------------------------------------------------------------

fn flush_scripts(server: &RedisServer) {
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
    assert_eq!(
        info_field(server, "memory", "number_of_cached_scripts"),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_transparent() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-flush-{}", mode.as_str());
        let mut cfg = sharded_config(&server.url(), &prefix, mode, 1);
        cfg.watchdog_lease = Duration::from_secs(6);
        let locks = connect(cfg.clone()).await;
        let other = connect(cfg).await;
        let mutex = locks.mutex("flushed").expect("mutex");
        let owner = Owner::new();
        let reentrant = mutex.clone().with_owner(&owner);

        let mut last_token = 0;
        for round in 0..10 {
            flush_scripts(&server);
            let guard = bounded("lock", mutex.lock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} round {round} lock: {e}"));
            assert!(guard.fencing_token() > last_token);
            last_token = guard.fencing_token();
            assert_ne!(
                info_field(&server, "memory", "number_of_cached_scripts"),
                "0",
                "the script was loaded again"
            );
            flush_scripts(&server);
            let state = bounded("state", mutex.state()).await.expect("state");
            assert_eq!(state.fencing_token, Some(last_token));
            flush_scripts(&server);
            assert!(
                bounded("try_lock", other.mutex("flushed").expect("m").try_lock())
                    .await
                    .expect("try_lock")
                    .is_none()
            );
            flush_scripts(&server);
            bounded("extend", guard.extend(Duration::from_secs(5)))
                .await
                .expect("extend");
            flush_scripts(&server);
            bounded("unlock", guard.unlock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} round {round} unlock: {e}"));
            flush_scripts(&server);
            let a = bounded("reenter", reentrant.lock()).await.expect("lock");
            flush_scripts(&server);
            let b = bounded("reenter", reentrant.lock())
                .await
                .expect("re-enter");
            assert_eq!(a.fencing_token(), b.fencing_token());
            last_token = a.fencing_token();
            flush_scripts(&server);
            bounded("unlock", b.unlock()).await.expect("unlock inner");
            flush_scripts(&server);
            assert_eq!(
                bounded("state", mutex.state())
                    .await
                    .expect("state")
                    .hold_count,
                1
            );
            flush_scripts(&server);
            bounded("unlock", a.unlock()).await.expect("unlock outer");
            flush_scripts(&server);
            assert!(bounded("force_unlock", mutex.force_unlock())
                .await
                .map(|removed| !removed)
                .expect("force_unlock"));
        }

        // A holder holds (renewed by the watchdog) and a waiter waits while scripts vanish.
        let holder = bounded("lock", mutex.lock()).await.expect("lock");
        let waiting = other.mutex("flushed").expect("mutex");
        let waiter = tokio::spawn(async move { waiting.lock().await });
        eventually("waiter registered", || other.stats().waiting == 1).await;
        let keys = mutex_keys(&prefix, 1, "flushed");
        // Several renewal periods (lease 6 s, renewed every 2 s) with the cache flushed
        // every half second: the hold must survive them.
        // (A renewal may load its script again between the flush and any check of the
        // cache, so this loop only flushes.)
        for _ in 0..14 {
            assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(holder.lost_cause(), None, "{mode:?}: renewal broke");
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(holder.owner().id())
        );
        assert!(!waiter.is_finished(), "{mode:?}: waiter got a held lock");
        let held_token = holder.fencing_token();
        assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
        bounded("unlock", holder.unlock()).await.expect("unlock");
        let next = bounded("waiter acquires", waiter)
            .await
            .expect("join")
            .expect("waiter lock");
        assert!(next.fencing_token() > held_token);
        assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
        bounded("unlock", next.unlock()).await.expect("unlock");
        shutdown(&locks).await;
        shutdown(&other).await;
    }
}

// ---------------------------------------------------------------------------
// OOM
// ---------------------------------------------------------------------------

/// Fills memory with a 4 MiB value, then lowers `maxmemory` 1 MiB below the memory in use
/// (policy noeviction), so that every write that needs memory is refused with OOM — with a wide
/// margin, whatever client buffers come and go.
fn fill_until_oom(server: &RedisServer, filler: &str) {
    let chunk = "x".repeat(256 * 1024);
    let mut conn = server.connect().expect("connect");
    for _ in 0..16 {
        let reply = conn.cmd(&["APPEND", filler, &chunk]).expect("append");
        assert!(!reply.is_error(), "APPEND failed: {reply:?}");
    }
    let used: u64 = info_field(server, "memory", "used_memory")
        .parse()
        .expect("used_memory");
    let limit = (used - 1024 * 1024).to_string();
    assert_eq!(
        conn.cmd(&["CONFIG", "SET", "maxmemory", &limit])
            .expect("config set"),
        Resp::Simple("OK".into())
    );
    // Writes that need memory fail now.
    for probe in [
        conn.cmd(&["SET", "oom-probe", "1"]).expect("set"),
        conn.cmd(&["APPEND", filler, "x"]).expect("append"),
    ] {
        assert!(
            probe.error_message().is_some_and(|e| e.starts_with("OOM")),
            "{probe:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_typed_and_writes_nothing() {
    support::init_tracing();
    for mode in MODES {
        let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
        let prefix = format!("fail-oom-{}", mode.as_str());
        // Every unlock() below is sent before it returns: the rival queued behind some holds,
        // whose releases would be deferred otherwise, and a deferred release reports only
        // what the client knows (`Config::defer_release`).
        let mut config = sharded_config(&server.url(), &prefix, mode, 1);
        config.defer_release = false;
        let locks = connect(config).await;
        let rival = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;

        // Before OOM: a re-entered hold, a busy lock, a plain hold, and a free lock that took
        // the shard's last token (one shard: every lock of the prefix shares the fence key).
        // Their waiters gave up and left the queues. (A release that grants the lock under OOM
        // is tested at the Lua level, tests/scripts/: it fails whole, before any event.)
        let held = locks.mutex("oom-held").expect("mutex");
        let held_owner = Owner::new();
        let held_guard = bounded("lock", held.clone().with_owner(&held_owner).lock())
            .await
            .expect("lock");
        let held_inner = bounded("re-enter", held.clone().with_owner(&held_owner).lock())
            .await
            .expect("re-enter");
        let held_keys = mutex_keys(&prefix, 1, "oom-held");
        rival_gives_up(&server, &rival, "oom-held", &held_keys.hold).await;
        let held_before = hold_fields(&server, &held_keys.hold);

        let busy = rival.mutex("oom-busy").expect("mutex");
        let busy_guard = bounded("lock", busy.lock()).await.expect("lock");

        // A plain (not re-entered) hold: its release frees the lock under OOM.
        let single = locks.mutex("oom-single").expect("mutex");
        let single_guard = bounded("lock", single.lock()).await.expect("lock");
        let single_keys = mutex_keys(&prefix, 1, "oom-single");
        rival_gives_up(&server, &rival, "oom-single", &single_keys.hold).await;
        let single_before = hold_fields(&server, &single_keys.hold);
        // On a single Redis one event stream and counter serve every lock of the prefix.
        let events_key = format!("{{{prefix}:events}}");
        let seq_key = format!("{{{prefix}:events}}:seq");
        let seq_before = server.cmd(&["GET", &seq_key]).as_str();

        let fresh = locks.mutex("oom-fresh").expect("mutex");
        let fresh_keys = mutex_keys(&prefix, 1, "oom-fresh");
        let g = bounded("lock", fresh.lock()).await.expect("lock");
        let fresh_token = g.fencing_token();
        for earlier in [
            held_guard.fencing_token(),
            busy_guard.fencing_token(),
            single_guard.fencing_token(),
        ] {
            assert!(
                fresh_token > earlier,
                "{mode:?}: {fresh_token} after {earlier}"
            );
        }
        bounded("unlock", g.unlock()).await.expect("unlock");
        assert_eq!(fence_value(&server, &fresh_keys.fence).0, fresh_token);
        let fence_before = snapshot(&server, &fresh_keys.fence);

        // Fill memory.
        fill_until_oom(&server, "oom-filler");

        // Acquisitions that must write fail with OutOfMemory and leave nothing behind.
        for attempt in 0..3 {
            let err = bounded("lock", fresh.lock())
                .await
                .expect_err("lock under OOM");
            assert!(
                matches!(err, Error::OutOfMemory(_)),
                "{mode:?} attempt {attempt}: {err:?}"
            );
            assert!(err.is_transient());
            shown(&err);
            let err = bounded("try_lock", fresh.try_lock())
                .await
                .expect_err("try_lock under OOM");
            assert!(matches!(err, Error::OutOfMemory(_)), "{mode:?}: {err:?}");
        }
        assert_eq!(hold_owner(&server, &fresh_keys.hold), None);
        assert_eq!(
            snapshot(&server, &fresh_keys.fence),
            fence_before,
            "{mode:?}: a failed attempt took a token"
        );
        assert!(queued_waiters(&server, &fresh_keys.hold).is_empty());
        assert_eq!(
            locks.stats().held,
            2,
            "{mode:?}: only oom-held/single are held"
        );
        assert_eq!(locks.stats().waiting, 0);

        // A busy lock: try_lock only reads (None), lock() must write its queue line.
        let busy_keys = mutex_keys(&prefix, 1, "oom-busy");
        let other_busy = locks.mutex("oom-busy").expect("mutex");
        match bounded("try_lock busy", other_busy.try_lock()).await {
            Ok(None) | Err(Error::OutOfMemory(_)) => {}
            other => panic!("{mode:?}: try_lock of a busy lock under OOM: {other:?}"),
        }
        match bounded("lock busy", other_busy.lock()).await {
            Err(Error::OutOfMemory(_)) => {}
            other => panic!("{mode:?}: lock of a busy lock under OOM: {other:?}"),
        }
        assert_eq!(
            hold_owner(&server, &busy_keys.hold).as_deref(),
            Some(busy_guard.owner().id())
        );
        assert!(queued_waiters(&server, &busy_keys.hold).is_empty());
        let state = bounded("state", held.state()).await.expect("reads work");
        assert_eq!(state.hold_count, 2);

        // The hold taken before OOM: each release either happens completely or not at all.
        let inner = bounded("unlock inner", held_inner.unlock()).await;
        let after_inner = hold_fields(&server, &held_keys.hold);
        match &inner {
            Ok(()) => assert_eq!(
                after_inner,
                vec![
                    held_before[0].clone(),
                    Some("1".into()),
                    held_before[2].clone()
                ],
                "{mode:?}"
            ),
            Err(Error::OutOfMemory(_)) => assert_eq!(after_inner, held_before, "{mode:?}"),
            Err(other) => panic!("{mode:?}: inner unlock under OOM: {other:?}"),
        }
        let outer = bounded("unlock outer", held_guard.unlock()).await;
        let after_outer = hold_fields(&server, &held_keys.hold);
        match &outer {
            Ok(()) => {
                assert_eq!(hold_owner(&server, &held_keys.hold), None, "{mode:?}");
            }
            Err(Error::OutOfMemory(_)) => {
                assert_eq!(after_outer, after_inner, "{mode:?}");
            }
            Err(other) => panic!("{mode:?}: outer unlock under OOM: {other:?}"),
        }

        // The plain hold: freed completely (nobody queued: no event) or left intact.
        let stream_len = |server: &RedisServer| match mode {
            NotificationMode::Stream => server.cmd(&["XLEN", &events_key]).as_int(),
            _ => 0,
        };
        let events_before = stream_len(&server);
        let released = bounded("unlock single", single_guard.unlock()).await;
        let seq_after = server.cmd(&["GET", &seq_key]).as_str();
        match &released {
            Ok(()) => {
                assert_eq!(hold_owner(&server, &single_keys.hold), None, "{mode:?}");
                assert_eq!(seq_after, seq_before, "{mode:?}: an event nobody waits for");
                assert_eq!(stream_len(&server), events_before, "{mode:?}: an XADD");
            }
            Err(Error::OutOfMemory(_)) => {
                assert_eq!(hold_fields(&server, &single_keys.hold), single_before);
                assert_eq!(seq_after, seq_before, "{mode:?}: half-written event");
                assert_eq!(stream_len(&server), events_before);
            }
            Err(other) => panic!("{mode:?}: unlock under OOM: {other:?}"),
        }
        eprintln!("[observed] {mode:?} OOM releases: re-entered {inner:?} / {outer:?}, plain {released:?}");

        // Free the memory: everything works again, and the failed attempts used no token.
        server.cmd(&["DEL", "oom-filler"]);
        server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        // (No release under OOM hands a lock over: the shard issued no token meanwhile.)
        assert_eq!(
            snapshot(&server, &fresh_keys.fence),
            fence_before,
            "{mode:?}: a release under OOM took a token"
        );
        let g = bounded("lock", fresh.lock()).await.expect("lock after OOM");
        assert!(
            g.fencing_token() > fresh_token,
            "{mode:?}: token {} after {fresh_token}",
            g.fencing_token()
        );
        // Taken from the fence key, or (its tombstone still there) from the lock's own hash.
        let fence_after = fence_value(&server, &fresh_keys.fence).0;
        assert!(
            fence_after == g.fencing_token() || fence_after == fresh_token,
            "{mode:?}: fence {fence_after}, token {}",
            g.fencing_token()
        );
        bounded("unlock", g.unlock()).await.expect("unlock");
        bounded("unlock busy", busy_guard.unlock())
            .await
            .expect("unlock");
        let g = bounded("lock busy", other_busy.lock()).await.expect("lock");
        bounded("unlock", g.unlock()).await.expect("unlock");
        shutdown(&locks).await;
        shutdown(&rival).await;
    }
}

// ---------------------------------------------------------------------------
// an unresponsive server
// ---------------------------------------------------------------------------

/// A server that stops answering (SIGSTOP, longer than the command timeout) while a task
/// waits: the waiting `lock()` repeats its timed-out attempt with the same op id instead of
/// failing, and once the server answers again it holds the lock exactly once (the timed-out
/// call, executed by the server after it resumed, is answered by the retry, not applied
/// twice). `try_lock` never retries: it reports the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_acquisitions_retry_through_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("retry-{}", mode.as_str());
        let holder = LockClient::connect(sharded_config(&server.url(), &prefix, mode, 4))
            .await
            .unwrap();
        let mut waiting_config = sharded_config(&server.url(), &prefix, mode, 4);
        waiting_config.command_timeout = Duration::from_millis(300);
        let waiter = LockClient::connect(waiting_config).await.unwrap();

        let name = "frozen-job";
        // A short fixed lease: the waiter's next attempt comes when it runs out, i.e. while
        // the server is frozen.
        let held = holder
            .mutex(name)
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_millis(500)))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let mutex = waiter.mutex(name).unwrap();
        let task = tokio::spawn(async move { mutex.lock().await });
        eventually("waiter registered", || waiter.stats().waiting == 1).await;

        server.stop_signal();
        eventually("a retried attempt", || waiter.stats().retried_attempts > 0).await;
        // try_lock on the frozen server: one attempt, a typed transient error, no retry.
        let try_result = waiter.mutex("other").unwrap().try_lock().await;
        server.cont_signal();
        match try_result {
            Err(error) => assert!(error.is_transient(), "{mode:?}: {error}"),
            Ok(_) => panic!("{mode:?}: try_lock answered by a frozen server"),
        }

        let guard = bounded("lock after the server resumed", task)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{mode:?}: waiting lock() failed: {e}"));
        let state = waiter.mutex(name).unwrap().state().await.unwrap();
        assert_eq!(
            state.hold_count, 1,
            "{mode:?}: the retried attempt was applied twice"
        );
        assert_eq!(state.fencing_token, Some(guard.fencing_token()));
        guard.unlock().await.unwrap();
        assert!(
            !waiter.mutex(name).unwrap().is_locked().await.unwrap(),
            "{mode:?}: a re-entry left behind after the only unlock"
        );
        // The holder's hold expired meanwhile: its release is typed, not a success.
        assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
        holder.shutdown().await.unwrap();
        waiter.shutdown().await.unwrap();
    }
}

/// A waiter of `rival` on the held lock `name` times out, and leaves its queue.
async fn rival_gives_up(server: &RedisServer, rival: &LockClient, name: &str, hold: &str) {
    let mutex = rival.mutex(name).expect("mutex");
    let acquired = bounded(
        "lock_timeout",
        mutex.lock_timeout(Duration::from_millis(100)),
    )
    .await
    .expect("lock_timeout");
    assert!(acquired.is_none(), "{name}: acquired a held lock");
    assert!(
        queued_waiters(server, hold).is_empty(),
        "{name}: the waiter left"
    );
}
