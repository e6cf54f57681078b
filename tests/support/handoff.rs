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

/// Takes the lock (one side of it) for one task; the guard, type-erased.
pub type Take = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = fredlock::LockGuard> + Send>>
        + Send
        + Sync,
>;
/// Whether another client got in (a try on the lock, released at once).
pub type Intrudes = std::sync::Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync,
>;

/// Three tasks of `client` take turns on the lock whose hold in Redis is `hold_key`, 20 turns
/// each, through `take` (a handle without an owner), while `first` (taken the same way) holds
/// it: they pass the hold on without a call (`src/engine/cohort.rs`). Asserts that the hold in
/// Redis stays `first`'s, that `intrudes` (another client) never gets in, that every guard's
/// token is above the one before, that some hand-overs happened without a call, and that once
/// the tasks are done the lock is let go in Redis and `rival` (another client) takes it with a
/// token above every one handed out.
pub async fn tasks_hand_the_hold_on(
    server: &super::RedisServer,
    hold_key: &str,
    client: &LockClient,
    first: fredlock::LockGuard,
    take: Take,
    intrudes: Intrudes,
    rival: Take,
) {
    use std::sync::{Arc, Mutex};
    let tokens = Arc::new(Mutex::new(vec![first.fencing_token()]));
    let tasks: Vec<tokio::task::JoinHandle<()>> = (0..3)
        .map(|_| {
            let (take, intrudes, tokens) = (take.clone(), intrudes.clone(), tokens.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    let guard = take().await;
                    assert!(!intrudes().await, "another client got into a held lock");
                    tokens.lock().unwrap().push(guard.fencing_token());
                    guard.unlock().await.unwrap();
                }
            })
        })
        .collect();
    eventually("the tasks wait", || client.stats().waiting == 3).await;
    let redis_owner = super::hold_owner(server, hold_key);
    assert_eq!(redis_owner.as_deref(), Some(first.owner().id()));
    first.unlock().await.unwrap();
    for task in tasks {
        super::joined("a task's turns", task).await;
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 61);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens went back: {tokens:?}"
    );
    assert!(client.stats().handed_locally > 0, "{:?}", client.stats());

    // Once every task is done, the lock is let go in Redis (a deferred release at the latest),
    // and the next take goes above every token handed out.
    super::eventually_async("the lock is let go", || async {
        super::hold_owner(server, hold_key).is_none()
    })
    .await;
    let next = bounded("the other client takes the lock", rival()).await;
    let last = tokens.last().copied().unwrap_or_default();
    assert!(next.fencing_token() > last);
    next.unlock().await.unwrap();
}
