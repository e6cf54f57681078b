//! [`Redlock`]: one exclusive lock over N independent Redis masters (the Redlock algorithm).
//!
//! Each attempt asks every instance at once (the same acquire script as [`Mutex`](crate::Mutex),
//! with a fixed lease), and the lock is held when a quorum of `N/2 + 1` said yes while there is
//! still validity left: `validity = lease − time the attempt took − drift`, with
//! `drift = 1 % of the lease + 2 ms` for clock-rate differences between the machines. A failed
//! attempt releases whatever it took on every instance. While the guard lives, a renewal task
//! extends the holds on all instances every third of the lease and keeps the lock only while a
//! quorum confirms.
//!
//! What is not specific to the algorithm comes from the pieces every lock type uses: the
//! patience of `lock` / `try_lock` / `lock_timeout` (the engine's `Patience`), the lease-lost
//! signal (`lease::LostSignal`), the `max_hold` cap of a watchdog lease
//! (`Lease::watchdog_renewal`), the renew call (`lease::renew_holds`) and the release that
//! retries transient failures with the same op id until the lease would have ended
//! (`engine::release::release_retrying`). The rounds, the quorum and the validity are this
//! module's own.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::Duration;

use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::config::check_duration;
use crate::context::BoxFuture;
use crate::engine::release::release_retrying;
use crate::engine::{Attempt, Driver, Engine, Finish, Patience, Released, SpanningHold};
use crate::error::{Backoff, Error, NotHeldReason, Result};
use crate::lease::{renew_holds, Lease, LostCause, LostSignal};
use crate::lock::mutex::Mutex;
use crate::notify::Registration;
use crate::owner::{op_id, Owner};

/// An exclusive lock held on a majority of independent Redis masters.
///
/// **When to use it.** Only when a single Redis (even with replicas) is not trusted to keep a
/// lock through a failover. Every operation talks to every instance, so it costs N times the
/// work of a [`Mutex`](crate::Mutex).
///
/// **Ordering.** Barging, and no fairness across processes: after a release, whoever reaches a
/// quorum first wins. Waiting is still push-based: a waiter queues on every instance to be
/// woken (never granted the lock: a round takes every instance itself), registers with the
/// notifier of every instance, and retries when any of them wakes it (or, at the latest, when
/// the shortest lease it saw runs out). Two contenders that split the instances between them both
/// back off by a short random delay before retrying, so one of them wins the next round.
///
/// **Fencing tokens.** Each instance issues its own token (above its previous one for the lock
/// and at least its clock in µs, as for a [`Mutex`](crate::Mutex)); the guard's token is the
/// maximum over the instances of the quorum. A later holder's token is higher as long as the
/// instances' clocks differ by less than the time between the two acquisitions; tokens that
/// must be trusted across instances call for synchronised clocks.
///
/// **Lease lost.** [`RedlockGuard::lost`] fires when a renewal round does not reach a quorum,
/// when the validity of a fixed lease runs out, or at the `max_hold` cap.
///
/// **Shutdown.** A hold spans several [`LockClient`](crate::LockClient)s. When any of them is
/// shut down, it releases the hold on every instance and the guard's `lost()` fires with
/// [`LostCause::Shutdown`]; its `unlock()` then answers [`Error::Shutdown`].
///
/// **Cancellation.** Dropping a pending acquisition releases whatever its in-flight attempt
/// took on every instance.
#[derive(Clone)]
pub struct Redlock {
    name: String,
    instances: Vec<Arc<dyn Driver>>,
    /// Per instance, in the order of `instances`: the attempts it did not answer, still to be
    /// settled (shared by the clones of the handle).
    unanswered: Arc<[Arc<Unanswered>]>,
    owner: Option<Owner>,
    lease: Lease,
}

impl Redlock {
    /// A Redlock named `name` over the engines of its clients, one per instance (see
    /// `Redlock::new`, which the client module defines: it names the public client type).
    pub(crate) fn over(engines: Vec<Arc<Engine>>, name: &str) -> Result<Redlock> {
        let first = engines
            .first()
            .ok_or_else(|| Error::InvalidConfig("a Redlock needs at least one client".into()))?;
        let lease = Lease::watchdog(first.ctx.config.watchdog_lease);
        let instances = engines
            .into_iter()
            .map(|engine| Mutex::redlock_instance(engine, name))
            .collect::<Result<Vec<_>>>()?;
        Ok(Redlock {
            name: name.to_owned(),
            unanswered: instances.iter().map(|_| Arc::default()).collect(),
            instances,
            owner: None,
            lease,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many instances must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.instances.len() / 2 + 1
    }

    /// A handle whose acquisitions are taken under `owner` (re-entry on every instance).
    pub fn with_owner(mut self, owner: &Owner) -> Redlock {
        self.owner = Some(owner.clone());
        self
    }

    /// A handle whose acquisitions use `lease` (watchdog-renewed through the quorum, or fixed).
    pub fn with_lease(mut self, lease: Lease) -> Result<Redlock> {
        lease.validate()?;
        self.lease = lease;
        Ok(self)
    }

    /// Waits until the lock is held on a quorum.
    pub async fn lock(&self) -> Result<RedlockGuard> {
        match self.acquire(Patience::Forever).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::Shutdown),
        }
    }

    /// One attempt: `Ok(None)` when the lock is held elsewhere,
    /// [`Error::NoQuorum`] when too few instances answered.
    pub async fn try_lock(&self) -> Result<Option<RedlockGuard>> {
        self.acquire(Patience::None).await
    }

    /// Waits at most `timeout`: `Ok(None)` when the lock stayed held elsewhere,
    /// [`Error::NoQuorum`] when too few instances answered until then.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<RedlockGuard>> {
        if timeout.is_zero() {
            return self.try_lock().await;
        }
        check_duration("timeout", timeout, Duration::from_nanos(1))?;
        self.acquire(Patience::Until(Instant::now() + timeout))
            .await
    }

    fn lease_ms(&self) -> Duration {
        self.lease.initial()
    }

    async fn acquire(&self, patience: Patience) -> Result<Option<RedlockGuard>> {
        let owner = self.owner.clone().unwrap_or_default();
        let waiting = patience != Patience::None;
        let waiter: Arc<str> = op_id().into();
        let registrations: Vec<Registration> = if waiting {
            self.instances
                .iter()
                .map(|d| {
                    d.engine()
                        .waiters
                        .register(d.keys().id(), Some(waiter.clone()), None)
                })
                .collect()
        } else {
            Vec::new()
        };
        let span =
            tracing::debug_span!("redlock", lock = %self.name, instances = self.instances.len());
        loop {
            let round = self
                .start_round(owner.clone(), waiter.clone(), waiting)
                .join()
                .await?;
            let (reachable, ttl, contested) = match round {
                Round::Won(holds, started) => {
                    tracing::debug!(parent: &span, holds = holds.len(), "acquired on a quorum");
                    return Ok(Some(RedlockGuard::start(self, owner, holds, started)));
                }
                Round::Lost {
                    reachable,
                    ttl,
                    contested,
                } => (reachable, ttl, contested),
            };
            let limit = match patience.wait_limit(ttl) {
                Some(limit) if waiting => limit,
                // Out of patience: an answer from too few instances is an error, not a "busy".
                _ if reachable < self.quorum() => {
                    return Err(Error::NoQuorum {
                        lock: self.name.clone(),
                        reached: reachable,
                        needed: self.quorum(),
                    })
                }
                _ => return Ok(None),
            };
            // Unreachable instances send no events: retry them on a short backoff instead.
            let limit = if reachable < self.quorum() {
                limit.min(Duration::from_millis(200))
            } else {
                limit
            };
            if contested {
                tokio::time::sleep(jitter(Duration::from_millis(20))).await;
            }
            wait_any(&registrations, limit).await;
        }
    }

    /// One attempt on every instance, spawned so that it completes (and cleans up) even if the
    /// caller goes away.
    fn start_round(&self, owner: Owner, waiter: Arc<str>, waiting: bool) -> Finish<Result<Round>> {
        let instances = self.instances.clone();
        let lease = self.lease_ms();
        let quorum = self.quorum();
        let work = round(
            instances.clone(),
            self.unanswered.clone(),
            owner.clone(),
            waiter,
            lease,
            waiting,
            quorum,
        );
        let orphans = instances[0].engine().ctx.orphans.clone();
        Finish::new(work, orphans, move |result| {
            Box::pin(async move {
                if let Ok(Round::Won(holds, started)) = result {
                    release_all(&owner, &holds, started + lease).await;
                }
            })
        })
    }
}

/// The outcome of one round over all instances.
enum Round {
    /// A quorum granted the lock: (instance, token) per granting instance; when it started.
    Won(Vec<(Arc<dyn Driver>, u64)>, Instant),
    /// No quorum: how many instances answered, the longest wait worth doing, and whether some
    /// instances granted it (a split with another contender).
    Lost {
        reachable: usize,
        ttl: Duration,
        contested: bool,
    },
}

/// Asks every instance at once; keeps the lock only with a quorum and validity left.
async fn round(
    instances: Vec<Arc<dyn Driver>>,
    unanswered: Arc<[Arc<Unanswered>]>,
    owner: Owner,
    waiter: Arc<str>,
    lease: Duration,
    waiting: bool,
    quorum: usize,
) -> Result<Round> {
    let started = Instant::now();
    let op = op_id();
    let timeout = instances[0]
        .engine()
        .ctx
        .config
        .command_timeout
        .min(lease / 2);
    let mut calls = JoinSet::new();
    for (index, driver) in instances.iter().enumerate() {
        let attempt =
            driver
                .clone()
                .try_acquire(owner.clone(), waiter.clone(), op.clone(), lease, waiting);
        let driver = driver.clone();
        calls.spawn(async move { (index, driver, tokio::time::timeout(timeout, attempt).await) });
    }
    let mut granted = Vec::new();
    let mut reachable = 0;
    let mut ttl = lease;
    while let Some(joined) = calls.join_next().await {
        let Ok((index, driver, answer)) = joined else {
            continue;
        };
        let unknown = match answer {
            Ok(Ok(Attempt::Acquired { token, .. })) => {
                reachable += 1;
                granted.push((driver, token));
                continue;
            }
            Ok(Ok(Attempt::Busy { ttl: busy, .. })) => {
                reachable += 1;
                ttl = ttl.min(busy.unwrap_or(lease));
                continue;
            }
            Ok(Err(error)) if !error.is_retryable() => {
                tracing::debug!(lock = driver.keys().name(), %error, "instance refused");
                continue;
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no answer in time".to_owned(),
        };
        // The attempt may have run there all the same (it may still be on its way): find out
        // in the background, and give back what it took, which the round does not count.
        tracing::debug!(
            lock = driver.keys().name(),
            error = unknown,
            "instance did not answer"
        );
        let asked = Asked {
            owner: owner.clone(),
            op: op.clone(),
            lease,
            lease_end: started + lease,
        };
        unanswered[index].settle(&driver, asked);
    }
    if granted.len() >= quorum && validity(lease, started).is_some() {
        return Ok(Round::Won(granted, started));
    }
    let contested = !granted.is_empty();
    release_all(&owner, &granted, started + lease).await;
    Ok(Round::Lost {
        reachable,
        ttl: ttl.max(Duration::from_millis(1)),
        contested,
    })
}

/// The attempts one instance did not answer, still to be settled ([`settle_unanswered`]), and
/// whether a task settles them. One task per instance works through them in turn: while an
/// instance is down every round leaves one behind, and a task each, each retrying until its
/// lease would have ended, would pile up by the thousand under a steady load.
#[derive(Default)]
struct Unanswered {
    pending: StdMutex<VecDeque<Asked>>,
    settling: AtomicBool,
}

/// An attempt to settle: the round's owner and op id, its lease, and when that would end.
struct Asked {
    owner: Owner,
    op: String,
    lease: Duration,
    lease_end: Instant,
}

impl Unanswered {
    /// Queues `asked` for `driver`'s instance (dropping queued attempts whose lease has ended:
    /// nothing of theirs can be held any more), and starts the settling task unless it runs.
    fn settle(self: &Arc<Self>, driver: &Arc<dyn Driver>, asked: Asked) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            pending.retain(|earlier| earlier.lease_end > now);
            pending.push_back(asked);
        }
        if self.settling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (queue, driver) = (self.clone(), driver.clone());
        tokio::spawn(async move {
            loop {
                let next = queue.next();
                if let Some(asked) = next {
                    settle_unanswered(&driver, asked).await;
                    continue;
                }
                queue.settling.store(false, Ordering::Release);
                // An attempt queued between the look and the store saw this task running: take
                // it on, unless another task started for it meanwhile.
                if queue.is_empty() || queue.settling.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    fn next(&self) -> Option<Asked> {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    fn is_empty(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// An instance that did not answer a round's attempt may have taken the hold all the same
/// (its reply was lost, or arrives late). Asks it again with the attempt's op id, which the
/// acquire script answers instead of applying twice (an attempt that never ran is applied
/// now), and releases what it says was taken; transient failures are retried until the lease
/// of the attempt would have ended anyway.
async fn settle_unanswered(driver: &Arc<dyn Driver>, asked: Asked) {
    let Asked {
        owner,
        op,
        lease,
        lease_end,
    } = asked;
    let mut backoff = Backoff::default();
    loop {
        let ask = driver
            .clone()
            .try_acquire(owner.clone(), "".into(), op.clone(), lease, false);
        match ask.await {
            Ok(Attempt::Acquired { token, .. }) => {
                let released =
                    release_retrying(driver, &owner, token, None, lease_end, None, None).await;
                tracing::debug!(
                    lock = driver.keys().name(),
                    ?released,
                    "late grant released"
                );
                return;
            }
            Err(error) if error.is_retryable() && Instant::now() + backoff.peek() < lease_end => {
                tokio::time::sleep(backoff.next_pause()).await;
            }
            _ => return,
        }
    }
}

/// Time left of a lease taken at `started`, after the drift allowance; None when none is left.
fn validity(lease: Duration, started: Instant) -> Option<Instant> {
    let drift = lease / 100 + Duration::from_millis(2);
    let end = started + lease.checked_sub(drift)?;
    (end > Instant::now()).then_some(end)
}

/// Releases the given holds on their instances, concurrently, each retried on transient
/// failures until `lease_end`; returns how many were released.
async fn release_all(owner: &Owner, holds: &[(Arc<dyn Driver>, u64)], lease_end: Instant) -> usize {
    let mut calls = JoinSet::new();
    for (driver, token) in holds {
        let (driver, owner, token) = (driver.clone(), owner.clone(), *token);
        calls.spawn(async move {
            release_retrying(&driver, &owner, token, None, lease_end, None, None).await
        });
    }
    let mut released = 0;
    while let Some(joined) = calls.join_next().await {
        if let Ok(Ok(Released::Yes { .. })) = joined {
            released += 1;
        }
    }
    released
}

/// A random pause up to `max` (breaks ties between contenders that split the instances).
fn jitter(max: Duration) -> Duration {
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    Duration::from_micros(random % (max.as_micros() as u64 + 1))
}

/// Waits until any registration is woken or `limit` passes.
async fn wait_any(registrations: &[Registration], limit: Duration) {
    let mut waits: Vec<Pin<Box<dyn Future<Output = bool> + Send + '_>>> = registrations
        .iter()
        .map(|r| Box::pin(r.wait(limit)) as Pin<Box<dyn Future<Output = bool> + Send + '_>>)
        .collect();
    let any = std::future::poll_fn(|cx| {
        for wait in waits.iter_mut() {
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    });
    let _ = tokio::time::timeout(limit, any).await;
}

/// State shared by a guard, its renewal task, and (as a [`SpanningHold`]) every client it holds
/// instances through.
struct Shared {
    name: String,
    owner: Owner,
    holds: Vec<(Arc<dyn Driver>, u64)>,
    deadline: StdMutex<Instant>,
    lost: LostSignal,
    /// Set by whichever releases the holds first: `unlock()`, `Drop`, or a client's shutdown.
    released: AtomicBool,
    renewal: StdMutex<Option<JoinHandle<()>>>,
    /// This hold's key in each client's [`Core::spanning`](crate::engine::Core::spanning).
    id: u64,
}

/// Ids of Redlock holds in the clients' spanning-hold maps.
static NEXT_SPANNING_ID: AtomicU64 = AtomicU64::new(1);

impl Shared {
    /// Releases every instance's hold, unless someone already did: how many were released,
    /// None when it was done before. Stops the renewal and leaves the clients' maps.
    async fn release(&self) -> Option<usize> {
        if self.released.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.detach();
        Some(release_all(&self.owner, &self.holds, self.deadline()).await)
    }

    /// Stops the renewal task and leaves every client's map of spanning holds, so that they do
    /// not keep the hold (and its drivers) alive.
    fn detach(&self) {
        if let Some(renewal) = self
            .renewal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            renewal.abort();
        }
        for (driver, _) in &self.holds {
            driver.engine().spanning.remove(&self.id);
        }
    }

    fn mark_lost(&self, name: &str, cause: LostCause) {
        if self.lost.fire(cause.clone()) {
            tracing::warn!(lock = name, ?cause, "redlock lost");
        }
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lost_cause(&self) -> Option<LostCause> {
        self.lost.cause()
    }
}

impl SpanningHold for Shared {
    fn release_on_shutdown(self: Arc<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            if let Some(released) = self.release().await {
                tracing::debug!(lock = %self.name, released, "redlock released at client shutdown");
                self.mark_lost(&self.name, LostCause::Shutdown);
            }
        })
    }
}

/// Proof of a Redlock hold on a quorum of instances.
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedlockGuard {
    token: u64,
    shared: Arc<Shared>,
    armed: bool,
}

impl RedlockGuard {
    fn start(
        lock: &Redlock,
        owner: Owner,
        holds: Vec<(Arc<dyn Driver>, u64)>,
        started: Instant,
    ) -> RedlockGuard {
        let lease = lock.lease_ms();
        let deadline = validity(lease, started).unwrap_or(started);
        let token = holds.iter().map(|(_, t)| *t).max().unwrap_or(0);
        let shared = Arc::new(Shared {
            name: lock.name.clone(),
            owner: owner.clone(),
            holds: holds.clone(),
            deadline: StdMutex::new(deadline),
            lost: LostSignal::default(),
            released: AtomicBool::new(false),
            renewal: StdMutex::new(None),
            id: NEXT_SPANNING_ID.fetch_add(1, Ordering::Relaxed),
        });
        let renewal = tokio::spawn(keep_alive(
            lock.name.clone(),
            owner,
            holds,
            lock.lease,
            lock.quorum(),
            started,
            shared.clone(),
        ));
        *shared.renewal.lock().unwrap_or_else(|p| p.into_inner()) = Some(renewal);
        for (driver, _) in &shared.holds {
            let spanning: Arc<dyn SpanningHold> = shared.clone();
            driver.engine().spanning.insert(shared.id, spanning);
        }
        RedlockGuard {
            token,
            shared,
            armed: true,
        }
    }

    /// The maximum of the instances' fencing tokens (see [`Redlock`] for its caveat).
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The owner of the hold.
    pub fn owner(&self) -> &Owner {
        &self.shared.owner
    }

    /// How many instances granted the hold.
    pub fn instances(&self) -> usize {
        self.shared.holds.len()
    }

    /// Until when the quorum guarantees the hold (validity after drift), by the local clock.
    pub fn lease_deadline(&self) -> Instant {
        self.shared.deadline()
    }

    /// Why the hold was lost, if it was.
    pub fn lost_cause(&self) -> Option<LostCause> {
        self.shared.lost_cause()
    }

    /// Resolves when the hold can no longer be guaranteed by a quorum.
    pub fn lost(&self) -> impl Future<Output = LostCause> + Send + 'static {
        self.shared.lost.wait()
    }

    /// Releases the hold on every instance. [`Error::NotHeld`] when no instance still had it;
    /// [`Error::Shutdown`] when one of its clients was shut down and released it then.
    pub async fn unlock(mut self) -> Result<()> {
        self.armed = false;
        let shared = &self.shared;
        let released = match shared.release().await {
            Some(released) => released,
            None if shared.lost_cause() == Some(LostCause::Shutdown) => {
                return Err(Error::Shutdown)
            }
            None => 0,
        };
        tracing::debug!(lock = %shared.name, released, "redlock released");
        if released == 0 {
            return Err(Error::NotHeld {
                lock: shared.name.clone(),
                reason: NotHeldReason::Expired,
            });
        }
        Ok(())
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let shared = self.shared.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    shared.release().await;
                });
            }
            // No runtime: nothing can be sent; the holds expire with their lease.
            Err(_) => shared.detach(),
        }
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("name", &self.name)
            .field("instances", &self.instances.len())
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .finish()
    }
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("lock", &self.shared.name)
            .field("token", &self.token)
            .field("instances", &self.shared.holds.len())
            .field("lost", &self.lost_cause())
            .finish()
    }
}

/// Renews the holds through the quorum (watchdog lease) or watches the validity (fixed lease).
async fn keep_alive(
    name: String,
    owner: Owner,
    holds: Vec<(Arc<dyn Driver>, u64)>,
    lease: Lease,
    quorum: usize,
    acquired: Instant,
    shared: Arc<Shared>,
) {
    loop {
        let deadline = shared.deadline();
        // A fixed lease is never renewed; a watchdog lease never past its max_hold cap.
        let Some(lease) = lease.watchdog_renewal(acquired, Instant::now()) else {
            tokio::time::sleep_until(deadline).await;
            shared.mark_lost(&name, LostCause::Expired);
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(lease / 3) => {}
            _ = tokio::time::sleep_until(deadline) => {
                let late = fred::error::Error::new(
                    fred::error::ErrorKind::Timeout,
                    "no quorum renewal before the validity ended",
                );
                shared.mark_lost(&name, LostCause::RenewalFailed(Arc::new(Error::Timeout(late))));
                return;
            }
        }
        let started = Instant::now();
        let codes = renew_everywhere(&owner, &holds, lease).await;
        let renewed = codes.iter().filter(|c| **c == Some(1)).count();
        match validity(lease, started) {
            Some(end) if renewed >= quorum => {
                *shared.deadline.lock().unwrap_or_else(|p| p.into_inner()) = end;
            }
            _ => {
                let gone = codes
                    .iter()
                    .filter(|c| matches!(c, Some(0) | Some(-1) | Some(-2)))
                    .count();
                let cause = if gone + renewed >= quorum && gone > 0 {
                    LostCause::KeyDeleted
                } else {
                    LostCause::RenewalFailed(Arc::new(Error::NoQuorum {
                        lock: name.clone(),
                        reached: renewed,
                        needed: quorum,
                    }))
                };
                shared.mark_lost(&name, cause);
                return;
            }
        }
    }
}

/// One renewal call per instance, concurrently: the renew code of each, None on error.
async fn renew_everywhere(
    owner: &Owner,
    holds: &[(Arc<dyn Driver>, u64)],
    lease: Duration,
) -> Vec<Option<i64>> {
    let mut calls = JoinSet::new();
    for (driver, token) in holds {
        let (driver, owner, token) = (driver.clone(), owner.clone(), *token);
        calls.spawn(async move {
            let ctx = &driver.engine().ctx;
            let timeout = ctx.config.command_timeout.min(lease / 3);
            let hold = [(&*driver, &owner, token)];
            match tokio::time::timeout(timeout, renew_holds(ctx, &hold, lease)).await {
                Ok(Ok(codes)) => codes.first().copied(),
                _ => None,
            }
        });
    }
    let mut codes = Vec::with_capacity(holds.len());
    while let Some(joined) = calls.join_next().await {
        codes.push(joined.ok().flatten());
    }
    codes
}
