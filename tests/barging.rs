//! The barging `Mutex`'s shortcuts within one process, against a real redis-server in both
//! notification modes (`src/engine/release.rs`, `docs/design.md` §4.3): the deferred release of a
//! contended hold and its take-over by the next `lock()` of the same client, the immediate
//! release of an uncontended hold, the bound `Config::handover_limit` puts on both, local
//! waiting for a hold of the same client, shutdown and cancellation.
//!
//! Most tests run on a current-thread runtime: a deferred release waits a few scheduler turns
//! for a take-over, and on one thread nothing else runs between an `unlock()` that returns
//! without a round trip and the `lock()` right after it, so whether the take-over happens does
//! not depend on how the OS schedules the test's threads. Nothing asserts how long anything
//! took: bounded waits only turn hangs into failures.

mod support;

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fredlock::{Config, LockClient, LockGuard, MutexGuard, NotificationMode, Owner, Result};
use support::{bounded, connect, eventually, eventually_async, shutdown, RedisServer, MODES};
use support::{find_hold, hold_owner, init_tracing, joined, poll_once, queued_waiters};
use support::{tasks_hand_the_hold_on, Intrudes, Take};
use tokio::task::JoinHandle;

/// The lock every test works on.
const NAME: &str = "jobs";

fn prefix(test: &str, mode: NotificationMode) -> String {
    format!("{test}-{}", mode.as_str())
}

/// The default configuration but for `waiter_lease`: a grant is taken up without a call of
/// the waiter's own only while at least half of its grant time, min(lease, waiter_lease), is
/// left since the waiter's last attempt. A longer grant time keeps a loaded machine from
/// turning a grant into a hold its waiter re-checks for itself (which is not counted in
/// `ClientStats::granted`, and not contended).
fn config(server: &RedisServer, test: &str, mode: NotificationMode) -> Config {
    let mut config = support::config(server, &prefix(test, mode), mode);
    config.waiter_lease = Duration::from_secs(20);
    config
}

/// Starts `lock()` of `mutex` in a task and waits until its waiter is queued in Redis
/// (`queued` lines in the lock's queue then).
async fn queue_lock(
    server: &RedisServer,
    hold_key: &str,
    mutex: fredlock::Mutex,
    queued: usize,
) -> JoinHandle<Result<MutexGuard>> {
    let task = tokio::spawn(async move { mutex.lock().await });
    eventually_async("the waiter is queued in Redis", || async {
        queued_waiters(server, hold_key).len() == queued
    })
    .await;
    task
}

/// Client A holds the lock by a grant with client B's waiter still queued behind it: a
/// contended hold, whose release a barging mutex defers.
struct Contended {
    a: LockClient,
    b: LockClient,
    a_owner: Owner,
    b_owner: Owner,
    hold_key: String,
}

impl Contended {
    /// Client C takes the lock; A's waiter queues, then B's; C unlocks, which grants the lock
    /// to A (the queue's head) with B still queued. `a_config` adjusts A's configuration.
    /// Returns the scene, A's hold (granted by C's release) and B's `lock()` (queued in Redis
    /// behind A's hold).
    async fn set_up(
        server: &RedisServer,
        test: &str,
        mode: NotificationMode,
        a_config: impl FnOnce(&mut Config),
    ) -> (Contended, MutexGuard, JoinHandle<Result<MutexGuard>>) {
        let mut config_a = config(server, test, mode);
        a_config(&mut config_a);
        let a = connect(config_a).await;
        let b = connect(config(server, test, mode)).await;
        let c = connect(config(server, test, mode)).await;
        let (a_owner, b_owner) = (Owner::new(), Owner::new());

        let c_guard = bounded("C locks", c.mutex(NAME).unwrap().lock())
            .await
            .unwrap();
        let hold_key = find_hold(server, &prefix(test, mode), "mutex", NAME).expect("the hold");
        let a_mutex = a.mutex(NAME).unwrap().with_owner(&a_owner);
        let a_task = queue_lock(server, &hold_key, a_mutex, 1).await;
        let b_mutex = b.mutex(NAME).unwrap().with_owner(&b_owner);
        let b_task = queue_lock(server, &hold_key, b_mutex, 2).await;

        let c_token = c_guard.fencing_token();
        c_guard.unlock().await.unwrap();
        let a_guard = joined("A is granted the lock", a_task).await.unwrap();
        assert!(a_guard.fencing_token() > c_token, "{mode:?}");
        assert_eq!(a.stats().granted, 1, "{mode:?}: A's hold came by C's grant");
        assert_eq!(
            hold_owner(server, &hold_key).as_deref(),
            Some(a_owner.id()),
            "{mode:?}"
        );
        assert_eq!(
            queued_waiters(server, &hold_key).len(),
            1,
            "{mode:?}: B waits"
        );
        assert!(!b_task.is_finished(), "{mode:?}");
        shutdown(&c).await;
        let scene = Contended {
            a,
            b,
            a_owner,
            b_owner,
            hold_key,
        };
        (scene, a_guard, b_task)
    }

    fn a_mutex(&self) -> fredlock::Mutex {
        self.a.mutex(NAME).unwrap().with_owner(&self.a_owner)
    }

    /// Unlocks A's hold and checks that its release was deferred: unlock() returned with the
    /// release parked in A's client. Returns the hold's fencing token.
    async fn unlock_a_deferred(&self, a_guard: MutexGuard, mode: NotificationMode) -> u64 {
        let token = a_guard.fencing_token();
        a_guard.unlock().await.unwrap();
        assert_eq!(self.a.stats().deferred_releases, 1, "{mode:?}");
        token
    }

    /// Polls A's `relock` once and checks that it took A's parked release over: the release
    /// call, naming this acquisition the successor, is on its way, and `relock` still waits.
    async fn take_over_runs<F>(&self, relock: &mut F, mode: NotificationMode)
    where
        F: Future + Unpin,
        F::Output: Debug,
    {
        poll_once("A's lock()", relock).await;
        assert_eq!(
            self.a.stats().deferred_releases,
            0,
            "{mode:?}: the take-over ran"
        );
    }

    /// Waits for B's `lock()` and checks that B holds the lock now, granted by a release (B's
    /// first grant) after the hold whose fencing token is `after`. Returns B's hold.
    async fn b_is_granted(
        &self,
        server: &RedisServer,
        b_task: JoinHandle<Result<MutexGuard>>,
        after: u64,
        mode: NotificationMode,
    ) -> MutexGuard {
        let b_guard = joined("B is granted the lock", b_task).await.unwrap();
        assert!(b_guard.fencing_token() > after, "{mode:?}");
        assert_eq!(self.b.stats().granted, 1, "{mode:?}");
        assert_eq!(
            hold_owner(server, &self.hold_key).as_deref(),
            Some(self.b_owner.id()),
            "{mode:?}"
        );
        b_guard
    }
}

/// Waits for B's `lock()` while A's `relock` waits too; panics if A's returns first (`when`
/// says why it must not). Returns B's hold.
async fn b_is_served_first<F>(
    b_task: &mut JoinHandle<Result<MutexGuard>>,
    relock: &mut F,
    mode: NotificationMode,
    when: &str,
) -> MutexGuard
where
    F: Future + Unpin,
    F::Output: Debug,
{
    bounded("B is served", async {
        tokio::select! {
            b = b_task => b.expect("B's task").expect("B's lock()"),
            a = relock => panic!("{mode:?}: A's lock() returned {when}: {a:?}"),
        }
    })
    .await
}

/// A's config for the take-over tests: a bound that B's wait cannot reach, whatever the load.
fn patient(config: &mut Config) {
    config.handover_limit = Duration::from_secs(10);
}

#[tokio::test(flavor = "current_thread")]
async fn a_contended_release_is_taken_over_by_the_next_lock_of_its_client() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, b_task) = Contended::set_up(&server, "takeover", mode, patient).await;
        let mutex = scene.a_mutex();

        // The release is parked: unlock() returns without a round trip, and A still holds the
        // lock in Redis.
        let first = scene.unlock_a_deferred(a_guard, mode).await;
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.a_owner.id()),
            "{mode:?}"
        );

        // The next lock() of the same client takes it over: one release call naming it the
        // successor, no acquire attempt.
        let before = scene.a.stats();
        let second = bounded("take-over", mutex.lock()).await.unwrap();
        let after = scene.a.stats();
        assert_eq!(after.taken_over, before.taken_over + 1, "{mode:?}");
        assert_eq!(after.attempts, before.attempts, "{mode:?}");
        assert_eq!(after.deferred_releases, 0, "{mode:?}");
        assert_eq!(after.held, 1, "{mode:?}");
        let second_token = second.fencing_token();
        assert!(second_token > first, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.a_owner.id()),
            "{mode:?}"
        );
        assert_eq!(
            queued_waiters(&server, &scene.hold_key).len(),
            1,
            "{mode:?}"
        );
        assert!(!b_task.is_finished(), "{mode:?}: B still waits");
        assert_eq!(scene.b.stats().waiting, 1, "{mode:?}");

        // The taken-over hold is contended too (B stays queued behind it): its release is
        // parked, nobody takes it, and the background release grants the lock to B.
        second.unlock().await.unwrap();
        assert_eq!(scene.a.stats().deferred_releases, 1, "{mode:?}");
        let b_guard = scene
            .b_is_granted(&server, b_task, second_token, mode)
            .await;
        let stats = scene.a.stats();
        assert_eq!(stats.deferred_releases, 0, "{mode:?}");
        assert_eq!(stats.taken_over, before.taken_over + 1, "{mode:?}");
        assert_eq!(stats.held, 0, "{mode:?}");

        b_guard.unlock().await.unwrap();
        assert_eq!(hold_owner(&server, &scene.hold_key), None, "{mode:?}");
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

/// A `try_lock()` that finds its client's release parked takes it over too, without waiting
/// for the parked hold's task to start: with no patience it sends the take-over itself (on one
/// thread that task has not run yet), and the task, when it runs, finds nothing to do.
#[tokio::test(flavor = "current_thread")]
async fn a_try_lock_takes_a_deferred_release_over_itself() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, b_task) = Contended::set_up(&server, "trytake", mode, patient).await;
        let first = scene.unlock_a_deferred(a_guard, mode).await;
        let before = scene.a.stats();
        let second = bounded("A's try_lock()", scene.a_mutex().try_lock())
            .await
            .unwrap()
            .expect("taken over");
        assert!(second.fencing_token() > first, "{mode:?}");
        let after = scene.a.stats();
        assert_eq!(after.taken_over, before.taken_over + 1, "{mode:?}");
        assert_eq!(after.attempts, before.attempts, "{mode:?}");
        // The parked hold's task runs now and finds its release done.
        tokio::task::yield_now().await;
        assert_eq!(scene.a.stats().deferred_releases, 0, "{mode:?}");
        assert!(!b_task.is_finished(), "{mode:?}: B still waits");

        let second_token = second.fencing_token();
        second.unlock().await.unwrap();
        let b_guard = scene
            .b_is_granted(&server, b_task, second_token, mode)
            .await;
        b_guard.unlock().await.unwrap();
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_release_nobody_takes_goes_to_the_queue() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        // The default handover_limit: the background release names no successor anyway.
        let (scene, a_guard, b_task) = Contended::set_up(&server, "untaken", mode, |_| {}).await;
        let first = a_guard.fencing_token();
        a_guard.unlock().await.unwrap();

        let b_guard = scene.b_is_granted(&server, b_task, first, mode).await;
        eventually("A's deferred release is done", || {
            scene.a.stats().deferred_releases == 0
        })
        .await;
        let stats = scene.a.stats();
        assert_eq!((stats.taken_over, stats.held), (0, 0), "{mode:?}");

        b_guard.unlock().await.unwrap();
        assert_eq!(hold_owner(&server, &scene.hold_key), None, "{mode:?}");
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_unlock_is_done_when_it_returns() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let a = connect(config(&server, "uncontended", mode)).await;
        let b = connect(config(&server, "uncontended", mode)).await;
        let (a_owner, b_owner) = (Owner::new(), Owner::new());
        let a_mutex = a.mutex(NAME).unwrap().with_owner(&a_owner);
        let b_mutex = b.mutex(NAME).unwrap().with_owner(&b_owner);

        // Nobody waited for this hold: it is released in Redis before unlock() returns.
        let guard = bounded("A locks", a_mutex.lock()).await.unwrap();
        let first = guard.fencing_token();
        guard.unlock().await.unwrap();
        assert_eq!(a.stats().deferred_releases, 0, "{mode:?}");
        let b_guard = b_mutex
            .try_lock()
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{mode:?}: the lock is free once unlock() returned"));
        assert!(b_guard.fencing_token() > first, "{mode:?}");
        assert!(a_mutex.is_locked().await.unwrap(), "{mode:?}: B holds it");
        let hold_key =
            find_hold(&server, &prefix("uncontended", mode), "mutex", NAME).expect("the hold");
        assert_eq!(
            hold_owner(&server, &hold_key).as_deref(),
            Some(b_owner.id()),
            "{mode:?}"
        );
        b_guard.unlock().await.unwrap();
        assert!(!a_mutex.is_locked().await.unwrap(), "{mode:?}");
        assert_eq!(a.stats().taken_over, 0, "{mode:?}");
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// Once the holder's client (`holder`, holding for `owner`) has heard of the waiter of another
/// client queued behind the hold of `guard` (its first `held` notice), the hold's `unlock()` is
/// parked, with nothing sent until the releasing task yields; the deferred release then grants
/// the lock to `waiter`, with a higher token. Returns its guard.
async fn deferred_release_grants(
    server: &RedisServer,
    hold_key: &str,
    (holder, owner): (&LockClient, &Owner),
    guard: MutexGuard,
    waiter: JoinHandle<Result<MutexGuard>>,
) -> MutexGuard {
    eventually_async("the holder's client hears of the waiter", || async {
        holder.stats().queued_behind == 1
    })
    .await;
    let token = guard.fencing_token();
    guard.unlock().await.unwrap();
    assert_eq!(holder.stats().deferred_releases, 1, "parked, not yet sent");
    assert_eq!(
        hold_owner(server, hold_key).as_deref(),
        Some(owner.id()),
        "nothing sent before the releasing task yields"
    );
    let granted = joined("the waiter is granted the lock", waiter)
        .await
        .unwrap();
    assert!(granted.fencing_token() > token);
    granted
}

/// A hold its owner took with nobody waiting becomes contended when a waiter of another
/// client queues behind it: Redis tells the holder's client (one `held` event into its inbox,
/// `lua/hold_acquire.lua`), and the hold's release is deferred from then on, like a granted
/// hold's, so `unlock()` returns without a round trip; the deferred release grants the lock to
/// the waiter. A hold whose waiter the client has not heard of is released before `unlock()`
/// returns.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_queued_behind_a_taken_hold_makes_its_release_deferred() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let a = connect(config(&server, "behind", mode)).await;
        let b = connect(config(&server, "behind", mode)).await;
        let (a_owner, b_owner) = (Owner::new(), Owner::new());
        let a_mutex = a.mutex(NAME).unwrap().with_owner(&a_owner);
        let b_mutex = b.mutex(NAME).unwrap().with_owner(&b_owner);

        let guard = bounded("A locks", a_mutex.lock()).await.unwrap();
        let hold_key =
            find_hold(&server, &prefix("behind", mode), "mutex", NAME).expect("the hold");
        let waiter = queue_lock(&server, &hold_key, b_mutex.clone(), 1).await;
        let holder = (&a, &a_owner);
        let b_guard = deferred_release_grants(&server, &hold_key, holder, guard, waiter).await;
        eventually("A's deferred release is done", || {
            a.stats().deferred_releases == 0
        })
        .await;
        assert_eq!(b.stats().granted, 1, "{mode:?}: by A's release");
        assert_eq!(
            b.stats().queued_behind,
            0,
            "{mode:?}: nobody queued behind B's grant"
        );
        b_guard.unlock().await.unwrap();
        assert!(!a_mutex.is_locked().await.unwrap(), "{mode:?}");
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// A hold granted with nobody left queued behind it hears of a waiter that queues later, as a
/// taken hold does (the grant gives field `i` of `lua/lib/hold.lua` to the grantee's client):
/// its release is deferred, and grants the lock to that waiter. Without the notice, two
/// clients taking turns would each need a release and an acquire call per turn once a release
/// had found the queue empty.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_queued_behind_a_granted_hold_makes_its_release_deferred() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let a = connect(config(&server, "granted", mode)).await;
        let b = connect(config(&server, "granted", mode)).await;
        let (a_owner, b_owner) = (Owner::new(), Owner::new());
        let a_mutex = a.mutex(NAME).unwrap().with_owner(&a_owner);
        let b_mutex = b.mutex(NAME).unwrap().with_owner(&b_owner);

        let a_guard = bounded("A locks", a_mutex.lock()).await.unwrap();
        let hold_key =
            find_hold(&server, &prefix("granted", mode), "mutex", NAME).expect("the hold");
        let b_waiter = queue_lock(&server, &hold_key, b_mutex.clone(), 1).await;
        a_guard.unlock().await.unwrap();
        let b_guard = joined("B is granted the lock", b_waiter).await.unwrap();
        assert_eq!(b.stats().granted, 1, "{mode:?}: by A's release");
        assert!(
            queued_waiters(&server, &hold_key).is_empty(),
            "{mode:?}: nobody left queued behind the grant"
        );

        let a_waiter = queue_lock(&server, &hold_key, a_mutex.clone(), 1).await;
        let holder = (&b, &b_owner);
        let a_guard = deferred_release_grants(&server, &hold_key, holder, b_guard, a_waiter).await;
        assert_eq!(a.stats().granted, 1, "{mode:?}: by B's deferred release");
        a_guard.unlock().await.unwrap();
        assert!(!b_mutex.is_locked().await.unwrap(), "{mode:?}");
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_past_the_limit_is_served_before_a_take_over() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, mut b_task) = Contended::set_up(&server, "limit", mode, |config| {
            config.handover_limit = Duration::from_millis(1);
        })
        .await;
        let mutex = scene.a_mutex();
        // Not a measurement: time only moves forward, so B (queued before A's hold began) has
        // waited past A's 1 ms bound after this.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let first = scene.unlock_a_deferred(a_guard, mode).await;

        // A's lock() takes the parked hold and sends its release naming itself the successor;
        // the script passes it over for B, the queue's head, which waited past the bound.
        let before = scene.a.stats();
        let mut relock = Box::pin(mutex.lock());
        scene.take_over_runs(&mut relock, mode).await;
        let past_bound = "before B, which waited past the bound";
        let b_guard = b_is_served_first(&mut b_task, &mut relock, mode, past_bound).await;
        assert!(b_guard.fencing_token() > first, "{mode:?}");
        assert_eq!(scene.b.stats().granted, 1, "{mode:?}");
        assert_eq!(scene.a.stats().taken_over, before.taken_over, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.b_owner.id()),
            "{mode:?}"
        );

        // The take-over call queued A behind B: A gets the lock after B, by B's release, without
        // an attempt of its own.
        let b_token = b_guard.fencing_token();
        b_guard.unlock().await.unwrap();
        let second = bounded("A's lock()", relock).await.unwrap();
        assert!(second.fencing_token() > b_token, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.a_owner.id()),
            "{mode:?}"
        );
        let after = scene.a.stats();
        assert_eq!(after.taken_over, before.taken_over, "{mode:?}");
        assert_eq!(after.attempts, before.attempts, "{mode:?}");
        assert_eq!(after.granted, before.granted + 1, "{mode:?}");
        second.unlock().await.unwrap();
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_releases_a_deferred_hold() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, b_task) = Contended::set_up(&server, "shutdown", mode, patient).await;
        let first = scene.unlock_a_deferred(a_guard, mode).await;
        // On one thread the background release cannot run before shutdown takes the hold.
        shutdown(&scene.a).await;
        assert_eq!(scene.a.stats().deferred_releases, 0, "{mode:?}");

        let b_guard = scene.b_is_granted(&server, b_task, first, mode).await;
        assert_eq!(scene.a.stats().taken_over, 0, "{mode:?}");
        b_guard.unlock().await.unwrap();
        shutdown(&scene.b).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_take_over_leaves_nothing_behind() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, b_task) = Contended::set_up(&server, "cancel", mode, patient).await;
        let mutex = scene.a_mutex();
        let first = scene.unlock_a_deferred(a_guard, mode).await;

        // The first poll takes the parked hold over (its release call, naming this acquisition
        // the successor, is on its way); then the acquisition goes away.
        let before = scene.a.stats();
        let mut relock = Box::pin(mutex.lock());
        scene.take_over_runs(&mut relock, mode).await;
        drop(relock);
        eventually("the cancelled take-over is finished", || {
            scene.a.stats().orphaned_attempts == 0
        })
        .await;

        // Whatever the take-over was handed is released again: B is granted the lock.
        let b_guard = scene.b_is_granted(&server, b_task, first, mode).await;
        let owner = hold_owner(&server, &scene.hold_key);
        assert_ne!(owner.as_deref(), Some(scene.a_owner.id()), "{mode:?}");
        let stats = scene.a.stats();
        assert_eq!(stats.held, 0, "{mode:?}");
        assert_eq!(stats.waiting, 0, "{mode:?}");
        assert_eq!(stats.queued_in_redis, 0, "{mode:?}");
        assert_eq!(stats.deferred_releases, 0, "{mode:?}");
        assert_eq!(stats.attempts, before.attempts, "{mode:?}");

        b_guard.unlock().await.unwrap();
        assert_eq!(hold_owner(&server, &scene.hold_key), None, "{mode:?}");
        assert!(
            queued_waiters(&server, &scene.hold_key).is_empty(),
            "{mode:?}"
        );
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_task_of_the_holding_client_waits_without_asking_redis() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let a = connect(config(&server, "local", mode)).await;
        let (first_owner, second_owner) = (Owner::new(), Owner::new());
        let holder = bounded(
            "task 1 locks",
            a.mutex(NAME).unwrap().with_owner(&first_owner).lock(),
        )
        .await
        .unwrap();
        let hold_key = find_hold(&server, &prefix("local", mode), "mutex", NAME).expect("the hold");

        let before = a.stats();
        let second = a.mutex(NAME).unwrap().with_owner(&second_owner);
        let waiter = tokio::spawn(async move { second.lock().await });
        eventually("task 2 waits", || a.stats().waiting == 1).await;
        let stats = a.stats();
        assert_eq!(
            stats.attempts, before.attempts,
            "{mode:?}: no call of its own"
        );
        assert_eq!(stats.queued_in_redis, 0, "{mode:?}");
        assert!(queued_waiters(&server, &hold_key).is_empty(), "{mode:?}");
        assert!(!waiter.is_finished(), "{mode:?}");

        // Task 1's release hands the lock to task 2 in its own script call.
        let first = holder.fencing_token();
        holder.unlock().await.unwrap();
        let guard = joined("task 2 is handed the lock", waiter).await.unwrap();
        assert!(guard.fencing_token() > first, "{mode:?}");
        let after = a.stats();
        assert_eq!(after.handed_over, before.handed_over + 1, "{mode:?}");
        assert_eq!(after.attempts, before.attempts, "{mode:?}");
        assert_eq!(after.taken_over, before.taken_over, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &hold_key).as_deref(),
            Some(second_owner.id()),
            "{mode:?}"
        );
        // Nobody is queued behind the handed-over hold (nor waits in this client): it is
        // uncontended, and released in Redis before unlock() returns.
        assert!(queued_waiters(&server, &hold_key).is_empty(), "{mode:?}");
        guard.unlock().await.unwrap();
        assert_eq!(
            a.stats().deferred_releases,
            0,
            "{mode:?}: the release of an uncontended hand-over was deferred"
        );
        assert_eq!(hold_owner(&server, &hold_key), None, "{mode:?}");
        shutdown(&a).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn handover_limit_zero_turns_the_shortcuts_off() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, mut b_task) = Contended::set_up(&server, "nolimit", mode, |config| {
            config.handover_limit = Duration::ZERO;
        })
        .await;
        let mutex = scene.a_mutex();

        // No deferral: the contended release grants the lock to B before unlock() returns.
        let first = a_guard.fencing_token();
        a_guard.unlock().await.unwrap();
        assert_eq!(scene.a.stats().deferred_releases, 0, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.b_owner.id()),
            "{mode:?}"
        );
        let before = scene.a.stats();
        let mut relock = Box::pin(mutex.lock());
        let b_guard = b_is_served_first(&mut b_task, &mut relock, mode, "while B held").await;
        assert!(b_guard.fencing_token() > first, "{mode:?}");
        let b_token = b_guard.fencing_token();
        b_guard.unlock().await.unwrap();
        let second = bounded("A's lock()", relock).await.unwrap();
        assert!(second.fencing_token() > b_token, "{mode:?}");
        let after = scene.a.stats();
        assert_eq!(after.taken_over, 0, "{mode:?}");
        assert!(after.attempts > before.attempts, "{mode:?}");
        second.unlock().await.unwrap();

        // No local waiting: a second task of the holding client asks Redis and queues there,
        // and the release grants it the lock through the client's inbox, no hand-over.
        let holder = bounded("task 1 locks", mutex.lock()).await.unwrap();
        let before = scene.a.stats();
        let other = scene.a.mutex(NAME).unwrap().with_owner(&Owner::new());
        let waiter = queue_lock(&server, &scene.hold_key, other, 1).await;
        assert!(scene.a.stats().attempts > before.attempts, "{mode:?}");
        assert_eq!(
            hold_owner(&server, &scene.hold_key).as_deref(),
            Some(scene.a_owner.id()),
            "{mode:?}"
        );
        let token = holder.fencing_token();
        holder.unlock().await.unwrap();
        let guard = joined("task 2 is granted the lock", waiter).await.unwrap();
        assert!(guard.fencing_token() > token, "{mode:?}");
        let after = scene.a.stats();
        assert_eq!(after.handed_over, 0, "{mode:?}");
        assert_eq!(after.granted, before.granted + 1, "{mode:?}");
        assert_eq!(
            (after.taken_over, after.deferred_releases),
            (0, 0),
            "{mode:?}"
        );
        guard.unlock().await.unwrap();
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

/// A release that hands the lock to no local waiter (the queue's turn came) wakes every local
/// waiter of the lock to ask Redis: two tasks that waited on their own client's hold, with no
/// place in the Redis queue, both get the lock after the other process's waiter, and neither
/// sleeps until the old hold's lease (120 s, past the test's hang bound) would have ended.
/// Only one of them queues in Redis (the process's envoy); the other waits behind it, and
/// the lock passes from the one to the other within the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_ask_redis_when_the_queue_gets_the_lock() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (scene, a_guard, b_task) = Contended::set_up(&server, "localturn", mode, |config| {
            config.handover_limit = Duration::from_millis(1);
            // A's hold, granted, lasts min(lease, waiter_lease): 120 s.
            config.watchdog_lease = Duration::from_secs(120);
            config.waiter_lease = Duration::from_secs(120);
        })
        .await;
        let attempts = scene.a.stats().attempts;
        let locals: Vec<JoinHandle<Result<u64>>> = (0..2)
            .map(|_| {
                let mutex = scene.a.mutex(NAME).unwrap();
                tokio::spawn(async move {
                    let guard = mutex.lock().await?;
                    let token = guard.fencing_token();
                    guard.unlock().await?;
                    Ok(token)
                })
            })
            .collect();
        eventually("both wait on A's hold", || scene.a.stats().waiting == 2).await;
        assert_eq!(
            scene.a.stats().attempts,
            attempts,
            "{mode:?}: no call of their own"
        );
        assert_eq!(
            queued_waiters(&server, &scene.hold_key).len(),
            1,
            "{mode:?}"
        );
        // Not a measurement: time only moves forward, so B has waited past A's 1 ms bound.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let a_token = a_guard.fencing_token();
        a_guard.unlock().await.unwrap();

        let b_guard = joined("B is granted the lock", b_task).await.unwrap();
        assert!(b_guard.fencing_token() > a_token, "{mode:?}");
        // Both were woken by A's release; one asked Redis and queued behind B's hold, the
        // other waits behind it without a call.
        eventually_async("one local waiter queues in Redis", || async {
            queued_waiters(&server, &scene.hold_key).len() == 1
        })
        .await;
        eventually("the other waits behind it", || scene.a.stats().waiting == 2).await;
        assert_eq!(
            queued_waiters(&server, &scene.hold_key).len(),
            1,
            "{mode:?}: one envoy per process"
        );
        assert_eq!(
            scene.a.stats().attempts,
            attempts + 1,
            "{mode:?}: only the envoy asked"
        );
        let b_token = b_guard.fencing_token();
        b_guard.unlock().await.unwrap();
        for local in locals {
            let token = joined("A's waiting task", local).await.unwrap();
            assert!(token > b_token, "{mode:?}: after B");
        }
        shutdown(&scene.a).await;
        shutdown(&scene.b).await;
    }
}

/// Of two tasks of one process waiting for a lock another client holds, only the first (the
/// envoy) queues in Redis; when it goes away (cancelled), the other is woken, queues in its
/// place without waiting for the holder's lease (120 s, past the test's hang bound), and gets
/// the lock in its turn. A task with an owner, queued in Redis for itself ahead of both, is
/// no envoy and does not take the wakeup meant for the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_that_leaves_wakes_the_next_local_waiter_to_queue() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let test = "envoyleaves";
        let long = |mut config: Config| {
            config.watchdog_lease = Duration::from_secs(120);
            config.waiter_lease = Duration::from_secs(120);
            config
        };
        let a = connect(long(config(&server, test, mode))).await;
        let b = connect(long(config(&server, test, mode))).await;
        let b_guard = bounded("B locks", b.mutex(NAME).unwrap().lock())
            .await
            .unwrap();
        let hold_key = find_hold(&server, &prefix(test, mode), "mutex", NAME).expect("the hold");
        let owner = Owner::new();
        let owned_mutex = a.mutex(NAME).unwrap().with_owner(&owner);
        let owned = queue_lock(&server, &hold_key, owned_mutex, 1).await;
        let envoy = queue_lock(&server, &hold_key, a.mutex(NAME).unwrap(), 2).await;
        let queue_before = queued_waiters(&server, &hold_key);
        let attempts = a.stats().attempts;
        let other = {
            let mutex = a.mutex(NAME).unwrap();
            tokio::spawn(async move { mutex.lock().await })
        };
        eventually("all three wait", || a.stats().waiting == 3).await;
        assert_eq!(a.stats().attempts, attempts, "{mode:?}: no call of its own");
        assert_eq!(
            queued_waiters(&server, &hold_key),
            queue_before,
            "{mode:?}: one envoy queues"
        );

        envoy.abort();
        assert!(envoy.await.is_err_and(|e| e.is_cancelled()), "{mode:?}");
        eventually_async("the other task queues in the envoy's place", || async {
            let queue = queued_waiters(&server, &hold_key);
            queue.len() == 2 && queue[0] == queue_before[0] && queue[1] != queue_before[1]
        })
        .await;
        assert!(!other.is_finished(), "{mode:?}: B still holds the lock");

        let b_token = b_guard.fencing_token();
        b_guard.unlock().await.unwrap();
        let owned_guard = joined("the owned task gets the lock first", owned)
            .await
            .unwrap();
        assert!(owned_guard.fencing_token() > b_token, "{mode:?}");
        let owned_token = owned_guard.fencing_token();
        owned_guard.unlock().await.unwrap();
        let guard = joined("the other task gets the lock", other).await.unwrap();
        assert!(guard.fencing_token() > owned_token, "{mode:?}");
        guard.unlock().await.unwrap();
        assert!(queued_waiters(&server, &hold_key).is_empty(), "{mode:?}");
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// Client A, whose handles hand the lock on within the process (with a window a loaded machine
/// does not outlast; `adjust` changes more of its configuration), and client B, on one server.
async fn clients_within(
    server: &RedisServer,
    test: &str,
    mode: NotificationMode,
    adjust: impl FnOnce(&mut Config),
) -> (LockClient, LockClient) {
    let mut config_a = config(server, test, mode);
    config_a.handover_limit = Duration::from_secs(10);
    adjust(&mut config_a);
    (
        connect(config_a).await,
        connect(config(server, test, mode)).await,
    )
}

/// A second task of `client` that waits, locally, for `mutex`, which the first task holds.
async fn second_task(
    client: &LockClient,
    mutex: &fredlock::Mutex,
) -> JoinHandle<Result<MutexGuard>> {
    let mutex = mutex.clone();
    let task = tokio::spawn(async move { mutex.lock().await });
    eventually("the second task waits", || client.stats().waiting == 1).await;
    task
}

/// The first task's release hands the hold on to the second task without a call.
async fn hand_on(
    client: &LockClient,
    first: MutexGuard,
    second: JoinHandle<Result<MutexGuard>>,
) -> MutexGuard {
    let handed_before = client.stats().handed_locally;
    first.unlock().await.unwrap();
    let second = joined("the second task is handed the hold", second)
        .await
        .unwrap();
    assert_eq!(client.stats().handed_locally, handed_before + 1);
    second
}

/// Tasks of one client taking turns on a barging mutex through a handle without an owner pass
/// the hold on without a call (`Config::local_handover`, `src/engine/cohort.rs`): the hold in
/// Redis stays the first task's, each guard gets a token above the one before, another client
/// cannot take the lock meanwhile, and the release that finally lets the lock go in Redis
/// leaves the last token behind, so that the next take, by another client, goes above every
/// token handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_client_hand_the_hold_on_without_a_call() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (a, b) = clients_within(&server, "within", mode, |_| {}).await;
        let mutex = a.mutex(NAME).unwrap();
        let rival = b.mutex(NAME).unwrap();

        let first = bounded("the first task locks", mutex.lock()).await.unwrap();
        let hold_key = find_hold(&server, &prefix("within", mode), "mutex", NAME).unwrap();
        let take: Take = Arc::new(move || {
            let mutex = mutex.clone();
            Box::pin(async move { LockGuard::from(mutex.lock().await.unwrap()) })
        });
        let other = rival.clone();
        let intrudes: Intrudes = Arc::new(move || {
            let other = other.clone();
            Box::pin(async move { other.try_lock().await.unwrap().is_some() })
        });
        let rival: Take = Arc::new(move || {
            let rival = rival.clone();
            Box::pin(async move { LockGuard::from(rival.lock().await.unwrap()) })
        });
        let first = LockGuard::from(first);
        tasks_hand_the_hold_on(&server, &hold_key, &a, first, take, intrudes, rival).await;
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// Within a process the lock barges, with a bound: a task that releases and asks again takes
/// the lock straight back (without a call) while another task of its process has waited less
/// than a twentieth of `handover_limit` (here 500 ms); once that task has waited longer, the
/// release hands it the lock and the asking task waits for its turn.
#[tokio::test(flavor = "current_thread")]
async fn a_releasing_task_takes_the_lock_back_until_a_local_waiter_is_due() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (a, b) = clients_within(&server, "rebarge", mode, |_| {}).await;
        let mutex = a.mutex(NAME).unwrap();
        let first = bounded("the first task locks", mutex.lock()).await.unwrap();
        let second = second_task(&a, &mutex).await;

        // At once: the first task takes the lock back; the second one still waits.
        let before = a.stats();
        first.unlock().await.unwrap();
        let again = bounded("the first task locks again", mutex.lock())
            .await
            .unwrap();
        let after = a.stats();
        assert_eq!(after.handed_locally, before.handed_locally + 1, "{mode:?}");
        assert_eq!(after.attempts, before.attempts, "{mode:?}: no call");
        assert!(!second.is_finished(), "{mode:?}: the second task waits on");
        assert_eq!(a.stats().waiting, 1, "{mode:?}");

        // Past the second task's patience, the release hands it the lock.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let token = again.fencing_token();
        again.unlock().await.unwrap();
        let relock = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await })
        };
        let handed = joined("the second task is handed the lock", second)
            .await
            .unwrap();
        assert!(handed.fencing_token() > token, "{mode:?}");
        assert!(!relock.is_finished(), "{mode:?}: the first task waits now");
        let last = handed.fencing_token();
        handed.unlock().await.unwrap();
        let relocked = joined("the first task gets its turn", relock)
            .await
            .unwrap();
        assert!(relocked.fencing_token() > last, "{mode:?}");
        relocked.unlock().await.unwrap();
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// A loop's release is deferred lazily: the hold of a task that took it over from its own
/// deferred release is parked without a release task, the next `lock()` of the loop takes it
/// over without a call, and when the loop stops, the lock's turn timer releases the hold that
/// nobody took over, which grants the lock to the client queued behind it. A's lease outlasts
/// the test's patience, so only that timer can serve B here.
#[tokio::test(flavor = "current_thread")]
async fn a_loop_parks_its_releases_lazily_and_its_last_one_is_released_by_the_turn_timer() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (a, b) = clients_within(&server, "lazy", mode, |config| {
            config.watchdog_lease = Duration::from_secs(300);
        })
        .await;
        let mutex = a.mutex(NAME).unwrap();
        let first = bounded("A locks", mutex.lock()).await.unwrap();
        let hold_key = find_hold(&server, &prefix("lazy", mode), "mutex", NAME).unwrap();
        let b_task = queue_lock(&server, &hold_key, b.mutex(NAME).unwrap(), 1).await;
        eventually("A hears that B queued", || a.stats().queued_behind == 1).await;

        // A loop: unlock, lock, unlock, lock... Its first release is parked with a task of its
        // own; the holds taken over from then on are parked lazily.
        let mut guard = first;
        for turn in 0..3u64 {
            let token = guard.fencing_token();
            guard.unlock().await.unwrap();
            let stats = a.stats();
            assert_eq!(stats.deferred_releases, 1, "{mode:?}");
            assert_eq!(stats.deferred_lazily, turn, "{mode:?}");
            guard = bounded("A locks again", mutex.lock()).await.unwrap();
            assert!(guard.fencing_token() > token, "{mode:?}");
        }
        let stats = a.stats();
        assert_eq!(stats.taken_over, 3, "{mode:?}");
        assert_eq!(stats.handed_locally, 3, "{mode:?}: no call");
        assert!(!b_task.is_finished(), "{mode:?}: B waits");

        // The loop stops: its last release is parked lazily, and the turn timer lets it go.
        let last = guard.fencing_token();
        guard.unlock().await.unwrap();
        assert_eq!(a.stats().deferred_lazily, 3, "{mode:?}");
        let b_guard = joined("B is granted the lock", b_task).await.unwrap();
        assert!(b_guard.fencing_token() > last, "{mode:?}");
        assert_eq!(a.stats().deferred_releases, 0, "{mode:?}");
        assert_eq!(a.stats().held, 0, "{mode:?}");
        b_guard.unlock().await.unwrap();
        assert_eq!(hold_owner(&server, &hold_key), None, "{mode:?}");
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// A hold handed on within the process is renewed, and lost, as the hold in Redis it stands
/// on: its watchdog renews the first task's hold in Redis past several leases, and when
/// another client force-unlocks the lock, the handed-on guard hears that it lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_handed_on_within_the_process_is_renewed_and_lost_as_its_redis_hold() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let lease = |config: &mut Config| config.watchdog_lease = Duration::from_secs(2);
        let (a, b) = clients_within(&server, "withinlease", mode, lease).await;
        let mutex = a.mutex(NAME).unwrap();

        let first = bounded("the first task locks", mutex.lock()).await.unwrap();
        let hold_key = find_hold(&server, &prefix("withinlease", mode), "mutex", NAME).unwrap();
        let second = second_task(&a, &mutex).await;
        let second = hand_on(&a, first, second).await;

        // Past a lease and a half: renewed under the first task's hold in Redis.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(second.lost_cause(), None, "{mode:?}");
        assert!(hold_owner(&server, &hold_key).is_some(), "{mode:?}");

        let lost = second.lost();
        assert!(b.mutex(NAME).unwrap().force_unlock().await.unwrap());
        bounded("the handed-on guard hears it lost the lock", lost).await;
        drop(second);
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// A hold handed on within the process takes the token one above its predecessor's, not the
/// server clock: when the hold in Redis went away unbeknown to the client (here a forced unlock
/// by another client, which then takes the lock), the task handed the hold gets a token below
/// the new holder's, so a resource that checks tokens fences it out; its release leaves the
/// other client's hold alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_handed_on_after_its_redis_hold_went_away_is_fenced_out() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let (a, b) = clients_within(&server, "withingone", mode, |_| {}).await;
        let mutex = a.mutex(NAME).unwrap();

        let first = bounded("the first task locks", mutex.lock()).await.unwrap();
        let second = second_task(&a, &mutex).await;
        let rival = b.mutex(NAME).unwrap();
        assert!(rival.force_unlock().await.unwrap(), "{mode:?}");
        let taken = bounded("the other client locks", rival.lock())
            .await
            .unwrap();

        // A has not heard of it (no renewal is due yet): the release hands the hold on.
        let second = hand_on(&a, first, second).await;
        assert!(
            second.fencing_token() < taken.fencing_token(),
            "{mode:?}: a hold that was gone got a token above its new holder's"
        );
        // Its release (deferred: it was contended) finds the lock the other client's, and
        // leaves it so.
        second.unlock().await.unwrap();
        eventually("the release is sent", || a.stats().deferred_releases == 0).await;
        let hold_key = find_hold(&server, &prefix("withingone", mode), "mutex", NAME).unwrap();
        let holder = hold_owner(&server, &hold_key);
        assert_eq!(holder.as_deref(), Some(taken.owner().id()), "{mode:?}");
        taken.unlock().await.unwrap();
        shutdown(&a).await;
        shutdown(&b).await;
    }
}

/// A hold granted from the queue is handed on within its process like a hold its process
/// took: the window of hand-overs without a call counts from the grant's arrival, not from the
/// waiter's attempt long before it, and a short grant (its lease min(lease, waiter_lease)) may
/// be handed on. Otherwise a process granted the lock under a long queue passes it straight
/// back to the queue, and the mutex serves strictly in turn, one hand-off between processes
/// per acquisition.
#[tokio::test(flavor = "current_thread")]
async fn a_hold_granted_from_the_queue_is_handed_on_without_a_call() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let test = "grantedwithin";
        let mut config_b = config(&server, test, mode);
        // Windows of at most a second; grants of 6 s, a fifth of the 30 s lease.
        config_b.handover_limit = Duration::from_secs(2);
        config_b.waiter_lease = Duration::from_secs(6);
        let a = connect(config(&server, test, mode)).await;
        let b = connect(config_b).await;
        let c = connect(config(&server, test, mode)).await;

        let a_guard = bounded("A locks", a.mutex(NAME).unwrap().lock())
            .await
            .unwrap();
        let hold_key = find_hold(&server, &prefix(test, mode), "mutex", NAME).unwrap();
        let mutex = b.mutex(NAME).unwrap();
        let b_task = queue_lock(&server, &hold_key, mutex.clone(), 1).await;
        let c_task = queue_lock(&server, &hold_key, c.mutex(NAME).unwrap(), 2).await;
        // B's attempt was sent longer than a window ago when the grant arrives.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        a_guard.unlock().await.unwrap();
        let granted = joined("B is granted the lock", b_task).await.unwrap();
        assert_eq!(b.stats().granted, 1, "{mode:?}");

        // C still waits behind it: the release is deferred, and the next lock() of B takes
        // the hold over without a call.
        let before = b.stats();
        let token = granted.fencing_token();
        granted.unlock().await.unwrap();
        let again = bounded("B locks again", mutex.lock()).await.unwrap();
        let after = b.stats();
        assert_eq!(
            after.handed_locally,
            before.handed_locally + 1,
            "{mode:?}: {after:?}"
        );
        assert_eq!(after.attempts, before.attempts, "{mode:?}");
        assert_eq!(again.fencing_token(), token + 1, "{mode:?}");
        assert!(!c_task.is_finished(), "{mode:?}: C still waits");

        again.unlock().await.unwrap();
        let c_guard = joined("C is granted the lock", c_task).await.unwrap();
        assert!(c_guard.fencing_token() > token + 1, "{mode:?}");
        c_guard.unlock().await.unwrap();
        for client in [&a, &b, &c] {
            shutdown(client).await;
        }
    }
}
