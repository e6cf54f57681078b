//! Hand-offs that run a lock through every operation against a server (acquisition, a barge
//! refused, a timed-out wait, a wait woken by the release event, extension, watchdog renewal,
//! force-unlock): for tests that prove a deployment (an ACL user, TLS) supports them all.

use std::time::Duration;

use fredlock::{Lease, LockClient};

use super::{bounded, eventually};

/// A lease no hand-off waits out: a prompt hand-off can only come from a release event.
const LONG_LEASE: Duration = Duration::from_secs(120);

/// Holder `a` takes the lock with a long lease; `b` (another client) fails to barge, times out,
/// then waits until woken by the release event; extends and force-unlock are exercised too.
pub async fn mutex_handoff(a: &fredlock::Mutex, b: &fredlock::Mutex, waiting_client: &LockClient) {
    let long = a
        .clone()
        .with_lease(Lease::watchdog(LONG_LEASE))
        .expect("lease");
    let held = bounded("lock", long.lock()).await.expect("lock");
    bounded("extend", held.extend(LONG_LEASE))
        .await
        .expect("extend");
    assert!(bounded("try", b.try_lock()).await.expect("try").is_none());
    let timed_out = bounded("timeout", b.lock_timeout(Duration::from_millis(100)))
        .await
        .expect("lock_timeout");
    assert!(timed_out.is_none());
    let waiter = b.clone();
    let waiting = tokio::spawn(async move { waiter.lock().await });
    eventually("the waiter waits", || waiting_client.stats().waiting == 1).await;
    // Long enough for the fair lock's queue heartbeat (waiter_lease / 3) to run.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let token = held.fencing_token();
    bounded("unlock", held.unlock()).await.expect("unlock");
    let woken = bounded("woken by the event", waiting)
        .await
        .expect("waiter task")
        .expect("lock");
    assert!(woken.fencing_token() > token);
    drop(woken);

    // Watchdog renewals of a short lease.
    let short = a
        .clone()
        .with_lease(Lease::watchdog(Duration::from_millis(300)))
        .expect("l");
    let renewed = bounded("lock", short.lock()).await.expect("lock");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(renewed.lost_cause(), None, "renewals failed");
    assert!(bounded("force", a.force_unlock()).await.expect("force"));
    bounded("lost", renewed.lost()).await;
    assert!(!bounded("state", a.is_locked()).await.expect("state"));
}

/// Writer `a` blocks reader `b`, whose read is woken by the write release; then a writer waits
/// for that read hold.
pub async fn rwlock_handoff(
    a: &fredlock::RwLock,
    b: &fredlock::RwLock,
    waiting_client: &LockClient,
) {
    let long = a
        .clone()
        .with_lease(Lease::watchdog(LONG_LEASE))
        .expect("lease");
    let write = bounded("write", long.write()).await.expect("write");
    assert!(bounded("try_read", b.try_read())
        .await
        .expect("tr")
        .is_none());
    let timed_out = bounded("read_timeout", b.read_timeout(Duration::from_millis(100)))
        .await
        .expect("read_timeout");
    assert!(timed_out.is_none());
    let reader = b
        .clone()
        .with_lease(Lease::watchdog(Duration::from_millis(300)))
        .expect("l");
    let waiting = tokio::spawn(async move { reader.read().await });
    eventually("the reader waits", || waiting_client.stats().waiting == 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    bounded("unlock", write.unlock()).await.expect("unlock");
    let read = bounded("woken reader", waiting)
        .await
        .expect("reader task")
        .expect("read");
    let state = bounded("state", a.state()).await.expect("state");
    assert_eq!((state.write_locked, state.readers), (false, 1));

    let writer = a.clone();
    let waiting = tokio::spawn(async move { writer.write().await });
    // The read hold's watchdog renews it meanwhile (rw_renew).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(read.lost_cause(), None, "read renewals failed");
    bounded("read unlock", read.unlock())
        .await
        .expect("read unlock");
    let write = bounded("woken writer", waiting)
        .await
        .expect("writer task")
        .expect("write");
    drop(write);
    bounded("force", a.force_unlock()).await.expect("force");
}
