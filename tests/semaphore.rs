//! Semaphore against a real redis-server, in both notification modes: the permit bound across
//! clients, FIFO grants by push, fencing tokens, a permit whose holder died, cancellation, a
//! force release, and refused counts.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fredlock::{Error, Lease, LockClient, NotHeldReason, PermitGuard, Semaphore, MIN_LEASE};
use support::{bounded, eventually, in_both_modes, joined, poll_once};

/// A task of `locks` waiting for a permit of `name` (count `permits`), once the client's
/// stats show it queued in Redis.
async fn queued(
    locks: &LockClient,
    name: &str,
    permits: u32,
) -> tokio::task::JoinHandle<PermitGuard> {
    let before = locks.stats().queued_in_redis;
    let semaphore = locks.semaphore(name, permits).unwrap();
    let task = tokio::spawn(async move { semaphore.acquire().await.unwrap() });
    eventually("the waiter queued in Redis", || {
        locks.stats().queued_in_redis > before
    })
    .await;
    task
}

/// `count` permits of `semaphore`, taken by one attempt each.
async fn take(semaphore: &Semaphore, count: usize) -> Vec<PermitGuard> {
    let mut guards = Vec::new();
    for _ in 0..count {
        let guard = semaphore.try_acquire().await.unwrap();
        guards.push(guard.expect("a free permit"));
    }
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_holders_than_permits() {
    in_both_modes("sem-bound", |mode, locks, other| async move {
        let semaphore = locks.semaphore("pool", 3).unwrap();
        let guards = take(&semaphore, 3).await;
        let theirs = other.semaphore("pool", 3).unwrap();
        assert!(
            theirs.try_acquire().await.unwrap().is_none(),
            "{mode:?}: every permit is held"
        );
        let state = semaphore.state().await.unwrap();
        assert_eq!((state.held, state.available), (3, 0), "{mode:?}");
        assert!(state.remaining.is_some());
        let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{mode:?}: each permit draws a greater token: {tokens:?}"
        );
        drop(guards);

        // 12 tasks over two clients: never more than 3 inside at once, every one gets in.
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for client in [&locks, &other] {
            for _ in 0..6 {
                let semaphore = client.semaphore("pool", 3).unwrap();
                let (inside, most) = (inside.clone(), most.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..3 {
                        let guard = semaphore.acquire().await.unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        guard.unlock().await.unwrap();
                    }
                }));
            }
        }
        for task in tasks {
            joined("a permit user", task).await;
        }
        assert!(most.load(Ordering::SeqCst) <= 3, "{mode:?}: bound kept");
        eventually_free(&semaphore).await;
    })
    .await;
}

/// Waits until no permit of `semaphore` is held (the last releases may still be in flight).
async fn eventually_free(semaphore: &Semaphore) {
    for _ in 0..200 {
        if semaphore.state().await.unwrap().held == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("permits still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_goes_to_the_head_of_the_queue_by_push() {
    in_both_modes("sem-fifo", |mode, locks, other| async move {
        let semaphore = locks.semaphore("slots", 2).unwrap();
        let mut guards = take(&semaphore, 2).await;
        let mut first = queued(&other, "slots", 2).await;
        let mut second = queued(&locks, "slots", 2).await;
        let mut third = queued(&other, "slots", 2).await;
        poll_once("the first waiter", &mut first).await;

        let wakeups = other.stats().wakeups;
        let held = guards.pop().unwrap();
        let held_token = held.fencing_token();
        held.unlock().await.unwrap();
        let granted = joined("the head of the queue", first).await;
        assert!(other.stats().wakeups > wakeups, "{mode:?}: woken by push");
        assert!(granted.fencing_token() > held_token, "{mode:?}");
        poll_once("the second waiter, behind", &mut second).await;
        poll_once("the third waiter, behind", &mut third).await;

        drop(granted);
        let granted = joined("the second in line", second).await;
        poll_once("the third waiter, still behind", &mut third).await;
        drop(guards);
        let last = joined("the third in line", third).await;
        assert!(last.fencing_token() > granted.fencing_token(), "{mode:?}");
        drop((granted, last));
        eventually_free(&semaphore).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_whose_holder_vanished_frees_at_its_lease_end() {
    in_both_modes("sem-lapse", |mode, locks, other| async move {
        let fixed = locks
            .semaphore("lapse", 1)
            .unwrap()
            .with_lease(Lease::fixed(MIN_LEASE))
            .unwrap();
        let guard = fixed.try_acquire().await.unwrap().expect("free");
        let lost = guard.fencing_token();
        // Its process "died": no release is ever sent.
        std::mem::forget(guard);
        let waiter = other.semaphore("lapse", 1).unwrap();
        let granted = bounded("the permit after the lease end", waiter.acquire())
            .await
            .unwrap();
        assert!(granted.fencing_token() > lost, "{mode:?}");
        granted.unlock().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_passes_its_turn_on() {
    in_both_modes("sem-cancel", |mode, locks, other| async move {
        let semaphore = locks.semaphore("one", 1).unwrap();
        let guard = semaphore.try_acquire().await.unwrap().expect("free");
        let theirs = other.semaphore("one", 1).unwrap();
        assert!(
            theirs
                .acquire_timeout(Duration::from_millis(50))
                .await
                .unwrap()
                .is_none(),
            "{mode:?}: timed out"
        );
        let gone = queued(&other, "one", 1).await;
        let mut next = queued(&locks, "one", 1).await;
        gone.abort();
        let _ = gone.await;
        poll_once("the waiter behind", &mut next).await;
        guard.unlock().await.unwrap();
        let granted = joined("the waiter behind the cancelled one", next).await;
        granted.unlock().await.unwrap();
        eventually_free(&semaphore).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_takes_every_permit_back_and_serves_the_queue() {
    in_both_modes("sem-force", |mode, locks, other| async move {
        let semaphore = locks.semaphore("forced", 2).unwrap();
        let guards = take(&semaphore, 2).await;
        let waiter = queued(&other, "forced", 2).await;
        assert!(semaphore.force_release().await.unwrap(), "{mode:?}");
        let granted = joined("the waiter after a force release", waiter).await;
        for guard in guards {
            match guard.unlock().await {
                Err(Error::NotHeld {
                    reason: NotHeldReason::Expired,
                    ..
                }) => {}
                other => panic!("{mode:?}: a permit taken back: {other:?}"),
            }
        }
        assert_eq!(semaphore.state().await.unwrap().held, 1);
        granted.unlock().await.unwrap();
        assert!(
            !semaphore.force_release().await.unwrap(),
            "{mode:?}: none left"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_permit_count_is_refused_while_in_use() {
    in_both_modes("sem-count", |mode, locks, other| async move {
        for permits in [0, Semaphore::MAX_PERMITS + 1] {
            match locks.semaphore("bad", permits) {
                Err(Error::InvalidPermits(n)) => assert_eq!(n, u64::from(permits)),
                other => panic!("{mode:?}: {permits} permits: {other:?}"),
            }
        }
        assert!(matches!(locks.semaphore("", 1), Err(Error::InvalidName(_))));

        let two = locks.semaphore("sized", 2).unwrap();
        let guard = two.try_acquire().await.unwrap().expect("free");
        let three = other.semaphore("sized", 3).unwrap();
        match three.try_acquire().await {
            Err(Error::PermitsMismatch {
                stored: 2,
                asked: 3,
                ..
            }) => {}
            other => panic!("{mode:?}: another count: {other:?}"),
        }
        match three.acquire().await {
            Err(Error::PermitsMismatch { .. }) => {}
            other => panic!("{mode:?}: a waiting acquisition with another count: {other:?}"),
        }
        assert_eq!(two.state().await.unwrap().held, 1, "{mode:?}: unchanged");
        guard.unlock().await.unwrap();

        // Idle: the next count applies.
        let guards = take(&three, 3).await;
        assert!(two.try_acquire().await.is_err(), "{mode:?}: now 3 apply");
        drop(guards);
    })
    .await;
}

/// A queued waiter's client vouches for it while it waits: its heartbeat moves the waiter's
/// time in the queue on (`lua/rw_heartbeat.lua`), so a waiter that waits for several waiter
/// leases keeps its place, and the permit freed after them goes to it, not to a waiter that
/// queued later. (Were it not vouched for, the scripts would drop it as dead once its first
/// waiter lease ran out, and it would queue again behind the later one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_past_several_waiter_leases() {
    support::init_tracing();
    let server = support::RedisServer::start();
    for mode in support::MODES {
        let prefix = format!("sem-vouched-{}", mode.as_str());
        let mut config = support::config(&server, &prefix, mode);
        config.waiter_lease = Duration::from_secs(1);
        let holder = LockClient::connect(config.clone()).await.unwrap();
        let patient = LockClient::connect(config.clone()).await.unwrap();
        let later = LockClient::connect(config).await.unwrap();
        let semaphore = holder.semaphore("vouched", 1).unwrap();
        let held = semaphore
            .try_acquire()
            .await
            .unwrap()
            .expect("the free permit");
        let first = queued(&patient, "vouched", 1).await;
        // Three and a half waiter leases: only the heartbeat keeps the first waiter queued.
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        let second = queued(&later, "vouched", 1).await;
        held.unlock().await.unwrap();
        let guard = joined("the first waiter's permit", first).await;
        assert!(
            !second.is_finished(),
            "{mode:?}: the later waiter went first"
        );
        guard.unlock().await.unwrap();
        joined("the later waiter's permit", second)
            .await
            .unlock()
            .await
            .unwrap();
        for client in [holder, patient, later] {
            client.shutdown().await.unwrap();
        }
    }
}
