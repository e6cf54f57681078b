//! MultiLock against a real redis-server, in both notification modes: every member held under
//! one guard, all or nothing, one global order (no deadlock between multi-locks that list the
//! same locks in opposite orders), cancellation, the lost signal, and refused member sets.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::{Error, Lease, LockClient, LockGuard, MultiLock, MultiMember, NotificationMode};
use support::{
    bounded, connect, eventually_async, in_both_modes, init_tracing, shutdown, RedisServer,
};

/// A multi-lock over a mutex, a fair mutex and the write side of a read-write lock.
fn three(locks: &LockClient) -> MultiLock {
    MultiLock::new([
        MultiMember::from(locks.mutex("m").unwrap()),
        MultiMember::from(locks.fair_mutex("f").unwrap()),
        MultiMember::write(locks.rwlock("rw").unwrap()),
    ])
    .unwrap()
}

/// The names of the members of [`three`].
const THREE: [&str; 3] = ["m", "f", "rw"];

/// Whether `other` (another client) finds the member `name` of [`three`] held.
async fn is_held(other: &LockClient, name: &str) -> bool {
    match name {
        "m" => other.mutex(name).unwrap().is_locked().await.unwrap(),
        "f" => other.fair_mutex(name).unwrap().is_locked().await.unwrap(),
        _ => {
            let state = other.rwlock(name).unwrap().state().await.unwrap();
            state.remaining.is_some()
        }
    }
}

/// Whether any member of [`three`] is held, seen by `other`.
async fn any_of_three_held(other: &LockClient) -> bool {
    for name in THREE {
        if is_held(other, name).await {
            return true;
        }
    }
    false
}

/// `other` takes the member `name` of [`three`] (a read hold on the read-write lock).
async fn take(other: &LockClient, name: &str) -> LockGuard {
    match name {
        "m" => other.mutex(name).unwrap().lock().await.unwrap().into(),
        "f" => other.fair_mutex(name).unwrap().lock().await.unwrap().into(),
        _ => other.rwlock(name).unwrap().read().await.unwrap().into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_every_member_under_one_guard_and_releases_them_together() {
    in_both_modes("multi-all", |mode, locks, other| async move {
        let all = three(&locks);
        let names: Vec<&str> = all.members().iter().map(MultiMember::name).collect();
        assert_eq!(names.len(), 3, "{mode:?}");

        let guard = bounded("multi-lock", all.lock()).await.unwrap();
        let held: Vec<&str> = guard.guards().iter().map(|g| g.name()).collect();
        assert_eq!(held, names, "{mode:?}: the guards come in lock order");
        assert!(guard.guards().iter().all(|g| g.fencing_token() > 0));
        assert_eq!(guard.lost_cause(), None);
        assert!(guard.lease_deadline() > tokio::time::Instant::now());
        // Each member is held, as another client sees it.
        for name in THREE {
            assert!(is_held(&other, name).await, "{mode:?}: {name} is held");
        }
        guard.extend(Duration::from_secs(20)).await.unwrap();
        let tokens: Vec<u64> = guard.guards().iter().map(|g| g.fencing_token()).collect();

        guard.unlock().await.unwrap();
        assert!(
            !any_of_three_held(&other).await,
            "{mode:?}: unlock released every member"
        );
        let again = bounded("multi-lock again", all.lock()).await.unwrap();
        for (guard, before) in again.guards().iter().zip(tokens) {
            assert!(guard.fencing_token() > before, "{mode:?}: tokens only grow");
        }
        drop(again);
        eventually_async("the dropped guard released every member", || {
            let other = other.clone();
            async move { !any_of_three_held(&other).await }
        })
        .await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_member_leaves_nothing_held() {
    in_both_modes("multi-busy", |mode, locks, other| async move {
        let all = three(&locks);
        // The member taken last in lock order is held elsewhere, so the others were taken first.
        let last = all.members().last().unwrap().name().to_owned();
        let blocker = take(&other, &last).await;

        assert!(all.try_lock().await.unwrap().is_none(), "{mode:?}");
        let timed = all.lock_timeout(Duration::from_millis(200)).await.unwrap();
        assert!(timed.is_none(), "{mode:?}");
        // The members taken before were given back: their releases were sent at once.
        for member in all.members().iter().filter(|m| m.name() != last) {
            let name = member.name();
            eventually_async(&format!("{mode:?}: {name} is given back"), || {
                let other = other.clone();
                async move { !is_held(&other, name).await }
            })
            .await;
        }

        // Once the blocker goes, a waiting acquisition gets every member.
        let waiting = {
            let all = all.clone();
            tokio::spawn(async move { all.lock().await })
        };
        blocker.unlock().await.unwrap();
        let guard = bounded("multi-lock after the release", waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(guard.guards().len(), 3);
        guard.unlock().await.unwrap();
    })
    .await;
}

/// Two clients loop over multi-locks that list the same two locks in opposite orders: both
/// finish (one global order, no deadlock), and no two holds of one lock overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_do_not_deadlock() {
    in_both_modes("multi-order", |mode, a, b| async move {
        let inside = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let round = |locks: LockClient, names: [&'static str; 2]| {
            let inside = inside.clone();
            tokio::spawn(async move {
                let both = MultiLock::new(names.map(|n| locks.mutex(n).unwrap())).unwrap();
                for _ in 0..25 {
                    let guard = both.lock().await.unwrap();
                    for flag in inside.iter() {
                        assert!(!flag.swap(true, Ordering::SeqCst), "two holders at once");
                    }
                    tokio::task::yield_now().await;
                    for flag in inside.iter() {
                        flag.store(false, Ordering::SeqCst);
                    }
                    guard.unlock().await.unwrap();
                }
            })
        };
        let forward = round(a.clone(), ["x", "y"]);
        let backward = round(b.clone(), ["y", "x"]);
        bounded(&format!("{mode:?}: forward rounds"), forward)
            .await
            .unwrap();
        bounded(&format!("{mode:?}: backward rounds"), backward)
            .await
            .unwrap();
    })
    .await;
}

/// Dropping a pending acquisition releases the members it took while it waited for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_releases_what_it_took() {
    in_both_modes("multi-cancel", |mode, locks, other| async move {
        let both = MultiLock::new([locks.mutex("p").unwrap(), locks.mutex("q").unwrap()]).unwrap();
        let [first, second] = [0, 1].map(|i| both.members()[i].name().to_owned());
        let blocker = other.mutex(&second).unwrap().lock().await.unwrap();

        let pending = {
            let both = both.clone();
            tokio::spawn(async move { both.lock().await })
        };
        let probe = other.mutex(&first).unwrap();
        eventually_async(&format!("{mode:?}: the first member is taken"), || {
            let probe = probe.clone();
            async move { probe.is_locked().await.unwrap() }
        })
        .await;
        pending.abort();
        assert!(pending.await.unwrap_err().is_cancelled());
        eventually_async(&format!("{mode:?}: the first member is released"), || {
            let probe = probe.clone();
            async move { !probe.is_locked().await.unwrap() }
        })
        .await;
        // The blocker's release may be deferred (the cancelled acquisition had queued behind
        // it): the multi-lock is had once it is sent.
        blocker.unlock().await.unwrap();
        let guard = bounded("the multi-lock after the blocker", both.lock())
            .await
            .unwrap();
        guard.unlock().await.unwrap();
    })
    .await;
}

/// A member forced open by another client makes the multi-lock's `lost()` resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_member_is_reported() {
    in_both_modes("multi-lost", |mode, locks, other| async move {
        let lease = Lease::watchdog(Duration::from_secs(10));
        let both = MultiLock::new([
            locks.mutex("s").unwrap().with_lease(lease).unwrap(),
            locks.mutex("t").unwrap().with_lease(lease).unwrap(),
        ])
        .unwrap();
        let guard = both.lock().await.unwrap();
        let lost = guard.lost();
        assert!(other.mutex("t").unwrap().force_unlock().await.unwrap());
        let cause = bounded("the multi-lock hears a member was lost", lost).await;
        assert_eq!(guard.lost_cause(), Some(cause), "{mode:?}");
        let lost_member = guard.guards().iter().find(|g| g.lost_cause().is_some());
        assert_eq!(lost_member.map(|g| g.name()), Some("t"), "{mode:?}");
        // The release reports the member it no longer held, and still frees the other one.
        let err = guard.unlock().await.unwrap_err();
        assert!(
            matches!(err, Error::NotHeld { ref lock, .. } if lock == "t"),
            "{err}"
        );
        assert!(
            !other.mutex("s").unwrap().is_locked().await.unwrap(),
            "{mode:?}"
        );
    })
    .await;
}

/// Readers may share their members: two multi-locks that read the same lock hold it together,
/// and a writer waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_members_are_shared() {
    in_both_modes("multi-read", |mode, locks, other| async move {
        let reading = |locks: &LockClient, own: &str| {
            MultiLock::new([
                MultiMember::read(locks.rwlock("shared").unwrap()),
                MultiMember::from(locks.mutex(own).unwrap()),
            ])
            .unwrap()
        };
        let one = reading(&locks, "one").lock().await.unwrap();
        let two = bounded("a second reader", reading(&other, "two").lock())
            .await
            .unwrap();
        let writer = locks.rwlock("shared").unwrap();
        assert!(writer.try_write().await.unwrap().is_none(), "{mode:?}");
        one.unlock().await.unwrap();
        assert!(writer.try_write().await.unwrap().is_none(), "{mode:?}");
        two.unlock().await.unwrap();
        let write = bounded("the writer after both", writer.write())
            .await
            .unwrap();
        write.unlock().await.unwrap();
    })
    .await;
}

/// No lock, or one lock twice (also both sides of one read-write lock), is refused before
/// anything reaches Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_member_sets_are_refused() {
    init_tracing();
    let server = RedisServer::start();
    let locks = connect(support::config(
        &server,
        "multi-invalid",
        NotificationMode::Stream,
    ))
    .await;
    let none: [MultiMember; 0] = [];
    let twice = [locks.mutex("a").unwrap(), locks.mutex("a").unwrap()];
    let rw = locks.rwlock("b").unwrap();
    let both_sides = [MultiMember::read(rw.clone()), MultiMember::write(rw)];
    for (what, result) in [
        ("no lock", MultiLock::new(none)),
        ("one mutex twice", MultiLock::new(twice)),
        (
            "both sides of a read-write lock",
            MultiLock::new(both_sides),
        ),
    ] {
        match result {
            Err(Error::InvalidMultiLock(_)) => {}
            other => panic!("{what}: expected InvalidMultiLock, got {other:?}"),
        }
    }
    // A mutex and a fair mutex of one name are two locks.
    let pair = MultiLock::new([
        MultiMember::from(locks.mutex("c").unwrap()),
        MultiMember::from(locks.fair_mutex("c").unwrap()),
    ]);
    assert_eq!(pair.unwrap().members().len(), 2);
    shutdown(&locks).await;
}
