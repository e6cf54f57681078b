//! Mutex semantics against a real redis-server, in both notification modes: re-entry, release
//! errors, retried calls, fencing tokens, the lease-lost signal, cancellation and connection
//! economy.

mod support;

use std::time::Duration;

use fredlock::{
    Config, Error, Lease, LockClient, LostCause, NotHeldReason, NotificationMode, Owner,
};
use support::{connect, eventually_async, HANG, MODES};
use support::{
    fence_value, find_hold, hold_owner, init_tracing, queued_waiters, RedisServer, ReplyDropper,
};

fn config(server: &RedisServer, mode: NotificationMode, prefix: &str) -> Config {
    support::config(server, &format!("{prefix}-{}", mode.as_str()), mode)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_counts_holds_and_keeps_the_token() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "reentry")).await;
        let me = Owner::new();
        let mine = locks.mutex("account:7").unwrap().with_owner(&me);
        let first = mine.lock().await.unwrap();
        let second = mine.lock().await.unwrap();
        let third = mine
            .try_lock()
            .await
            .unwrap()
            .expect("re-entry never waits");
        assert_eq!(first.fencing_token(), second.fencing_token());
        assert_eq!(first.fencing_token(), third.fencing_token());
        assert_eq!(mine.state().await.unwrap().hold_count, 3);

        // Another owner (a handle without owner) is excluded, and a re-entry from another task
        // under the same owner is not.
        let other = locks.mutex("account:7").unwrap();
        assert!(other.try_lock().await.unwrap().is_none());
        let mine2 = mine.clone();
        let from_task = tokio::spawn(async move { mine2.lock().await.map(|g| g.fencing_token()) });
        assert_eq!(from_task.await.unwrap().unwrap(), first.fencing_token());
        // The spawned task's guard was dropped: the release worker takes that hold back.
        eventually_async("dropped re-entry released", || async {
            mine.state().await.unwrap().hold_count == 3
        })
        .await;

        first.unlock().await.unwrap();
        second.unlock().await.unwrap();
        let state = mine.state().await.unwrap();
        assert!(state.locked);
        assert_eq!(state.hold_count, 1);
        assert!(other.try_lock().await.unwrap().is_none());
        third.unlock().await.unwrap();
        assert!(!mine.is_locked().await.unwrap());
        let next = other
            .try_lock()
            .await
            .unwrap()
            .expect("free after the last hold");
        assert!(next.fencing_token() > state.fencing_token.unwrap());
        next.unlock().await.unwrap();
        assert_eq!(locks.stats().held, 0);
        locks.shutdown().await.unwrap();
    }
}

/// An uncontended lock and unlock take the fast paths (`lua/hold_take.lua`,
/// `lua/hold_free.lua`), but for the lock's first take, which has no tombstone to continue
/// and goes through the full script without counting as contention; the hold and the tokens
/// are the same whichever path wrote them, and a busy lock still answers busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_cycles_take_the_fast_paths() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "fast")).await;
        let mutex = locks.mutex("quiet").unwrap();
        let mut last = 0;
        for cycle in 0..3u64 {
            let guard = mutex.lock().await.unwrap();
            assert!(guard.fencing_token() > last, "{mode:?}: cycle {cycle}");
            last = guard.fencing_token();
            assert_eq!(mutex.state().await.unwrap().fencing_token, Some(last));
            guard.unlock().await.unwrap();
            assert!(!mutex.is_locked().await.unwrap(), "{mode:?}");
            // Cycle 0: the full take (no hash yet), then the fast release; later cycles: both.
            assert_eq!(
                locks.stats().fast_paths,
                2 * cycle + 1,
                "{mode:?}: cycle {cycle}"
            );
        }
        let held = mutex.lock().await.unwrap();
        let other = locks.mutex("quiet").unwrap();
        assert!(other.try_lock().await.unwrap().is_none(), "{mode:?}");
        assert_eq!(
            locks.stats().fast_paths,
            6,
            "{mode:?}: the busy try is the full take's"
        );
        held.unlock().await.unwrap();
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_without_owner_exclude_each_other_and_waiters_get_the_lock() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "exclusion")).await;
        let mutex = locks.mutex("jobs").unwrap();
        let held = mutex.lock().await.unwrap();
        assert!(mutex.try_lock().await.unwrap().is_none());
        assert!(mutex
            .lock_timeout(Duration::from_millis(50))
            .await
            .unwrap()
            .is_none());
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
        };
        eventually_async("waiter registered", || async { locks.stats().waiting == 1 }).await;
        let token = held.fencing_token();
        held.unlock().await.unwrap();
        let next = tokio::time::timeout(HANG, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next > token);
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_errors_leave_the_current_holder_alone() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "release")).await;
        let short = locks
            .mutex("ledger")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_millis(200)))
            .unwrap();
        // Released after expiry, nobody holds it.
        let expired = short.lock().await.unwrap();
        assert_eq!(expired.lost().await, LostCause::Expired);
        eventually_async("lease expired in Redis", || async {
            !short.is_locked().await.unwrap()
        })
        .await;
        match expired.unlock().await {
            Err(Error::NotHeld { reason, .. }) => assert_eq!(reason, NotHeldReason::Expired),
            other => panic!("expected NotHeld(Expired), got {other:?}"),
        }

        // Released after expiry while another owner holds it.
        let stale = short.lock().await.unwrap();
        eventually_async("lease expired in Redis", || async {
            !short.is_locked().await.unwrap()
        })
        .await;
        let holder = locks.mutex("ledger").unwrap().lock().await.unwrap();
        let before = short.state().await.unwrap();
        match stale.unlock().await {
            Err(Error::NotHeld { reason, .. }) => {
                assert_eq!(reason, NotHeldReason::HeldByOther)
            }
            other => panic!("expected NotHeld(HeldByOther), got {other:?}"),
        }
        let after = short.state().await.unwrap();
        assert_eq!(before.hold_count, after.hold_count);
        assert_eq!(before.fencing_token, after.fencing_token);
        assert!(after.locked);
        holder.unlock().await.unwrap();
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_holders_and_survive_force_unlock() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let mut cfg = config(&server, mode, "fence");
        cfg.watchdog_lease = Duration::from_millis(600);
        let locks = LockClient::connect(cfg).await.unwrap();
        let mutex = locks.mutex("printer").unwrap();
        let mut last = 0;
        for _ in 0..5 {
            let guard = mutex.lock().await.unwrap();
            assert!(guard.fencing_token() > last);
            last = guard.fencing_token();
            guard.unlock().await.unwrap();
        }
        let victim = mutex.lock().await.unwrap();
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
        };
        eventually_async("waiter registered", || async { locks.stats().waiting == 1 }).await;
        assert!(mutex.force_unlock().await.unwrap());
        // The waiter is woken by the forced unlock's event and gets a higher token.
        let next = tokio::time::timeout(HANG, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next > victim.fencing_token());
        // The evicted holder learns it at its next renewal.
        let cause = tokio::time::timeout(HANG, victim.lost()).await.unwrap();
        assert!(
            matches!(cause, LostCause::KeyDeleted | LostCause::OwnerChanged),
            "{cause:?}"
        );
        assert!(matches!(victim.unlock().await, Err(Error::NotHeld { .. })));
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_key_is_deleted_behind_the_holder() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let mut cfg = config(&server, mode, "deleted");
        cfg.watchdog_lease = Duration::from_millis(600);
        cfg.shards = 1;
        let prefix = cfg.key_prefix.clone();
        let locks = LockClient::connect(cfg).await.unwrap();
        let guard = locks.mutex("report").unwrap().lock().await.unwrap();
        assert!(guard.lost_cause().is_none());
        let key = format!("{{{prefix}:0}}:mutex:report");
        assert_eq!(server.cmd(&["DEL", &key]).as_int(), 1);
        let cause = tokio::time::timeout(HANG, guard.lost()).await.unwrap();
        assert_eq!(cause, LostCause::KeyDeleted);
        assert_eq!(guard.lost_cause(), Some(LostCause::KeyDeleted));
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_renewal_fails() {
    init_tracing();
    for mode in MODES {
        // Own server: it will be paused.
        let server = RedisServer::start();
        let mut cfg = config(&server, mode, "renewal");
        cfg.watchdog_lease = Duration::from_millis(900);
        cfg.command_timeout = Duration::from_millis(200);
        let locks = LockClient::connect(cfg).await.unwrap();
        let guard = locks.mutex("batch").unwrap().lock().await.unwrap();
        let deadline_before = guard.lease_deadline();
        server.stop_signal();
        let cause = tokio::time::timeout(HANG, guard.lost()).await;
        server.cont_signal();
        match cause.expect("lost() must fire while Redis is unreachable") {
            LostCause::RenewalFailed(error) => assert!(!error.to_string().is_empty()),
            other => panic!("expected RenewalFailed, got {other:?}"),
        }
        assert!(guard.lease_deadline() >= deadline_before);
        drop(guard);
        locks.shutdown().await.ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_the_lease_and_max_hold_caps_it() {
    init_tracing();
    let server = RedisServer::start();
    let locks = connect(config(&server, NotificationMode::Stream, "watchdog")).await;
    let renewed = locks
        .mutex("long-job")
        .unwrap()
        .with_lease(Lease::watchdog(Duration::from_millis(300)))
        .unwrap();
    let guard = renewed.lock().await.unwrap();
    let first_deadline = guard.lease_deadline();
    // Several leases later the hold is still there, renewed by the watchdog.
    eventually_async("deadline pushed forward", || async {
        guard.lease_deadline() > first_deadline + Duration::from_millis(600)
    })
    .await;
    assert!(renewed.is_locked().await.unwrap());
    assert!(guard.lost_cause().is_none());
    guard.unlock().await.unwrap();

    let capped = locks
        .mutex("capped-job")
        .unwrap()
        .with_lease(
            Lease::watchdog(Duration::from_millis(300)).with_max_hold(Duration::from_millis(700)),
        )
        .unwrap();
    let guard = capped.lock().await.unwrap();
    assert_eq!(
        tokio::time::timeout(HANG, guard.lost()).await.unwrap(),
        LostCause::Expired
    );
    eventually_async("capped hold expired", || async {
        !capped.is_locked().await.unwrap()
    })
    .await;
    drop(guard);

    // extend() on a fixed lease keeps the hold past its original lease.
    let fixed = locks
        .mutex("fixed-job")
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_millis(300)))
        .unwrap();
    let guard = fixed.lock().await.unwrap();
    guard.extend(Duration::from_secs(60)).await.unwrap();
    let remaining = fixed.state().await.unwrap().remaining.unwrap();
    assert!(remaining > Duration::from_secs(30), "{remaining:?}");
    assert!(matches!(
        guard.extend(Duration::ZERO).await,
        Err(Error::InvalidDuration { .. })
    ));
    guard.unlock().await.unwrap();
    locks.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_lock_futures_leave_nothing_behind() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let mut cfg = config(&server, mode, "cancel");
        cfg.shards = 1;
        let prefix = cfg.key_prefix.clone();
        let locks = LockClient::connect(cfg).await.unwrap();
        let mutex = locks.mutex("queue").unwrap();

        // 1. Waiters dropped while waiting.
        let holder = mutex.lock().await.unwrap();
        let waiters: Vec<_> = (0..20)
            .map(|_| {
                let mutex = mutex.clone();
                tokio::spawn(async move { mutex.lock().await.map(|_| ()) })
            })
            .collect();
        eventually_async("20 waiters registered", || async {
            locks.stats().waiting == 20
        })
        .await;
        for waiter in &waiters {
            waiter.abort();
        }
        for waiter in waiters {
            assert!(waiter.await.unwrap_err().is_cancelled());
        }
        let stats = locks.stats();
        assert_eq!((stats.waiting, stats.waiting_locks), (0, 0), "{stats:?}");
        let state = mutex.state().await.unwrap();
        assert_eq!(state.hold_count, 1, "the holder is untouched");
        assert_eq!(state.fencing_token, Some(holder.fencing_token()));
        holder.unlock().await.unwrap();
        // Attempts of the aborted waiters that were still in flight finish in the background
        // (and leave the queue, or release whatever they obtained); once they settle, nobody
        // is queued.
        let hold_key = format!("{{{prefix}:0}}:mutex:queue");
        eventually_async("aborted attempts finished", || async {
            locks.stats().orphaned_attempts == 0
        })
        .await;
        assert_eq!(queued_waiters(&server, &hold_key), Vec::<String>::new());
        assert!(!mutex.is_locked().await.unwrap());

        // 2. Futures dropped while their acquire script is in flight, on a free lock: any hold
        //    they obtained is released by the engine.
        for _ in 0..30 {
            let attempt = mutex.lock();
            tokio::select! {
                biased;
                // On a loaded machine the reply can arrive within the first poll: a guard then
                // comes back, and is released here (a drop would release it in the background,
                // which the checks below would race with).
                acquired = attempt => acquired.unwrap().unlock().await.unwrap(),
                _ = std::future::ready(()) => {}
            }
        }
        eventually_async("in-flight acquisitions finished", || async {
            locks.stats().orphaned_attempts == 0
        })
        .await;
        assert!(!mutex.is_locked().await.unwrap());
        assert_eq!(locks.stats().held, 0);
        assert_eq!(locks.stats().waiting, 0);
        assert_eq!(hold_owner(&server, &hold_key), None);
        assert_eq!(queued_waiters(&server, &hold_key), Vec::<String>::new());
        let again = mutex.try_lock().await.unwrap().expect("lock is free");
        again.unlock().await.unwrap();
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_does_not_queue() {
    init_tracing();
    let server = RedisServer::start();
    let mut cfg = config(&server, NotificationMode::Stream, "trylock");
    cfg.shards = 1;
    let prefix = cfg.key_prefix.clone();
    let locks = LockClient::connect(cfg).await.unwrap();
    let mutex = locks.mutex("x").unwrap();
    let held = mutex.lock().await.unwrap();
    assert!(mutex.try_lock().await.unwrap().is_none());
    let hold_key = format!("{{{prefix}:0}}:mutex:x");
    assert_eq!(queued_waiters(&server, &hold_key), Vec::<String>::new());
    let events = format!("{{{prefix}:events}}");
    held.unlock().await.unwrap();
    assert_eq!(
        server.cmd(&["XLEN", &events]).as_int(),
        0,
        "an uncontended release writes no event"
    );
    locks.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_releases_and_wakes_the_next_waiter() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "dropguard")).await;
        let mutex = locks.mutex("y").unwrap();
        let held = mutex.lock().await.unwrap();
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
        };
        eventually_async("waiter registered", || async { locks.stats().waiting == 1 }).await;
        let token = held.fencing_token();
        drop(held);
        let next = tokio::time::timeout(HANG, waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next > token);
        locks.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_two_connections() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let before = connected_clients(&server);
        let locks = connect(config(&server, mode, "economy")).await;
        let holder = connect(config(&server, mode, "economy")).await;
        let mut guards = Vec::new();
        for i in 0..200 {
            guards.push(
                holder
                    .mutex(&format!("lock-{i}"))
                    .unwrap()
                    .lock()
                    .await
                    .unwrap(),
            );
        }
        let waiters: Vec<_> = (0..200)
            .map(|i| {
                let mutex = locks.mutex(&format!("lock-{i}")).unwrap();
                tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
            })
            .collect();
        eventually_async("200 waiters registered", || async {
            locks.stats().waiting == 200
        })
        .await;
        assert_eq!(
            connected_clients(&server) - before,
            4,
            "two clients, two connections each, whatever the number of waiters"
        );
        drop(guards);
        for waiter in waiters {
            tokio::time::timeout(HANG, waiter)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
        locks.shutdown().await.unwrap();
        holder.shutdown().await.unwrap();
    }
}

fn connected_clients(server: &RedisServer) -> i64 {
    // The harness's own connection for this INFO call is counted too; it is the same in every
    // call, so differences are exact.
    let info = server.cmd(&["INFO", "clients"]).as_str().unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("connected_clients in INFO")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_client_uses_the_services_connection_and_leaves_it_open() {
    use fred::interfaces::{ClientLike, KeysInterface};
    init_tracing();
    let server = RedisServer::start();
    let fred_config = fred::types::config::Config::from_url(&server.url()).unwrap();
    let service = fred::clients::Client::new(fred_config, None, None, None);
    service.init().await.unwrap();
    let locks = LockClient::from_client(
        service.clone(),
        config(&server, NotificationMode::Stream, "shared"),
    )
    .await
    .unwrap();
    let guard = locks.mutex("z").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
    locks.shutdown().await.unwrap();
    let _: () = service
        .set("still", "usable", None, None, false)
        .await
        .unwrap();
    let value: String = service.get("still").await.unwrap();
    assert_eq!(value, "usable");
    service.quit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_different_layouts_under_one_prefix_are_refused() {
    init_tracing();
    let server = RedisServer::start();
    let first = connect(config(&server, NotificationMode::Stream, "layout")).await;
    let mut other = config(&server, NotificationMode::Stream, "layout");
    other.shards = 8;
    assert!(matches!(
        LockClient::connect(other).await,
        Err(Error::LayoutMismatch { .. })
    ));
    let mut other_mode = config(&server, NotificationMode::Stream, "layout");
    other_mode.notification = NotificationMode::PubSub;
    assert!(matches!(
        LockClient::connect(other_mode).await,
        Err(Error::LayoutMismatch { .. })
    ));
    first.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_calls_after_a_lost_reply_are_not_applied_twice() {
    init_tracing();
    let server = RedisServer::start();
    let proxy = ReplyDropper::start(server.port()).await;
    let locks = LockClient::connect(proxy.config("retry")).await.unwrap();
    let me = Owner::new();
    let mutex = locks.mutex("idempotent").unwrap().with_owner(&me);
    let first = mutex.lock().await.unwrap();
    let second = mutex.lock().await.unwrap();

    // A re-entry whose reply is lost is retried by fred with the same op id: counted once.
    proxy.arm();
    let third = tokio::time::timeout(HANG, mutex.lock())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mutex.state().await.unwrap().hold_count, 3);

    // A partial release whose reply is lost: decremented once, and reported as success.
    proxy.arm();
    tokio::time::timeout(HANG, third.unlock())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mutex.state().await.unwrap().hold_count, 2);
    second.unlock().await.unwrap();

    // The final release whose reply is lost: the tombstone answers the retry with success.
    proxy.arm();
    tokio::time::timeout(HANG, first.unlock())
        .await
        .unwrap()
        .unwrap();
    assert!(!mutex.is_locked().await.unwrap());
    let other = locks.mutex("idempotent").unwrap().try_lock().await.unwrap();
    assert!(other.is_some(), "free for another owner");
    drop(other);
    locks.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_local_waiter_is_woken_in_turn() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let locks = connect(config(&server, mode, "turns")).await;
        // The first holder's lease is far beyond the bound below: only events can hand over.
        let mutex = locks
            .mutex("turns")
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_secs(120)))
            .unwrap();
        let holder = mutex.lock().await.unwrap();
        let waiters: Vec<_> = (0..5)
            .map(|_| {
                let mutex = mutex.clone();
                tokio::spawn(async move {
                    let guard = mutex.lock().await?;
                    tokio::task::yield_now().await;
                    guard.unlock().await
                })
            })
            .collect();
        eventually_async("5 waiters registered", || async {
            locks.stats().waiting == 5
        })
        .await;
        holder.unlock().await.unwrap();
        for waiter in waiters {
            tokio::time::timeout(HANG, waiter)
                .await
                .expect("a waiter was never woken")
                .unwrap()
                .unwrap();
        }
        locks.shutdown().await.unwrap();
    }
}

/// In a real client, a task waiting on a lock that another task of the same client releases is
/// handed the lock by the release itself: it runs no second script, and gets the next token.
/// A waiter that is handed the lock but goes away without taking it up releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_a_waiting_task_of_the_same_client() {
    init_tracing();
    let server = RedisServer::start();
    for mode in [NotificationMode::Stream, NotificationMode::PubSub] {
        let mut config = Config::new(server.url());
        config.notification = mode;
        config.key_prefix = format!("handover-{}", mode as u8);
        let locks = LockClient::connect(config).await.unwrap();
        let mutex = locks.mutex("cohort").unwrap();

        let holder = mutex.lock().await.unwrap();
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await })
        };
        // The lock is held in this process: the waiter waits for the holder's release without
        // asking Redis (no attempt, no place in the Redis queue).
        eventually_async("waiter registered", || async { locks.stats().waiting == 1 }).await;
        let prefix = format!("handover-{}", mode as u8);
        let hold_key = find_hold(&server, &prefix, "mutex", "cohort").expect("the hold");
        assert!(queued_waiters(&server, &hold_key).is_empty(), "{mode:?}");
        let token = holder.fencing_token();
        holder.unlock().await.unwrap();
        let guard = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // The hand-over takes the next token from the hold itself; only the first take read
        // the shard's fence key, which records that first token.
        assert!(guard.fencing_token() > token, "{mode:?}");
        let tag = &hold_key[..=hold_key.find('}').expect("a hash tag")];
        let (last, _) = fence_value(&server, &format!("{tag}:fence"));
        assert_eq!(last, token, "{mode:?}");
        let stats = locks.stats();
        assert_eq!((stats.attempts, stats.handed_over), (1, 1), "{mode:?}");

        // Handed the lock, never polled again, dropped: the hand-over is released.
        let mut never = Box::pin(mutex.lock());
        while locks.stats().waiting < 1 {
            tokio::select! {
                biased;
                _ = &mut never => panic!("cannot acquire while the lock is held"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        guard.unlock().await.unwrap(); // hands the lock to `never`
        drop(never);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while mutex.is_locked().await.unwrap() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the unused hand-over was never released"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            locks.stats().handed_over,
            1,
            "the dropped waiter took nothing up"
        );
        let again = mutex.try_lock().await.unwrap().expect("free");
        again.unlock().await.unwrap();
        locks.shutdown().await.unwrap();
    }
}

/// A burst of grants into one client's inbox while its reader is stalled (the only thread of
/// its runtime blocked): more arrive than an inbox keeps (`MAXLEN ~ 100`), so Redis trims some
/// unread. The reader's next read returns a full inbox, and it wakes every waiter, whose next
/// attempt finds its grant: all acquire without waiting for the holder's lease or the
/// heartbeat (120 s and 40 s here, past the test's hang bound). Stream mode only (Pub/Sub
/// keeps no inbox).
#[test]
fn grants_trimmed_unread_from_a_full_inbox_still_reach_their_waiters() {
    // Redis trims a capped stream by whole nodes of 100 entries, and only while at least 100
    // stay: 250 grants lose about 100 of them.
    const WAITERS: usize = 250;
    init_tracing();
    let server = RedisServer::start();
    let mode = NotificationMode::Stream;
    let long = |mut config: Config| {
        config.watchdog_lease = Duration::from_secs(120);
        config.waiter_lease = Duration::from_secs(120);
        config
    };
    let names: Vec<String> = (0..WAITERS).map(|i| format!("burst-{i}")).collect();
    let holder_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let holder = holder_runtime.block_on(connect(long(config(&server, mode, "trimmed"))));
    let guards = holder_runtime.block_on(async {
        let mut guards = Vec::new();
        for name in &names {
            guards.push(holder.mutex(name).unwrap().lock().await.unwrap());
        }
        guards
    });

    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (stall_tx, stall_rx) = std::sync::mpsc::channel::<()>();
    let (stalled_tx, stalled_rx) = std::sync::mpsc::channel::<()>();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let waiting_config = long(config(&server, mode, "trimmed"));
    let waiting_names = names.clone();
    let waiting = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let client = connect(waiting_config).await;
            let tasks: Vec<_> = waiting_names
                .iter()
                .map(|name| {
                    let mutex = client.mutex(name).unwrap();
                    tokio::spawn(async move {
                        let guard = mutex.lock().await?;
                        guard.unlock().await
                    })
                })
                .collect();
            support::eventually("all wait", || client.stats().waiting == WAITERS).await;
            ready_tx.send(()).unwrap();
            // Running until every waiter is queued in Redis (checked by the test's thread).
            support::eventually("told to stall", || stall_rx.try_recv().is_ok()).await;
            // The stall: this runtime's one thread blocks, the reader with it.
            stalled_tx.send(()).unwrap();
            resume_rx.recv().unwrap();
            for task in tasks {
                support::bounded("a waiter acquires", task)
                    .await
                    .unwrap()
                    .unwrap();
            }
            client.shutdown().await.unwrap();
        })
    });

    ready_rx.recv().unwrap();
    let prefix = format!("trimmed-{}", mode.as_str());
    let holds: Vec<String> = names
        .iter()
        .map(|name| find_hold(&server, &prefix, "mutex", name).expect("the hold"))
        .collect();
    let queued_everywhere = |queued: bool| {
        let deadline = std::time::Instant::now() + HANG;
        for hold in &holds {
            while queued_waiters(&server, hold).is_empty() == queued {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{hold}: queued is not {queued}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    queued_everywhere(true);
    stall_tx.send(()).unwrap();
    stalled_rx.recv().unwrap();
    holder_runtime.block_on(async {
        for guard in guards {
            guard.unlock().await.unwrap();
        }
    });
    // Every release granted its lock (a contended release may be sent after `unlock()`
    // returns): all the grant events are in the inbox, or trimmed from it.
    queued_everywhere(false);
    resume_tx.send(()).unwrap();
    waiting.join().expect("every waiter acquires");
    holder_runtime.block_on(holder.shutdown()).unwrap();
}

/// In Pub/Sub mode an event published before the notifier's `SUBSCRIBE` reaches the server is
/// lost: a grant, or the `held` notice of a hold taken right after `connect`. So `connect`
/// returns only once the subscription is in place, even over a link that delivers every
/// `SUBSCRIBE` late (a proxy holds each back for half a second): the server lists one more
/// inbox channel after each connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_client_is_subscribed_to_its_inbox_when_connect_returns() {
    init_tracing();
    let server = RedisServer::start();
    let proxy = ReplyDropper::start(server.port()).await;
    proxy.delay_subscriptions(Duration::from_millis(500));
    let prefix = "subscribed-at-connect";
    let pattern = format!("{{{prefix}:events}}:to:*");
    let mut clients = Vec::new();
    for n in 1..=3 {
        let mut config = proxy.config(prefix);
        config.notification = NotificationMode::PubSub;
        clients.push(connect(config).await);
        let channels = server.cmd(&["PUBSUB", "CHANNELS", &pattern]).as_array();
        assert_eq!(channels.len(), n, "inbox channels after {n} connects");
    }
    for client in &clients {
        support::shutdown(client).await;
    }
}
