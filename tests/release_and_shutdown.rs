//! The end of a hold (SPEC §5): releases of lost holds, releases retried through a server that
//! does not answer, and the client's shutdown. Every test talks to its own throwaway
//! `redis-server` (see `tests/support`).

mod support;

use std::time::Duration;

use fredlock::{Error, Lease, LockClient, LostCause, NotHeldReason, NotificationMode, Owner};
use support::{
    bounded, connect, eventually, exists, hold_fields, hold_owner, mutex_keys, sharded_config,
    shown, shutdown, RedisServer, HANG, MODES,
};

// ---------------------------------------------------------------------------
// releases of lost holds
// ---------------------------------------------------------------------------

async fn wait_until_free(mutex: &fredlock::Mutex) {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let state = bounded("state", mutex.state()).await.expect("state");
        if !state.locked {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease never expired: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_lost_hold_is_typed_and_leaves_the_new_holder_alone() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-release-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
        let rival = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
        let name = "expiring";
        let keys = mutex_keys(&prefix, 1, name);
        let mutex = locks.mutex(name).expect("mutex");
        let short = mutex
            .clone()
            .with_lease(Lease::fixed(Duration::from_millis(300)))
            .expect("lease");

        // Expired, then taken by another owner: HeldByOther, new hold untouched.
        let old = bounded("lock", short.lock()).await.expect("lock");
        let lost = old.lost();
        wait_until_free(&mutex).await;
        assert_eq!(bounded("lost", lost).await, LostCause::Expired);
        let new = bounded("lock", rival.mutex(name).expect("m").lock())
            .await
            .expect("lock");
        assert!(new.fencing_token() > old.fencing_token());
        let before = bounded("state", mutex.state()).await.expect("state");
        let fields_before = hold_fields(&server, &keys.hold);
        let err = bounded("stale extend", old.extend(Duration::from_secs(5)))
            .await
            .expect_err("stale extend");
        assert_not_held(&err, NotHeldReason::HeldByOther, mode);
        let err = bounded("stale unlock", old.unlock())
            .await
            .expect_err("stale unlock");
        match &err {
            Error::NotHeld { lock, reason } => {
                assert_eq!(lock, name);
                assert_eq!(*reason, NotHeldReason::HeldByOther, "{mode:?}");
            }
            other => panic!("{mode:?}: expected NotHeld, got {other:?}"),
        }
        assert!(!err.is_transient());
        shown(&err);
        let after = bounded("state", mutex.state()).await.expect("state");
        assert_eq!(after.locked, before.locked);
        assert_eq!(after.hold_count, before.hold_count);
        assert_eq!(after.fencing_token, before.fencing_token);
        assert_eq!(after.fencing_token, Some(new.fencing_token()));
        assert_eq!(hold_fields(&server, &keys.hold), fields_before);
        assert_eq!(new.lost_cause(), None);
        bounded("unlock", new.unlock())
            .await
            .expect("new holder unlocks");
        assert!(!bounded("state", mutex.state()).await.expect("state").locked);

        // Expired with nobody holding: Expired.
        let old = bounded("lock", short.lock()).await.expect("lock");
        wait_until_free(&mutex).await;
        let err = bounded("extend", old.extend(Duration::from_secs(5)))
            .await
            .expect_err("extend after expiry");
        assert_not_held(&err, NotHeldReason::Expired, mode);
        let err = bounded("unlock", old.unlock()).await.expect_err("expired");
        assert_not_held(&err, NotHeldReason::Expired, mode);
        assert_eq!(hold_owner(&server, &keys.hold), None);

        // A newer hold of the *same* owner is not released by the stale guard.
        let owner = Owner::new();
        let mine = short.clone().with_owner(&owner);
        let stale = bounded("lock", mine.lock()).await.expect("lock");
        wait_until_free(&mutex).await;
        let fresh = bounded("lock", mutex.clone().with_owner(&owner).lock())
            .await
            .expect("lock");
        assert!(fresh.fencing_token() > stale.fencing_token());
        let err = bounded("stale unlock", stale.unlock())
            .await
            .expect_err("stale hold of the same owner");
        assert_not_held(&err, NotHeldReason::HeldByOther, mode);
        let state = bounded("state", mutex.state()).await.expect("state");
        assert_eq!(state.hold_count, 1);
        assert_eq!(state.fencing_token, Some(fresh.fencing_token()));
        bounded("unlock", fresh.unlock()).await.expect("unlock");

        // Force-unlocked under a guard: Expired; then re-taken by another: HeldByOther.
        let victim = bounded("lock", mutex.lock()).await.expect("lock");
        assert!(bounded("force", mutex.force_unlock()).await.expect("force"));
        let err = bounded("extend", victim.extend(Duration::from_secs(5)))
            .await
            .expect_err("force-unlocked");
        assert_not_held(&err, NotHeldReason::Expired, mode);
        let thief = bounded("lock", rival.mutex(name).expect("m").lock())
            .await
            .expect("lock");
        let err = bounded("unlock", victim.unlock())
            .await
            .expect_err("force-unlocked and re-taken");
        assert_not_held(&err, NotHeldReason::HeldByOther, mode);
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(thief.owner().id())
        );
        bounded("unlock", thief.unlock()).await.expect("unlock");

        shutdown(&locks).await;
        shutdown(&rival).await;
    }
}

// ---------------------------------------------------------------------------
// shutdown
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_fails_waiters_and_releases_holds() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-shutdown-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
        let other = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;

        // Holds of the client being shut down: one re-entered twice, one plain.
        let owner = Owner::new();
        let held = locks.mutex("sd-held").expect("mutex").with_owner(&owner);
        let outer = bounded("lock", held.lock()).await.expect("lock");
        let inner = bounded("re-enter", held.lock()).await.expect("re-enter");
        let plain = locks.mutex("sd-plain").expect("mutex");
        let plain_guard = bounded("lock", plain.lock()).await.expect("lock");
        // A lock held by the other client, and local waiters on it.
        let foreign = other.mutex("sd-foreign").expect("mutex");
        let foreign_guard = bounded("lock", foreign.lock()).await.expect("lock");
        let waiting = locks.mutex("sd-foreign").expect("mutex");
        let waiter_a = tokio::spawn({
            let waiting = waiting.clone();
            async move { waiting.lock().await }
        });
        let waiter_b = tokio::spawn({
            let waiting = waiting.clone();
            async move { waiting.lock_timeout(Duration::from_secs(3600)).await }
        });
        eventually("two waiters", || locks.stats().waiting == 2).await;

        shutdown(&locks).await;

        let a = bounded("waiter a", waiter_a).await.expect("join");
        assert!(matches!(a, Err(Error::Shutdown)), "{mode:?}: {a:?}");
        let b = bounded("waiter b", waiter_b).await.expect("join");
        assert!(matches!(b, Err(Error::Shutdown)), "{mode:?}: {b:?}");
        if let Err(err) = &a {
            shown(err);
        }

        // Every hold of the client was released (re-entered ones completely).
        for name in ["sd-held", "sd-plain"] {
            let keys = mutex_keys(&prefix, 1, name);
            assert_eq!(
                hold_owner(&server, &keys.hold),
                None,
                "{mode:?}: {name} still held"
            );
        }
        assert_eq!(outer.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(inner.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(plain_guard.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(
            bounded("lost", plain_guard.lost()).await,
            LostCause::Shutdown
        );
        // The other client's hold is untouched and nobody got it.
        let foreign_keys = mutex_keys(&prefix, 1, "sd-foreign");
        assert_eq!(
            hold_owner(&server, &foreign_keys.hold).as_deref(),
            Some(foreign_guard.owner().id())
        );

        // Existing and new handles refuse to acquire.
        for result in [
            bounded("lock", held.lock()).await.map(|_| ()),
            bounded("try_lock", plain.try_lock()).await.map(|_| ()),
            bounded("lock_timeout", plain.lock_timeout(Duration::from_secs(5)))
                .await
                .map(|_| ()),
            bounded(
                "new handle",
                locks.mutex("sd-new").expect("names still validate").lock(),
            )
            .await
            .map(|_| ()),
        ] {
            assert!(
                matches!(result, Err(Error::Shutdown)),
                "{mode:?}: {result:?}"
            );
        }
        assert!(!exists(&server, &mutex_keys(&prefix, 1, "sd-new").hold));
        // Shutdown is idempotent; stale guards neither hang nor panic.
        bounded("second shutdown", locks.shutdown())
            .await
            .expect("idempotent");
        let late = bounded("unlock after shutdown", inner.unlock()).await;
        if let Err(err) = &late {
            shown(err);
        }
        drop(outer);
        drop(plain_guard);

        // The other client is unaffected.
        bounded("unlock", foreign_guard.unlock())
            .await
            .expect("unlock");
        let g = bounded("lock", plain_of(&other, "sd-plain").lock())
            .await
            .expect("lock");
        bounded("unlock", g.unlock()).await.expect("unlock");
        shutdown(&other).await;
    }
}

fn plain_of(locks: &LockClient, name: &str) -> fredlock::Mutex {
    locks.mutex(name).expect("mutex")
}

/// After `shutdown()` the client's connections are closed on purpose: every operation that
/// would need them should say so (`Error::Shutdown`, not transient) instead of waiting for the
/// command timeout and reporting a (transient, retryable) `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_after_shutdown_fail_with_shutdown() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-after-sd-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
        let mutex = locks.mutex("after").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        let extended = bounded("lock", locks.mutex("after-2").expect("m").lock())
            .await
            .expect("lock");
        shutdown(&locks).await;
        let keys = mutex_keys(&prefix, 1, "after");
        assert_eq!(
            hold_owner(&server, &keys.hold),
            None,
            "released by shutdown"
        );

        let results = [
            ("state", bounded("state", mutex.state()).await.map(|_| ())),
            (
                "is_locked",
                bounded("is_locked", mutex.is_locked()).await.map(|_| ()),
            ),
            (
                "force_unlock",
                bounded("force_unlock", mutex.force_unlock())
                    .await
                    .map(|_| ()),
            ),
            (
                "extend",
                bounded("extend", extended.extend(Duration::from_secs(5))).await,
            ),
            ("unlock", bounded("unlock", guard.unlock()).await),
        ];
        let wrong: Vec<String> = results
            .iter()
            .filter(|(_, result)| !matches!(result, Err(Error::Shutdown)))
            .map(|(what, result)| format!("{what}: {result:?}"))
            .collect();
        assert!(wrong.is_empty(), "{mode:?} after shutdown: {wrong:#?}");
    }
}

// ---------------------------------------------------------------------------
// releases retried through an unresponsive server
// ---------------------------------------------------------------------------

/// tests that freeze the server (SIGSTOP) past that timeout while a release is under way.
async fn hold_with_short_timeouts(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    name: &str,
) -> (LockClient, fredlock::Mutex, fredlock::MutexGuard) {
    let mut cfg = sharded_config(&server.url(), prefix, mode, 4);
    cfg.command_timeout = Duration::from_millis(300);
    let locks = LockClient::connect(cfg).await.unwrap();
    let mutex = locks
        .mutex(name)
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    (locks, mutex, guard)
}

/// Longer than the command timeout of [`hold_with_short_timeouts`]: the first release attempt
/// made while the server is frozen times out.
const FROZEN: Duration = Duration::from_millis(800);

/// A guard dropped while the server does not answer: the release worker retries the release
/// with the same op id once the server is back, so the lock is free long before its 120 s
/// lease would have ended (the bound below is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_drop_survives_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("dropretry-{}", mode.as_str());
        let (locks, mutex, guard) =
            hold_with_short_timeouts(&server, mode, &prefix, "frozen-release").await;
        server.stop_signal();
        drop(guard);
        tokio::time::sleep(FROZEN).await;
        server.cont_signal();
        bounded("the dropped guard's release retried", async {
            while mutex.is_locked().await.unwrap_or(true) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        locks.shutdown().await.unwrap();
    }
}

/// `unlock()` while the server does not answer retries with the same op id and succeeds once
/// the server is back, instead of reporting a timeout for a lock that then stays held until
/// its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_rides_out_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("unlockretry-{}", mode.as_str());
        let (locks, mutex, guard) =
            hold_with_short_timeouts(&server, mode, &prefix, "frozen-unlock").await;
        server.stop_signal();
        let unlocking = tokio::spawn(guard.unlock());
        tokio::time::sleep(FROZEN).await;
        server.cont_signal();
        bounded("unlock after the server resumed", unlocking)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{mode:?}: unlock failed: {e}"));
        assert!(!mutex.is_locked().await.unwrap(), "{mode:?}: still locked");
        locks.shutdown().await.unwrap();
    }
}

/// `err` is [`Error::NotHeld`] with `reason`.
fn assert_not_held(err: &Error, reason: NotHeldReason, mode: NotificationMode) {
    assert!(
        matches!(err, Error::NotHeld { reason: found, .. } if *found == reason),
        "{mode:?}: {err:?}"
    );
}

/// `unlock()` then `shutdown()` at once, with another client waiting: the release of the
/// contended hold is deferred, and its task may start on another worker thread before
/// shutdown runs (the test body, like `main` under `#[tokio::main]`, is not a worker thread).
/// Shutdown waits for that release instead of closing the connection under it: the waiter is
/// granted the lock now, not when the released hold's 120 s lease runs out. Several rounds:
/// whether the task starts before shutdown's drain is up to the OS scheduler (the failing
/// order, a task that started but had not sent its call when the connection closed, is rare).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_right_after_unlock_lets_the_deferred_release_finish() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("shutdown-deferred-{}", mode.as_str());
        let waiting = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
        let mutex = waiting.mutex("handed").expect("mutex");
        for round in 0..12 {
            let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
            let held = locks
                .mutex("handed")
                .expect("mutex")
                .with_lease(Lease::fixed(Duration::from_secs(120)))
                .expect("lease");
            let guard = bounded("lock", held.lock()).await.expect("lock");
            let waiter = tokio::spawn({
                let mutex = mutex.clone();
                async move { mutex.lock().await }
            });
            // The holder's client hears of the waiter, which makes its release deferred.
            eventually("the holder hears of the waiter", || {
                locks.stats().queued_behind > 0
            })
            .await;
            guard.unlock().await.expect("unlock");
            locks.shutdown().await.expect("shutdown");
            let granted = bounded("the waiter is granted the lock", waiter)
                .await
                .expect("join")
                .unwrap_or_else(|err| panic!("{mode:?} round {round}: {err}"));
            granted.unlock().await.expect("unlock");
        }
        shutdown(&waiting).await;
    }
}
