//! Releases: `unlock()` and dropped guards (through the release worker) end here, and so do
//! the two ways an exclusive lock passes the lock to another task of its own process without
//! letting it go in Redis (the hand-over: a barging [`crate::Mutex`] and an
//! [`crate::RwLock`]'s writers).
//!
//! * **Hand-over to a waiting task.** A task of this client already waits for the lock: the
//!   release claims it ([`crate::notify::WaiterTable::claim_handover`]) and its script writes
//!   the hold in that task's name while it frees the lock, so the waiter returns from `lock()`
//!   without a call of its own.
//! * **Deferred release** ([`crate::Config::defer_release`]). Nobody of this client waits yet,
//!   but the releasing task usually asks again at once (a worker loop): the hold is parked here
//!   (in the engine's [`ParkedHolds`](super::parked::ParkedHolds)) until the releasing task
//!   next yields to the scheduler instead of being released. An
//!   acquisition of this client that finds it parked ([`take_parked`]) names itself the
//!   successor of its release: one script call both ends the old hold and starts its own,
//!   where a release and an acquire would take two. The call is sent by the hold's release
//!   task, spawned when the hold was parked, which the acquisition then waits for; with
//!   nobody to take the hold over, that task just releases it. A loop's holds are parked
//!   lazily, without that task (see [`super::parked`]): the acquisition sends the call itself,
//!   and the lock's turn timer releases a hold nobody took over.
//!
//! Why the parked hold's own task sends the take-over, not the acquisition: tokio runs a task
//! spawned by a worker in that worker's next slot (its LIFO slot), and waking fred's router
//! task for a command pushes whatever sits in that slot to the run queue and wakes an idle
//! worker thread to steal it. Had the acquisition sent the call, every take-over would wake a
//! second thread (a futex call and two context switches) just to find the release task with
//! nothing left to do. Run by the release task itself, the call finds the slot empty. (That
//! task cannot be stolen from the slot either: an acquisition that sees it not started within
//! `TAKE_OVER_GRACE` sends the call itself.)
//!
//! Both are bounded by [`crate::Config::handover_limit`] in the release script itself: once the
//! waiter queued longest in Redis (another process's, as a rule) has waited that long, the
//! script grants the lock to it instead (`lua/hold_release.lua`). That is eventual fairness
//! in the manner of `parking_lot`: barging within a process for throughput, a forced hand-off
//! to the queue to bound every wait.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::cohort;
use super::parked::{Asked, TakeOver, TURN_TIMER_CAP};
use super::{Driver, DriverHold, Released, Successor};
use crate::error::{Backoff, NotHeldReason, Result};
use crate::notify::{Bid, Claim, HandedOver, WakeRule};
use crate::owner::{op_id, Owner};

/// A hold is deferred, or handed on without a call (`cohort`), only with at least this much of
/// its lease left: the release that ends it must run well before Redis would drop it by itself.
pub(super) const DEFER_MIN_LEFT: Duration = Duration::from_millis(200);

/// How long a task of this client may wait for a lock that other tasks of the client keep
/// taking straight back (barging) before a release hands it the lock: a twentieth of the
/// hand-over limit (1 ms by default), as `parking_lot` forces a hand-off to a waiter that
/// waited about half a millisecond. The clock restarts at each such hand-over, so the tasks of
/// a process take the lock in runs of about this long, in the order they began to wait.
pub(super) fn local_patience(handover_limit: Duration) -> Duration {
    handover_limit / LOCAL_PATIENCE_SHARE
}

/// See [`local_patience`].
const LOCAL_PATIENCE_SHARE: u32 = 20;

/// How long an acquisition that asked for a parked hold waits for the hold's task to start
/// sending the take-over (it starts as soon as the releasing task yields) before it sends the
/// call itself: bounds the wait when the releasing task keeps its worker busy.
const TAKE_OVER_GRACE: Duration = Duration::from_millis(2);

/// A follower without a deadline waits at most this long for the release ahead of it (which
/// its retries bound by the hold's lease anyway).
const NO_GIVE_UP: Duration = Duration::from_secs(3600);

/// The release worker: runs the releases of dropped guards concurrently, drains its queue on
/// shutdown, and exits when the last sender is gone.
pub(crate) async fn run_release_worker(
    mut jobs: mpsc::UnboundedReceiver<Arc<DriverHold>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => { running.spawn(release_dropped(job)); }
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
            _ = shutdown.changed() => {
                while let Ok(job) = jobs.try_recv() {
                    running.spawn(release_dropped(job));
                }
                break;
            }
        }
    }
    while running.join_next().await.is_some() {}
}

/// Releases one level of `hold` (for `unlock()` and dropped guards), or defers the release
/// when that level is the hold's last (see the module docs): then it returns at once, as
/// released.
///
/// The release call's future is boxed: a task that awaits `lock()` and then `unlock()` is as
/// large as the larger of the two futures for as long as it lives, waiting included, and the
/// call's future (a script call through fred) is several times a waiting `lock()`'s.
pub(crate) async fn release_hold(hold: &Arc<DriverHold>) -> Result<Released> {
    if defer(hold) {
        return Ok(Released::Yes {
            remaining: 0,
            successor: Successor::Passed,
        });
    }
    Box::pin(release_now(hold)).await
}

/// Parks `hold` instead of releasing it, if it may be: a barging mutex's last level, contended
/// (in Redis, or by a task of this client), its lease intact with time to spare, no task of
/// this client that has waited [`local_patience`] for it (that one is handed the lock at
/// once), the client open and inside a runtime. A background task releases it once the
/// releasing task yields (handing it to a local waiter, if one waits), unless an acquisition
/// took it over meanwhile.
fn defer(hold: &Arc<DriverHold>) -> bool {
    let driver = &hold.lock;
    let core = driver.engine();
    if !driver.defers_releases() {
        return false;
    }
    let local = core.waiters.handover_due(
        driver.keys().id(),
        hold.owner.id(),
        local_patience(core.ctx.config.handover_limit),
    );
    let deferrable = (hold.is_contended() || local.is_some())
        && local != Some(true)
        && hold.guards() == 0
        && hold.lost_cause().is_none()
        && hold.deadline() > Instant::now() + DEFER_MIN_LEFT
        && core.ctx.check_open().is_ok();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    // A hold its task took over from its own deferred release (a loop) is parked lazily while
    // it may still pass on within the process: that task will likely ask again at once (see
    // `super::parked`). Not a fair lock's: its queue is served at once.
    let passes_on = driver
        .handover()
        .is_some_and(|handover| handover.hands_over_locally());
    let window = if passes_on && hold.was_retaken() {
        cohort::window_left(hold)
    } else {
        Duration::ZERO
    };
    let lazily = !window.is_zero();
    if !deferrable || !core.parked.park(hold, lazily) {
        return false;
    }
    // Others wait for the lock: its next calls go through the full scripts
    // (`crate::engine::contention`).
    core.contention.contended(driver.keys().id());
    tracing::trace!(
        lock = driver.keys().name(),
        token = hold.token,
        lazily,
        "release deferred"
    );
    if lazily {
        core.ctx.deferred_lazily.fetch_add(1, Ordering::Relaxed);
        let at = Instant::now() + window.min(TURN_TIMER_CAP);
        core.parked.arm(driver.keys().id(), at, || {
            Waker::from(Arc::new(TurnTimer {
                runtime: runtime.clone(),
                lock: driver.clone(),
            }))
        });
    } else {
        // The spawned task runs once the releasing task yields (tokio runs a task spawned by
        // a worker in that worker's next slot, without waking another worker): a task that
        // asks for the lock again before its next await names itself the successor first, and
        // this task sends the release that hands it the lock. No `yield_now` here: on a
        // multi-threaded runtime each one would wake an idle worker thread.
        runtime.spawn(run_parked(hold.clone()));
    }
    true
}

/// The release task of a parked hold: sends the release, naming the acquisition that asked
/// for the hold meanwhile, if one did; nothing when the hold was taken over without a call.
async fn run_parked(hold: Arc<DriverHold>) {
    let parked = &hold.lock.engine().parked;
    match parked.start(&hold) {
        Some(Some(take_over)) => hand_parked_over(&hold, take_over).await,
        Some(None) => release_parked(&hold).await,
        None => return,
    }
    parked.finish(&hold);
}

/// What a lock's turn timer wakes when it fires (see `super::parked`): the release task of
/// the lock's lazily parked hold, if nobody took it over.
struct TurnTimer {
    runtime: tokio::runtime::Handle,
    lock: Arc<dyn Driver>,
}

impl Wake for TurnTimer {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let lock = self.lock.clone();
        self.runtime.spawn(async move {
            let lazy = lock.engine().parked.lazy_release(lock.keys().id());
            if let Some(hold) = lazy {
                run_parked(hold).await;
            }
        });
    }
}

/// Sends the release of a parked hold naming the acquisition that asked to take it over, and
/// tells it the outcome. A failed call is no one's release any more once the acquisition gave
/// up on it: the hold's release then goes on here.
async fn hand_parked_over(hold: &Arc<DriverHold>, take_over: TakeOver) {
    let TakeOver {
        waiter,
        bid,
        give_up,
        reply,
    } = take_over;
    let outcome = release_with_retries(hold, Some((&waiter, &bid)), give_up).await;
    let failed = outcome.is_err();
    // The acquisition's side (`take_parked`, inside a `Finish`) outlives its caller, so the
    // outcome is always heard; a send fails only when the runtime is going away.
    let _ = reply.send(outcome);
    if failed {
        release_parked(hold).await;
    }
}

/// Sends the release of a parked hold nobody took over.
async fn release_parked(hold: &Arc<DriverHold>) {
    let lock = hold.lock.keys().name();
    match release_now(hold).await {
        Ok(outcome) => tracing::debug!(lock, token = hold.token, ?outcome, "released (deferred)"),
        Err(error) => {
            tracing::warn!(lock, %error, "deferred release failed; the lease will expire")
        }
    }
}

/// Takes over the parked hold of `driver`'s lock, if this client has one: one release call
/// that names the acquisition (`waiter`, `bid`) its successor, sent by the hold's release task
/// (see the module docs). The hold is handed over unless the queue's turn came: the release
/// then granted the lock to the waiter queued longest and queued the acquisition behind it
/// ([`Successor::Queued`]). None when there was no parked hold, it was gone, or it was
/// released without its successor (shutdown). Transient failures are retried with the same op
/// id, like any release, until `give_up` (the acquisition's patience); after that, the old
/// hold's release goes on by itself.
pub(crate) async fn take_parked(
    driver: &Arc<dyn Driver>,
    waiter: &Arc<str>,
    bid: &Bid,
    give_up: Option<Instant>,
) -> Option<Result<Successor>> {
    let parked = &driver.engine().parked;
    let lock_id = driver.keys().id();
    let outcome = match parked.ask(lock_id, waiter, bid, give_up)? {
        // Parked lazily: no task of its own sends the release.
        Asked::Release(hold) => take_over_now(hold, waiter, bid, give_up).await,
        Asked::Follower(done) => {
            // Someone else's release of the hold is on its way: ask Redis once it is done.
            let until = give_up.unwrap_or_else(|| Instant::now() + NO_GIVE_UP);
            let _ = tokio::time::timeout_at(until, done).await;
            return None;
        }
        Asked::Successor(mut reply) => {
            let grace = give_up.map_or(TAKE_OVER_GRACE, |at| {
                TAKE_OVER_GRACE.min(at.saturating_duration_since(Instant::now()))
            });
            match tokio::time::timeout(grace, &mut reply).await {
                Ok(outcome) => outcome.ok()?,
                Err(_) => match parked.withdraw(lock_id, waiter) {
                    // The hold's task took it: the call is on its way.
                    None => reply.await.ok()?,
                    Some(hold) => take_over_now(hold, waiter, bid, give_up).await,
                },
            }
        }
    };
    match outcome {
        Ok(Released::Yes { successor, .. }) => Some(Ok(successor)),
        Ok(Released::NotHeld(_)) => None,
        // The acquisition gives up on it; the old hold's release goes on by itself (a release
        // that did run is answered as not held: the hold moved on).
        Err(error) => Some(Err(error)),
    }
}

/// The parked hold's task did not start within [`TAKE_OVER_GRACE`] (the releasing task kept
/// its worker busy), or it has none (parked lazily): the acquisition sends the take-over
/// itself.
async fn take_over_now(
    hold: Arc<DriverHold>,
    waiter: &str,
    bid: &Bid,
    give_up: Option<Instant>,
) -> Result<Released> {
    let outcome = release_with_retries(&hold, Some((waiter, bid)), give_up).await;
    let parked = &hold.lock.engine().parked;
    if outcome.is_ok() {
        parked.finish(&hold);
    } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            release_parked(&hold).await;
            hold.lock.engine().parked.finish(&hold);
        });
    }
    outcome
}

/// Releases one level of `hold` now. A barging mutex's release may hand the lock straight to a
/// waiting task of this client: the first local waiter that can take it is claimed before the
/// call, told the new token if the script handed it the lock, and released again here if it
/// went away meanwhile.
pub(crate) async fn release_now(hold: &DriverHold) -> Result<Released> {
    let driver = &hold.lock;
    let mut claim = if driver.handover().is_some() {
        let waiters = &driver.engine().waiters;
        waiters.claim_handover(driver.keys().id(), hold.owner.id())
    } else {
        None
    };
    if let Some(waiter) = claim.take() {
        let (id, bid) = waiter.bid();
        match cohort::hand_over(hold, id, &bid.owner, bid.lease) {
            // Handed over without a call: the hold in Redis stays as it is.
            Some(handed) => {
                let (token, queued, quiet) = (handed.token, handed.queued, handed.quiet);
                if waiter.deliver(handed) {
                    tokio::task::yield_now().await;
                    return Ok(Released::Yes {
                        remaining: 0,
                        successor: Successor::HandedOver {
                            token,
                            queued,
                            quiet,
                        },
                    });
                }
                // The waiter went away: the hold goes back to Redis.
                let outcome = release_with_retries(hold, None, None).await;
                wake_local_waiters(driver.as_ref());
                return outcome;
            }
            None => claim = Some(waiter),
        }
    }
    let sent_at = Instant::now();
    let successor = claim.as_ref().map(Claim::bid);
    let outcome = release_with_retries(hold, successor, None).await;
    if let Some(claim) = claim.take() {
        settle_claim(driver, claim, &outcome, sent_at).await;
    }
    outcome
}

/// One release call for `hold`, naming `successor` (if any), retried as
/// [`release_retrying`] says until the hold's lease would have ended.
async fn release_with_retries(
    hold: &DriverHold,
    successor: Option<(&str, &Bid)>,
    give_up: Option<Instant>,
) -> Result<Released> {
    let lease_end = hold.deadline();
    release_retrying(
        &hold.lock,
        &hold.redis.owner,
        hold.redis.token,
        floor(hold),
        lease_end,
        successor,
        give_up,
    )
    .await
}

/// The token a release of `hold` names as the floor of the lock's next ones: its own, when
/// the hold was handed over within the process (its Redis hold carries an older one).
fn floor(hold: &DriverHold) -> Option<u64> {
    (hold.token != hold.redis.token).then_some(hold.token)
}

/// One release call, without retries, of the Redis hold of `owner` with `token` (of every
/// re-entered hold with `all`), naming `floor` (see
/// [`HandOver::release_to`](super::HandOver::release_to)) if the hold was handed over within
/// the process.
pub(crate) async fn release_in_redis(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    token: u64,
    floor: Option<u64>,
    op: &str,
    all: bool,
) -> Result<Released> {
    match (floor, driver.handover()) {
        (Some(_), Some(handover)) => handover.release_to(owner, token, floor, op, None).await,
        _ => driver.release(owner, token, op, all).await,
    }
}

/// [`release_in_redis`] for a hold of this client's registry.
pub(crate) async fn release_hold_in_redis(
    hold: &DriverHold,
    op: &str,
    all: bool,
) -> Result<Released> {
    release_in_redis(
        &hold.lock,
        &hold.redis.owner,
        hold.redis.token,
        floor(hold),
        op,
        all,
    )
    .await
}

/// One release call for the hold of `owner` with `token` through `driver` (a hold of this
/// client, or one instance's share of a [`crate::Redlock`] hold), naming `successor` (if any).
/// A transient failure (timeout, broken connection, failover) is retried with the same op id,
/// so a release that did run is answered, not applied twice, until `lease_end`, when the hold
/// would have ended anyway; a hold whose lease is over by then is reported as expired.
///
/// `give_up`: an acquisition taking the hold over stops retrying at its own deadline (and
/// returns the error).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn release_retrying(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    token: u64,
    floor: Option<u64>,
    lease_end: Instant,
    successor: Option<(&str, &Bid)>,
    give_up: Option<Instant>,
) -> Result<Released> {
    let op = op_id();
    let mut backoff = Backoff::default();
    let lock = driver.keys().name();
    loop {
        // A successor is named by a hand-over or a take-over; without one, a lock that hands
        // over still may (to a local waiter claimed by the script's reply).
        let via = if successor.is_some() {
            driver.take_over()
        } else {
            driver.handover()
        };
        let outcome = match via {
            Some(handover) => {
                handover
                    .release_to(owner, token, floor, &op, successor)
                    .await
            }
            None => driver.release(owner, token, &op, false).await,
        };
        match outcome {
            Err(error)
                if error.is_retryable()
                    && !matches!(give_up, Some(at) if Instant::now() + backoff.peek() >= at) =>
            {
                if Instant::now() + backoff.peek() >= lease_end {
                    // The lease is over: Redis drops the hold by itself (at the latest when its
                    // TTL, which this client no longer extends, runs out).
                    tracing::debug!(lock, %error, "release failed past the lease; the hold expires");
                    return Ok(Released::NotHeld(NotHeldReason::Expired));
                }
                tracing::debug!(lock, %error, "release failed; retrying");
                tokio::time::sleep(backoff.next_pause()).await;
            }
            other => return other,
        }
    }
}

/// Tells a claimed waiter how the release went: handed the lock (or, if it went away
/// meanwhile, the hold is released again here), not handed it, or unknown (an error: the
/// waiter re-checks, and its attempt is answered if it did get the lock). A release that fred
/// re-sent after a broken connection still reports the hand-over it made (`hold_release.lua`).
async fn settle_claim(
    driver: &Arc<dyn Driver>,
    claim: Claim,
    outcome: &Result<Released>,
    sent_at: Instant,
) {
    match outcome {
        Ok(Released::Yes {
            successor:
                Successor::HandedOver {
                    token,
                    queued,
                    quiet,
                },
            ..
        }) => {
            let owner = claim.bid().1.owner.clone();
            let token = *token;
            let handed = HandedOver {
                token,
                at: sent_at,
                queued: *queued,
                quiet: *quiet,
                within: None,
            };
            if claim.deliver(handed) {
                // Let the new holder run before the releasing task goes on (typically with a
                // command of its own, whose send would take the worker's next slot first).
                tokio::task::yield_now().await;
            } else {
                let undone = driver.release(&owner, token, &op_id(), false).await;
                tracing::debug!(
                    lock = driver.keys().name(),
                    ?undone,
                    "released a hand-over to a waiter that went away"
                );
                wake_local_waiters(driver.as_ref());
            }
        }
        // Not handed over: the lock went to the Redis queue (the release grants it there when
        // it does not hand it over). The local waiters without a place in that queue (waiting
        // on this process's hold alone) ask Redis at once; those queued there wait for their
        // grant, which an event brings, instead of asking for nothing.
        Ok(Released::Yes { remaining: 0, .. }) => {
            // The claimed waiter too, if it is not queued: woken once, by the call below (a
            // second wakeup after it had already asked would make it ask again).
            let queued = &driver.engine().queued;
            claim.cancel(false);
            driver
                .engine()
                .waiters
                .wake_unqueued(driver.keys().id(), |id| queued.contains(id));
        }
        // Unknown outcome: every local waiter re-checks. A release that left holds of the
        // owner changed nothing.
        Ok(Released::NotHeld(_)) | Err(_) => {
            claim.cancel(true);
            wake_local_waiters(driver.as_ref());
        }
        Ok(_) => claim.cancel(false),
    }
}

/// Wakes every local waiter of `driver`'s lock to ask Redis: after a release of this client
/// that handed the lock to none of them, since a waiter that waited on this client's hold
/// alone (`wait_first` in `engine/acquire.rs`) has no place in the Redis queue and hears no event.
pub(crate) fn wake_local_waiters(driver: &dyn Driver) {
    driver
        .engine()
        .waiters
        .dispatch(driver.keys().id(), &WakeRule::All);
}

async fn release_dropped(hold: Arc<DriverHold>) {
    let lock = hold.lock.keys().name();
    match release_hold(&hold).await {
        Ok(outcome) => tracing::debug!(lock, token = hold.token, ?outcome, "released on drop"),
        Err(error) => tracing::warn!(lock, %error, "release on drop failed; the lease will expire"),
    }
}
