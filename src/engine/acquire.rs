//! The acquire-and-wait loop under every lock type ([`acquire`]): a [`Driver`] answers one
//! attempt at a time; the loop registers the local waiter, waits for a wakeup, takes up a hold
//! a release granted or handed over, and adopts the hold for the watchdog:
//!
//! ```text
//!   register local waiter ──► try (script) ──► acquired? ──yes──► adopt the hold, return it
//!          ▲                                      │ no
//!          └──── woken by an event, or the ◄──────┘ wait(min(event, holder's ttl, deadline))
//!                holder's ttl ran out
//! ```
//!
//! ## Cancellation
//!
//! Dropping the future returned by [`acquire`] at any point leaves nothing behind: the local
//! waiter entry is removed (a wakeup it had received is passed on), a script call already in
//! flight is finished by a background task that releases the lock if the call acquired it, and
//! a driver that queues waiters in Redis is told to leave the queue.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::cohort;
use super::envoy::EnvoyTurn;
use super::release::{take_parked, wake_local_waiters};
use super::{Attempt, Driver, DriverHold, Successor};
use crate::config::{check_duration, MAX_DURATION};
use crate::context::BoxFuture;
use crate::error::{Backoff, Error, Result};
use crate::lease::{renew_holds, Lease, RedisHold};
use crate::notify::{Bid, Granted, HandedOver, Registration};
use crate::owner::{op_id, OpId, Owner};

/// How long an acquisition may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// One attempt, no waiting (`try_lock`).
    None,
    /// Wait until this instant (`lock_timeout`).
    Until(Instant),
    /// Wait as long as it takes (`lock`).
    Forever,
}

impl Patience {
    /// The patience of a call given `timeout`: one attempt for zero, else until `timeout`
    /// from now (at most [`MAX_DURATION`]). Fails for a duration out of range.
    pub(crate) fn within(timeout: Duration) -> Result<Patience> {
        if timeout.is_zero() {
            return Ok(Patience::None);
        }
        check_duration("timeout", timeout, Duration::from_nanos(1))?;
        Ok(Patience::Until(Instant::now() + timeout.min(MAX_DURATION)))
    }

    /// What one step of a wait made of several (a member of a multi-lock) may wait: None
    /// forever, `Some(ZERO)` one attempt (also once the deadline passed).
    pub(crate) fn left(self) -> Option<Duration> {
        match self {
            Patience::None => Some(Duration::ZERO),
            Patience::Forever => None,
            Patience::Until(deadline) => Some(deadline.saturating_duration_since(Instant::now())),
        }
    }

    /// Whether no more waiting is allowed: a try, or a deadline that passed.
    pub(crate) fn is_over(self) -> bool {
        self.left() == Some(Duration::ZERO)
    }

    /// How long to wait for at most `bound`: None when the deadline has passed.
    pub(crate) fn wait_limit(self, bound: Duration) -> Option<Duration> {
        match self {
            Patience::None => Some(Duration::ZERO),
            Patience::Forever => Some(bound),
            Patience::Until(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| bound.min(left))
            }
        }
    }
}

/// A barging mutex (or a read-write lock's write side) held by this client for another owner
/// (a hold of the same role in the registry, or one that a release of this process is
/// handing, or just handed, to a local waiter that has not taken it up yet): its release will
/// hand the lock to this waiter, or wake it to ask Redis (the queue's turn), so the waiter
/// waits without a call of its own first, at most until that hold's lease deadline. (A release in flight that hands the lock to nobody wakes every local
/// waiter.)
fn wait_first(driver: &Arc<dyn Driver>, owner: &Owner, patience: Patience) -> Option<Duration> {
    driver.handover()?;
    let engine = driver.engine();
    let lock_id = driver.keys().id();
    // Only a hold of the same role hands over (a writer does not wait on a read hold here).
    let held = engine
        .holds
        .held_by_other(lock_id, driver.hold_role(), owner);
    let handed = engine.waiters.handing_to_other(lock_id, owner.id());
    let holder_deadline = held.into_iter().chain(handed).min()?;
    patience.wait_limit(holder_deadline.saturating_duration_since(Instant::now()))
}

/// Acquires through `driver`: the hold, adopted for the watchdog with one guard, which the
/// caller wraps in its guard at once; `Ok(None)` when the patience ran out.
///
/// Not an `async fn`: the returned future is the loop itself, without a wrapper that would
/// keep a second copy of the arguments. A pending `lock()` future is a waiting task's main
/// memory cost, so its size matters (see `docs/benchmarks.md`, S4).
pub(crate) fn acquire(
    driver: Arc<dyn Driver>,
    owner: Owner,
    lease: Lease,
    patience: Patience,
) -> impl Future<Output = Result<Option<Arc<DriverHold>>>> + Send + 'static {
    let keys = driver.keys();
    let span = tracing::debug_span!("acquire", lock = keys.name(), kind = keys.kind());
    let run = if driver.engine().ctx.config.replica_acks == 0 {
        Acquire::Plain {
            run: acquire_loop(driver, owner, lease, patience),
        }
    } else {
        Acquire::Replicated {
            run: Box::pin(acquire_replicated(driver, owner, lease, patience)),
        }
    };
    run.instrument(span)
}

pin_project_lite::pin_project! {
    /// The acquisition's future: the loop itself, or (with replica acknowledgements) the loop
    /// repeated while a hold is refused for want of them, boxed. An `async fn` choosing between
    /// the two would keep its own copy of the arguments beside the loop's, for the whole wait.
    #[project = AcquireProjection]
    enum Acquire<P, R> {
        Plain { #[pin] run: P },
        Replicated { #[pin] run: R },
    }
}

impl<P, R, T> Future for Acquire<P, R>
where
    P: Future<Output = T>,
    R: Future<Output = T>,
{
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.project() {
            AcquireProjection::Plain { run } => run.poll(cx),
            AcquireProjection::Replicated { run } => run.poll(cx),
        }
    }
}

/// [`acquire_loop`], repeated while a hold is refused for want of replica acknowledgements
/// ([`Error::NotReplicated`], only with [`crate::Config::replica_acks`]): like any transient
/// failure, within [`crate::Config::transient_retry`] and the caller's patience. Each round
/// starts over (the refused hold was released).
async fn acquire_replicated(
    driver: Arc<dyn Driver>,
    owner: Owner,
    lease: Lease,
    patience: Patience,
) -> Result<Option<Arc<DriverHold>>> {
    let mut retry = TransientRetry::default();
    loop {
        match Box::pin(acquire_loop(driver.clone(), owner.clone(), lease, patience)).await {
            Err(error @ Error::NotReplicated { .. }) => {
                let window = driver.engine().ctx.config.transient_retry;
                let Some(pause) = retry.pause_after(&error, window, patience) else {
                    return Err(error);
                };
                tracing::debug!(%error, pause_ms = pause.as_millis() as u64, "hold not replicated; retrying");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// Not an `async fn`, for the same reason as [`acquire`]: an `async fn` moves its arguments
/// into locals of its own and keeps both copies in its state; the block uses them in place.
#[allow(clippy::manual_async_fn)] // on purpose: see above
fn acquire_loop(
    driver: Arc<dyn Driver>,
    owner: Owner,
    lease: Lease,
    patience: Patience,
) -> impl Future<Output = Result<Option<Arc<DriverHold>>>> + Send + 'static {
    async move {
        driver.engine().ctx.check_open()?;
        let waiting = patience != Patience::None;
        let waiter = driver.waiter_id();
        let registration = waiting.then(|| {
            let bid = driver.handover().is_some().then(|| Bid {
                owner: owner.clone(),
                lease: lease.initial(),
                joins_queue: false,
            });
            driver
                .engine()
                .waiters
                .register(driver.keys().id(), Some(waiter.clone()), bid)
        });
        let _unused = UnusedHandOver {
            registration: registration.as_ref(),
            driver: &driver,
        };
        let mut queued = QueuedInRedis::new(&driver, &waiter);
        // Declared after the registration: dropped first, so a wakeup it sends the local
        // waiters when it leaves is passed on if it lands on this one (`Registration`'s drop).
        let envoy_eligible =
            registration.is_some() && driver.handover().is_some() && owner.is_anonymous();
        let mut envoy = EnvoyTurn::new(&driver, &waiter, envoy_eligible);
        let mut retry = TransientRetry::default();
        let mut op = OpId::next();
        // Whether the coming attempt answers a wakeup (see `Registration::hand_on_wakeup`).
        let mut woken = false;
        // When the last busy attempt was sent, and the holder's token it saw: dates a grant.
        let mut last_busy: Option<(Instant, u64)> = None;

        // The first wait may come before any attempt: after a take-over that found the queue's
        // turn (it queued this waiter), or behind a hold of this client (see `wait_first`).
        let mut first_wait = None;
        if let Some(hold) = cohort::take_parked(&driver, &waiter, &owner, lease) {
            // A release of this client was deferred, and its hold is handed on without a call.
            if let Some(registration) = registration.as_ref() {
                registration.taken();
            }
            let ctx = &driver.engine().ctx;
            ctx.taken_over.fetch_add(1, Ordering::Relaxed);
            hold.mark_retaken();
            return Ok(Some(hold));
        }
        if driver.engine().parked.parked_for(driver.as_ref()) {
            // A release of this client is deferred for a task that asks right after it: this one.
            let sent_at = Instant::now();
            match Box::pin(take_over(&driver, &owner, &waiter, lease, patience)).await {
                Some(Successor::HandedOver {
                    token,
                    queued: behind,
                    quiet,
                }) => {
                    if let Some(registration) = registration.as_ref() {
                        registration.taken();
                    }
                    tracing::trace!(token, "took over a deferred release");
                    let ctx = &driver.engine().ctx;
                    ctx.taken_over.fetch_add(1, Ordering::Relaxed);
                    let timing = (sent_at, lease.initial());
                    let source = Source::OwnConnection {
                        queued: behind,
                        quiet,
                    };
                    let hold = take_up(&driver, &owner, token, lease, timing, source, &mut queued);
                    let hold = Box::pin(hold).await?;
                    hold.mark_retaken();
                    return Ok(Some(hold));
                }
                Some(Successor::Queued { ttl, token }) => {
                    driver.engine().contention.contended(driver.keys().id());
                    last_busy = Some((sent_at, token));
                    queued.joined();
                    envoy.queued_by_take_over(sent_at, ttl);
                    let Some(limit) = patience.wait_limit(ttl) else {
                        queued.leave().await;
                        return Ok(None);
                    };
                    first_wait = Some(limit);
                }
                Some(Successor::Passed) | None => {}
            }
        }
        if first_wait.is_none() && registration.is_some() {
            first_wait = wait_first(&driver, &owner, patience);
        }

        loop {
            // The wait's limit lives in this block only: a local that lives across the wait's
            // `await` keeps a slot of its own in every state of the coroutine.
            let (registration, wait) = {
                let limit = if let Some(limit) = first_wait.take() {
                    limit
                } else if let Some(limit) = envoy.wait_behind(|bound| patience.wait_limit(bound)) {
                    tracing::trace!("waiting behind this process's envoy");
                    limit
                } else {
                    // The attempt's outcome is read in a block of its own, with no `await`: a
                    // local that lives across an `await` keeps a slot of its own in every state of
                    // the coroutine, waiting included.
                    let step = {
                        let sent_at = Instant::now();
                        // The slot first, and only then the attempt's boxed future: a burst of
                        // many acquisitions waits for slots without a box each, which would be
                        // freed memory scattered between the waiting tasks once they ran. (The
                        // semaphore is never closed.)
                        let slot = driver
                            .engine()
                            .attempt_slots
                            .clone()
                            .acquire_owned()
                            .await
                            .map_err(|_| Error::Shutdown)?;
                        let attempt = Box::pin(attempt(
                            slot,
                            &driver,
                            &owner,
                            &waiter,
                            &op.text(),
                            lease.initial(),
                            waiting,
                        ))
                        .await;
                        match attempt {
                            Ok(Attempt::Acquired { token, lasts }) => Step::Acquired {
                                token,
                                lasts,
                                sent_at,
                            },
                            Ok(Attempt::Busy { ttl, token }) => {
                                retry.reset();
                                op = OpId::next();
                                last_busy = token.map(|token| (sent_at, token));
                                if waiting {
                                    queued.joined();
                                }
                                let ttl = ttl.unwrap_or(driver.engine().ctx.config.watchdog_lease);
                                envoy.heard(sent_at, ttl);
                                if patience == Patience::None {
                                    return Ok(None);
                                }
                                match patience.wait_limit(ttl) {
                                    Some(limit) => Step::Wait(limit),
                                    None => Step::GiveUp,
                                }
                            }
                            // Repeat the same op after a pause: if the failed call was applied after
                            // all, the script answers it instead of applying it again.
                            Err(error) => {
                                let window = driver.engine().ctx.config.transient_retry;
                                let Some(pause) = retry.pause_after(&error, window, patience)
                                else {
                                    if waiting && error.is_retryable() {
                                        // The call may have run and queued this waiter before its
                                        // reply was lost: leave the queue on the way out (leaving
                                        // is answered for a waiter that is not there).
                                        queued.joined();
                                    }
                                    if woken {
                                        // This attempt answered a wakeup and failed: let the next
                                        // local waiter have it instead of sleeping until its lease
                                        // runs out.
                                        if let Some(registration) = registration.as_ref() {
                                            registration.hand_on_wakeup();
                                        }
                                    }
                                    return Err(error);
                                };
                                tracing::debug!(%error, pause_ms = pause.as_millis() as u64, "attempt failed; retrying");
                                driver
                                    .engine()
                                    .ctx
                                    .retried_attempts
                                    .fetch_add(1, Ordering::Relaxed);
                                Step::Wait(pause)
                            }
                        }
                    };
                    match step {
                        Step::Acquired {
                            token,
                            lasts,
                            sent_at,
                        } => {
                            let lasts = lasts.unwrap_or(lease.initial());
                            if let Some(registration) = registration.as_ref() {
                                registration.taken();
                            }
                            let hold = take_up(
                                &driver,
                                &owner,
                                token,
                                lease,
                                (sent_at, lasts),
                                Source::OwnScript,
                                &mut queued,
                            );
                            return envoy.settled(Box::pin(hold).await.map(Some));
                        }
                        Step::Wait(limit) => limit,
                        Step::GiveUp => {
                            tracing::debug!("gave up waiting");
                            queued.leave().await;
                            return Ok(None);
                        }
                    }
                };
                let Some(registration) = registration.as_ref() else {
                    return Ok(None);
                };
                // Shutdown marks the client closed, then wakes every registered waiter: a waiter that
                // registered before the check below is woken, one that checks after it sees the mark.
                driver.engine().ctx.check_open()?;
                tracing::trace!(wait_ms = limit.as_millis() as u64, "waiting");
                (registration, registration.wait(limit))
            };
            woken = wait.await;
            // A release of this process handed the lock over, or another client's granted it.
            let ctx = &driver.engine().ctx;
            // Decided without an `await`, and what follows boxed: none of it is part of a
            // waiting task's state (a coroutine keeps a slot for every local that lives across
            // two of its `await`s, whether or not they could share one).
            let next: Option<BoxFuture<'_, Result<Option<Arc<DriverHold>>>>> =
                if let Some(handed) = registration.handed() {
                    if handed.within.is_some() {
                        Some(Box::pin(adopt_without_call(
                            &driver,
                            &owner,
                            lease,
                            handed,
                            registration,
                            &mut queued,
                        )))
                    } else {
                        registration.taken();
                        tracing::trace!(
                            token = handed.token,
                            "handed over by a release of this process"
                        );
                        ctx.handed_over.fetch_add(1, Ordering::Relaxed);
                        let timing = (handed.at, lease.initial());
                        let source = Source::OwnConnection {
                            queued: handed.queued,
                            quiet: handed.quiet,
                        };
                        let hold = take_up(
                            &driver,
                            &owner,
                            handed.token,
                            lease,
                            timing,
                            source,
                            &mut queued,
                        );
                        Some(Box::pin(async move { hold.await.map(Some) }))
                    }
                } else if let Some((granted, timing)) = registration
                    .granted()
                    .and_then(|granted| Some((granted, grant_times(last_busy, granted)?)))
                {
                    tracing::trace!(token = granted.token, "granted by the release");
                    ctx.granted.fetch_add(1, Ordering::Relaxed);
                    let source = Source::OtherClient {
                        queued: granted.queued,
                    };
                    let hold = take_up(
                        &driver,
                        &owner,
                        granted.token,
                        lease,
                        timing,
                        source,
                        &mut queued,
                    );
                    Some(Box::pin(async move { hold.await.map(Some) }))
                } else {
                    None
                };
            if let Some(next) = next {
                return envoy.settled(next.await);
            }
            tracing::trace!(woken, "re-checking");
            driver.engine().ctx.check_open()?;
        }
    }
}

/// What the acquisition does after an attempt: take up the hold it acquired, wait (for a
/// wakeup, the holder's lease, or a pause before retrying a transient failure), or give up
/// (its deadline passed).
enum Step {
    Acquired {
        token: u64,
        lasts: Option<Duration>,
        sent_at: Instant,
    },
    Wait(Duration),
    GiveUp,
}

/// Takes up a hold handed over within this client without a call (`cohort`), claimed while
/// the acquisition's attempt was in flight, which queued it in Redis: its place goes before
/// anything else of this client reaches the queue.
async fn adopt_without_call(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    lease: Lease,
    handed: HandedOver,
    registration: &Registration,
    queued: &mut QueuedInRedis<'_>,
) -> Result<Option<Arc<DriverHold>>> {
    queued.leave().await;
    // Taken only now: an acquisition dropped while it left the queue still gives the hold
    // back (`UnusedHandOver`).
    registration.taken();
    if driver.engine().ctx.is_closed() {
        // Shutdown releases only what the registry holds.
        cohort::release_unused(driver, &handed).await;
        return Err(Error::Shutdown);
    }
    let ctx = &driver.engine().ctx;
    ctx.handed_over.fetch_add(1, Ordering::Relaxed);
    Ok(cohort::adopt(driver, owner, lease, handed))
}

/// Releases a hold that a release of this process handed to the acquisition (barging mutex)
/// when the acquisition goes away without taking it up: a timeout, a cancellation, an error.
/// Declared after the registration, so it runs first when the acquisition's future is dropped.
struct UnusedHandOver<'a> {
    registration: Option<&'a Registration>,
    driver: &'a Arc<dyn Driver>,
}

impl Drop for UnusedHandOver<'_> {
    fn drop(&mut self) {
        let Some(handed) = self.registration.and_then(Registration::abandon) else {
            return;
        };
        let Some(owner) = self.registration.and_then(Registration::bid_owner) else {
            return;
        };
        let driver = self.driver.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if cohort::release_unused(&driver, &handed).await {
                    wake_local_waiters(driver.as_ref());
                    return;
                }
                let outcome = driver.release(&owner, handed.token, &op_id(), false).await;
                tracing::debug!(
                    lock = driver.keys().name(),
                    ?outcome,
                    "released a hand-over nobody took up"
                );
                wake_local_waiters(driver.as_ref());
            });
        }
    }
}

/// Takes over this client's deferred release of the lock for `owner` (see
/// [`release`](super::release)): handed over, or queued behind a grant when the queue's turn
/// came (`waiting` only), or
/// None (no parked hold, or the call failed: the acquisition then asks like any other).
/// Finished in the background if the caller goes away: a hold it was handed is then released,
/// and a queue place left.
async fn take_over(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    waiter: &Arc<str>,
    lease: Lease,
    patience: Patience,
) -> Option<Successor> {
    let waiting = patience != Patience::None;
    let bid = Bid {
        owner: owner.clone(),
        lease: lease.initial(),
        joins_queue: waiting,
    };
    let work = {
        let (driver, waiter) = (driver.clone(), waiter.clone());
        let give_up = match patience {
            Patience::None => Some(Instant::now()),
            Patience::Until(deadline) => Some(deadline),
            Patience::Forever => None,
        };
        async move { take_parked(&driver, &waiter, &bid, give_up).await }
    };
    let orphans = driver.engine().ctx.orphans.clone();
    let (orphan_driver, orphan_owner) = (driver.clone(), owner.clone());
    let orphan_waiter = waiter.clone();
    let outcome = Finish::new(work, orphans, move |outcome| {
        Box::pin(async move {
            match outcome {
                Some(Ok(Successor::HandedOver { token, .. })) => {
                    let outcome = orphan_driver
                        .release(&orphan_owner, token, &op_id(), false)
                        .await;
                    tracing::debug!(
                        ?outcome,
                        "released a hold taken over by a cancelled acquisition"
                    );
                    wake_local_waiters(orphan_driver.as_ref());
                }
                Some(Ok(Successor::Queued { .. })) | Some(Err(_)) => {
                    leave_after_failed_take_over(&orphan_driver, orphan_waiter).await
                }
                Some(Ok(Successor::Passed)) | None => {}
            }
        })
    })
    .join()
    .await;
    match outcome? {
        Ok(taken) => Some(taken),
        Err(error) => {
            tracing::debug!(%error, "taking over a deferred release failed; asking again");
            leave_after_failed_take_over(driver, waiter.clone()).await;
            None
        }
    }
}

/// A take-over whose outcome is unknown may still have handed the hold to `waiter`: the
/// waiter's leave call passes such a hold on (`lua/hold_leave.lua`).
async fn leave_after_failed_take_over(driver: &Arc<dyn Driver>, waiter: Arc<str>) {
    if let Some(leaving) = abandon(driver, waiter) {
        let _ = leaving.await;
    }
}

/// Leaves the Redis-side wait queue of `driver`'s lock (if it queues waiters in Redis) after a
/// timeout or cancellation.
fn abandon(driver: &Arc<dyn Driver>, waiter: Arc<str>) -> Option<BoxFuture<'static, Result<()>>> {
    driver
        .clone()
        .redis_queue()
        .map(|queue| queue.leave(waiter))
}

/// Which connection wrote a new hold: `WAIT` only covers the writes of the connection it runs
/// on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This acquisition's own acquire script.
    OwnScript,
    /// A release by this client (a local hand-over or a take-over), on the same connection;
    /// `quiet`: as in [`Successor::HandedOver`].
    OwnConnection {
        queued: u32,
        quiet: Option<Duration>,
    },
    /// A release by another client (a grant to the queue).
    OtherClient { queued: u32 },
}

impl Source {
    /// About how many other acquisitions still wait for the lock in Redis: a release of the
    /// hold is then worth deferring for a task of this client (`crate::engine::release`).
    fn queued(self) -> u32 {
        match self {
            Source::OwnScript => 0,
            Source::OwnConnection { queued, .. } | Source::OtherClient { queued } => queued,
        }
    }
}

/// Takes up an acquired hold: it is registered with the watchdog from `timing.0` (an instant
/// known to precede the acquisition), lasting `timing.1`.
async fn take_up(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    token: u64,
    lease: Lease,
    timing: (Instant, Duration),
    source: Source,
    queued: &mut QueuedInRedis<'_>,
) -> Result<Arc<DriverHold>> {
    queued.disarm();
    let (mut acquired_at, mut lasts) = timing;
    if driver.engine().ctx.config.replica_acks > 0 {
        if matches!(source, Source::OtherClient { .. }) {
            // WAIT counts the writes of its own connection, and ours wrote nothing yet: top
            // the granted hold up to the full lease now (a write, after the grant in the
            // replication stream), so that the WAIT below covers the grant too.
            let sent_at = Instant::now();
            Box::pin(top_up_grant(driver, owner, token, lease.initial())).await?;
            (acquired_at, lasts) = (sent_at, lease.initial());
        }
        // Boxed: the `WAIT` call's future is large and this path is opt-in; kept inline it
        // would make every pending `lock()` future several KiB.
        Box::pin(confirm_replicated(driver, owner, token)).await?;
    }
    let core = driver.engine();
    if core.ctx.is_closed() {
        // Shutdown began after this acquisition got the lock (a hand-over or grant in flight):
        // shutdown releases only what the registry holds, so release this hold here.
        let outcome = driver.release(owner, token, &op_id(), false).await;
        tracing::debug!(?outcome, "released a hold acquired during shutdown");
        return Err(Error::Shutdown);
    }
    if source != Source::OwnScript {
        // A grant or a hand-over: others wanted the lock (see `crate::engine::contention`).
        core.contention.contended(driver.keys().id());
    }
    // The deadline counts from `acquired_at`, an instant known to precede the grant. The
    // local hand-over window (`crate::engine::cohort`) counts from now for a grant, and may
    // last until a release of this client said the queue's first waiter is due.
    let redis = match source {
        Source::OtherClient { queued } => Some(RedisHold {
            owner: owner.clone(),
            token,
            written_at: Instant::now(),
            queued,
            quiet_until: None,
        }),
        Source::OwnConnection {
            queued,
            quiet: Some(quiet),
        } => Some(RedisHold {
            owner: owner.clone(),
            token,
            written_at: acquired_at,
            queued,
            quiet_until: Some(acquired_at + quiet),
        }),
        Source::OwnConnection { quiet: None, .. } | Source::OwnScript => None,
    };
    let hold = core.holds.adopt(
        driver.clone(),
        owner,
        token,
        lease,
        (acquired_at, lasts),
        source.queued(),
        redis,
    );
    tracing::debug!(token, "acquired");
    Ok(hold)
}

/// When a granted hold began in local time (at the latest), and how long it lasts from then,
/// from this waiter's last busy attempt (`last_busy`: when it was sent, and the lock's token
/// it saw). A grant with a higher token was made after the attempt ran (every hold a lock
/// grants draws a token above all before it), so after it was sent: dating the grant from then
/// is safe (the hold lasts at least that long).
/// None (ask Redis instead) without a busy attempt, for an older grant (its event was read
/// late: that hold may be long gone), and when less than half of the granted time is left by
/// that count (a waiter that queued long ago, a late event, a paused process).
fn grant_times(last_busy: Option<(Instant, u64)>, granted: Granted) -> Option<(Instant, Duration)> {
    let (at, seen) = last_busy?;
    if granted.token <= seen {
        return None;
    }
    let lasts = Duration::from_millis(granted.lasts_ms);
    let left = (at + lasts).saturating_duration_since(Instant::now());
    (left >= lasts / 2 && !lasts.is_zero()).then_some((at, lasts))
}

/// One acquire attempt: waits for an in-flight slot, then runs the driver's script in a way
/// that is finished (and cleaned up) even if the caller goes away.
async fn attempt(
    slot: tokio::sync::OwnedSemaphorePermit,
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    waiter: &Arc<str>,
    op: &str,
    lease: Duration,
    waiting: bool,
) -> Result<Attempt> {
    driver.engine().ctx.attempts.fetch_add(1, Ordering::Relaxed);
    start_attempt(
        slot,
        driver.clone(),
        owner.clone(),
        waiter.clone(),
        op.to_owned(),
        lease,
        waiting,
    )
    .join()
    .await
}

/// When a waiting acquisition repeats an attempt that failed for a transient reason: with
/// growing pauses ([`Backoff`]), for at most [`crate::Config::transient_retry`] since the first
/// failure in a row, never past the caller's deadline, never for `try_lock`.
#[derive(Default)]
pub(crate) struct TransientRetry {
    failing_since: Option<Instant>,
    backoff: Backoff,
}

impl TransientRetry {
    /// The pause before the next retry, or None when `error` must be returned.
    pub(crate) fn pause_after(
        &mut self,
        error: &Error,
        window: Duration,
        patience: Patience,
    ) -> Option<Duration> {
        if !error.is_retryable() || patience == Patience::None || window.is_zero() {
            return None;
        }
        let now = Instant::now();
        let since = *self.failing_since.get_or_insert(now);
        let mut left = (since + window).saturating_duration_since(now);
        if let Patience::Until(deadline) = patience {
            left = left.min(deadline.saturating_duration_since(now));
        }
        if left.is_zero() {
            return None;
        }
        Some(self.backoff.next_pause().min(left))
    }

    /// A reply arrived: the next failure starts a new window.
    fn reset(&mut self) {
        *self = TransientRetry::default();
    }
}

/// Renews a hold that another client's release granted to the full lease (see [`take_up`]).
/// A grant that is gone already counts as not replicated (the acquisition starts over).
async fn top_up_grant(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    token: u64,
    lease: Duration,
) -> Result<()> {
    let ctx = &driver.engine().ctx;
    let codes = renew_holds(ctx, &[(&**driver, owner, token)], lease).await?;
    if codes.first() == Some(&1) {
        return Ok(());
    }
    Err(Error::NotReplicated {
        lock: driver.keys().name().to_owned(),
        acked: 0,
        wanted: ctx.config.replica_acks,
    })
}

/// With [`crate::Config::replica_acks`] set, waits until that many replicas have the fresh
/// hold; otherwise releases it and fails.
async fn confirm_replicated(driver: &Arc<dyn Driver>, owner: &Owner, token: u64) -> Result<()> {
    let ctx = &driver.engine().ctx;
    let wanted = ctx.config.replica_acks;
    if wanted == 0 {
        return Ok(());
    }
    let keys = driver.keys();
    let acked = ctx
        .wait_replicas(&keys.key(""), wanted, ctx.config.replica_ack_timeout)
        .await;
    match acked {
        Ok(acked) if acked >= wanted => Ok(()),
        other => {
            let outcome = driver.release(owner, token, &op_id(), false).await;
            tracing::warn!(
                lock = keys.name(),
                ?other,
                ?outcome,
                "hold not replicated in time; released"
            );
            other.and_then(|acked| {
                Err(Error::NotReplicated {
                    lock: keys.name().to_owned(),
                    acked,
                    wanted,
                })
            })
        }
    }
}

/// Work whose result is still dealt with when the future awaiting it is dropped: it runs
/// inline in the caller's task while awaited (no task spawn on the fast path); if the caller
/// goes away first, the rest of the work moves to a background task and `orphan` runs on its
/// result (e.g. releasing a hold nobody will use).
pub(crate) struct Finish<T: Send + 'static> {
    work: BoxFuture<'static, T>,
    done: bool,
    orphan: Option<Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>>,
    orphans: Arc<AtomicUsize>,
}

impl<T: Send + 'static> Finish<T> {
    pub(crate) fn new(
        work: impl Future<Output = T> + Send + 'static,
        orphans: Arc<AtomicUsize>,
        orphan: impl FnOnce(T) -> BoxFuture<'static, ()> + Send + 'static,
    ) -> Self {
        Finish {
            work: Box::pin(work),
            done: false,
            orphan: Some(Box::new(orphan)),
            orphans,
        }
    }

    /// Runs the work to completion; the orphan handler is then not needed.
    pub(crate) async fn join(mut self) -> T {
        let value = (&mut self.work).await;
        self.done = true;
        value
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        let Some(orphan) = self.orphan.take().filter(|_| !self.done) else {
            return;
        };
        // A boxed zero-sized future does not allocate.
        let work = std::mem::replace(&mut self.work, Box::pin(std::future::pending()));
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: holds (never renewed) expire with their lease
        };
        let orphans = self.orphans.clone();
        orphans.fetch_add(1, Ordering::AcqRel);
        runtime.spawn(async move {
            orphan(work.await).await;
            orphans.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Starts one acquire script call that is finished even if the caller goes away: a hold it
/// took is released, a queue place it took is left.
fn start_attempt(
    slot: tokio::sync::OwnedSemaphorePermit,
    driver: Arc<dyn Driver>,
    owner: Owner,
    waiter: Arc<str>,
    op: String,
    lease: Duration,
    waiting: bool,
) -> Finish<Result<Attempt>> {
    let work = driver
        .clone()
        .try_acquire(owner.clone(), waiter.clone(), op, lease, waiting);
    let work = async move {
        let attempt = work.await;
        drop(slot);
        attempt
    };
    let orphans = driver.engine().ctx.orphans.clone();
    Finish::new(work, orphans, move |attempt| {
        Box::pin(async move {
            match attempt {
                Ok(Attempt::Acquired { token, .. }) => {
                    let outcome = driver.release(&owner, token, &op_id(), false).await;
                    tracing::debug!(
                        lock = driver.keys().name(),
                        ?outcome,
                        "released a hold taken by a cancelled acquisition"
                    );
                }
                Ok(Attempt::Busy { .. }) => {
                    // It may have joined a Redis-side queue: leave it.
                    if let Some(leaving) = abandon(&driver, waiter) {
                        let _ = leaving.await;
                    }
                }
                Err(_) => {}
            }
        })
    })
}

/// A waiter's place in a Redis-side wait queue: watched (and, for the read-write lock, kept
/// alive) by the client's heartbeat while the acquisition waits, and left when it ends
/// without the lock.
///
/// Borrows the acquisition's driver and waiter id: a pending `lock()` future keeps one copy.
struct QueuedInRedis<'a> {
    driver: &'a Arc<dyn Driver>,
    waiter: &'a Arc<str>,
    joined: bool,
}

impl<'a> QueuedInRedis<'a> {
    fn new(driver: &'a Arc<dyn Driver>, waiter: &'a Arc<str>) -> Self {
        QueuedInRedis {
            driver,
            waiter,
            joined: false,
        }
    }

    /// The attempt failed while waiting: the waiter is in the queue now (if the lock type
    /// queues), so the heartbeat must keep it alive.
    fn joined(&mut self) {
        if self.joined {
            return;
        }
        if let Some(queue) = self.driver.clone().redis_queue() {
            self.joined = true;
            let queued = &self.driver.engine().queued;
            queued.join(self.waiter.clone(), queue);
        }
    }

    /// The acquisition got the lock: the script already removed it from the queue.
    fn disarm(&mut self) {
        if std::mem::take(&mut self.joined) {
            self.driver.engine().queued.leave(self.waiter);
        }
    }

    /// Leaves the queue now (timeout).
    async fn leave(&mut self) {
        if let Some(leaving) = self.take_leave() {
            if let Err(error) = leaving.await {
                tracing::warn!(lock = self.driver.keys().name(), %error, "could not leave the wait queue; the waiter lease will evict it");
            }
        }
    }

    fn take_leave(&mut self) -> Option<BoxFuture<'static, Result<()>>> {
        if !std::mem::take(&mut self.joined) {
            return None;
        }
        self.driver.engine().queued.leave(self.waiter);
        abandon(self.driver, self.waiter.clone())
    }
}

impl Drop for QueuedInRedis<'_> {
    fn drop(&mut self) {
        let Some(leaving) = self.take_leave() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = leaving.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lasts_ms: u64) -> Granted {
        Granted {
            token: 7,
            lasts_ms,
            queued: 0,
        }
    }

    #[tokio::test]
    async fn a_grant_is_dated_from_the_last_busy_attempt_and_refused_when_older() {
        let sent = Instant::now();
        let (at, lasts) = grant_times(Some((sent, 6)), grant(3_000)).unwrap();
        assert_eq!(at, sent);
        assert_eq!(lasts, Duration::from_millis(3_000));
        // No busy attempt to date it: ask Redis.
        assert_eq!(grant_times(None, grant(3_000)), None);
        assert_eq!(grant_times(Some((sent, 6)), grant(0)), None);
        // The busy attempt saw token 7 or later held: this grant (token 7) is older than it.
        assert_eq!(grant_times(Some((sent, 7)), grant(3_000)), None);
        assert_eq!(grant_times(Some((sent, 9)), grant(3_000)), None);
    }

    #[tokio::test]
    async fn a_grant_read_late_is_left_to_redis() {
        let Some(sent) = Instant::now().checked_sub(Duration::from_millis(2_500)) else {
            return; // a clock too young to go back 2.5 s
        };
        // 3 s granted, dated from an attempt 2.5 s ago: under half is left.
        assert_eq!(grant_times(Some((sent, 6)), grant(3_000)), None);
    }
}
