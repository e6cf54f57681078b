//! Leases: the local record of every hold, the watchdog that renews them, and the lease-lost
//! signal. Releases live in the engine (`crate::engine`), above this module.
//!
//! Each hold (one lock, one owner) is a [`Hold`] in the client's [`HoldRegistry`], shared by
//! all guards that re-entered it. A hold knows its lock only through [`HoldKind`]: its keys,
//! its role and how to renew it, which is all the watchdog needs; the lock types' drivers
//! implement it (the engine's `Driver` extends it), so this module sits below the engine and
//! works over the shared [`Context`] alone. The single watchdog task of a client wakes at the earliest
//! renewal or deadline of any hold, renews every due hold with one script call per
//! (script, hash slot, lease) batch, and fires the hold's lost signal when Redis says the hold
//! is gone or when its deadline passes without a successful renewal. Deadlines are measured
//! from the moment a request was *sent*, so the local view never outlives the server's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fred::types::Value;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use crate::config::{check_lease, MAX_DURATION};
use crate::context::{Context, Table};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::owner::Owner;
use crate::scripts::{int_array, Script, SCRIPTS};

/// How a hold's lease is kept alive.
///
/// Holds taken by re-entry keep the lease policy of the first hold of their owner.
///
/// Build one with [`Lease::watchdog`] (and [`Lease::with_max_hold`]) or [`Lease::fixed`]. The
/// enum and its `Watchdog` variant are `#[non_exhaustive]`: a match needs a `_` arm and
/// `Watchdog { lease, .. }`, so later policies or fields do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lease {
    /// The client's watchdog renews the lease every `lease / 3` while a guard exists. With
    /// `max_hold`, renewal stops so that the hold ends at most `max_hold` after it was taken
    /// (the "renew at most N times" safety cap), and the guard's [`lost`](crate::LockGuard::lost)
    /// fires with [`LostCause::Expired`].
    #[non_exhaustive]
    Watchdog {
        /// Lease per renewal.
        lease: Duration,
        /// Optional cap on the total hold time.
        max_hold: Option<Duration>,
    },
    /// A fixed lease: the hold expires this long after it was taken unless extended with
    /// [`LockGuard::extend`](crate::LockGuard::extend). No renewal.
    Fixed(Duration),
}

impl Lease {
    /// A watchdog-renewed lease without a hold cap.
    pub fn watchdog(lease: Duration) -> Lease {
        Lease::Watchdog {
            lease,
            max_hold: None,
        }
    }

    /// A fixed lease.
    pub fn fixed(lease: Duration) -> Lease {
        Lease::Fixed(lease)
    }

    /// Caps the total hold time of a watchdog lease (no effect on a fixed lease).
    pub fn with_max_hold(self, max_hold: Duration) -> Lease {
        match self {
            Lease::Watchdog { lease, .. } => Lease::Watchdog {
                lease,
                max_hold: Some(max_hold),
            },
            fixed => fixed,
        }
    }

    /// The lease requested from Redis at acquisition.
    pub(crate) fn initial(&self) -> Duration {
        match *self {
            Lease::Watchdog { lease, max_hold } => max_hold.map_or(lease, |cap| lease.min(cap)),
            Lease::Fixed(lease) => lease,
        }
    }

    /// The lease a watchdog renewal at `now` asks for, for a hold taken at `acquired_at`: the
    /// watchdog lease, cut to what is left of `max_hold`; None for a fixed lease, and once
    /// less than the shortest lease is left of the cap.
    pub(crate) fn watchdog_renewal(&self, acquired_at: Instant, now: Instant) -> Option<Duration> {
        let Lease::Watchdog { lease, max_hold } = *self else {
            return None;
        };
        match max_hold {
            None => Some(lease),
            Some(cap) => {
                let left = (acquired_at + cap).saturating_duration_since(now);
                (left >= crate::config::MIN_LEASE).then(|| lease.min(left))
            }
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        match *self {
            Lease::Watchdog { lease, max_hold } => {
                check_lease("watchdog lease", lease)?;
                if let Some(cap) = max_hold {
                    check_lease("max hold", cap)?;
                }
                Ok(())
            }
            Lease::Fixed(lease) => check_lease("fixed lease", lease),
        }
    }
}

/// Why a hold can no longer be guaranteed. Delivered by [`LockGuard::lost`](crate::LockGuard::lost).
///
/// Equality compares the variant, and for [`RenewalFailed`](Self::RenewalFailed) the error's
/// message ([`Error`] itself is not comparable: it may carry a fred error).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostCause {
    /// The lease ran out: a fixed lease, or a watchdog lease whose `max_hold` was reached.
    Expired,
    /// Renewals kept failing until the lease deadline passed; the last renewal error is given
    /// (shared: every hold of a failed renewal batch carries the same error).
    RenewalFailed(Arc<Error>),
    /// The hold's key is gone: deleted, flushed, force-unlocked, or lost in a failover.
    KeyDeleted,
    /// Another owner holds the lock now.
    OwnerChanged,
    /// The same owner holds the lock under a newer fencing token: this hold was lost meanwhile.
    TokenChanged,
    /// The client was shut down and released the hold.
    Shutdown,
    /// Another layout (shard count or notification mode) is now recorded under the client's
    /// key prefix, after the server lost its record: the client stopped working
    /// ([`Error::LayoutMismatch`](crate::Error::LayoutMismatch)).
    LayoutMismatch,
}

impl PartialEq for LostCause {
    fn eq(&self, other: &LostCause) -> bool {
        match (self, other) {
            (LostCause::RenewalFailed(a), LostCause::RenewalFailed(b)) => {
                Arc::ptr_eq(a, b) || a.to_string() == b.to_string()
            }
            // Every other variant carries no data.
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl Eq for LostCause {}

/// The lease-lost signal of one hold: fires once, with the first cause; every guard, the
/// watchdog and `lost()` futures see that cause. Shared by the holds of one client
/// ([`Hold`]) and the holds that span several (a Redlock's).
#[derive(Debug)]
pub(crate) struct LostSignal(watch::Sender<Option<LostCause>>);

impl Default for LostSignal {
    fn default() -> Self {
        LostSignal(watch::channel(None).0)
    }
}

impl LostSignal {
    /// Fires with `cause` unless it fired before; true when this call fired it.
    pub(crate) fn fire(&self, cause: LostCause) -> bool {
        self.0.send_if_modified(|slot| {
            let first = slot.is_none();
            if first {
                *slot = Some(cause);
            }
            first
        })
    }

    /// The cause it fired with, if it did.
    pub(crate) fn cause(&self) -> Option<LostCause> {
        self.0.borrow().clone()
    }

    /// Resolves with the cause once it fires (at once if it did). The future borrows nothing,
    /// so it can be raced against a critical section; if the signal is dropped unfired (its
    /// hold record is gone, which only happens at shutdown), it resolves with
    /// [`LostCause::Shutdown`].
    pub(crate) fn wait(&self) -> impl std::future::Future<Output = LostCause> + Send + 'static {
        let mut receiver = self.0.subscribe();
        async move {
            loop {
                if let Some(cause) = receiver.borrow_and_update().clone() {
                    return cause;
                }
                if receiver.changed().await.is_err() {
                    return LostCause::Shutdown;
                }
            }
        }
    }
}

/// What a hold needs from its lock kind: its keys, its role, and how to renew it. Every lock
/// type's driver implements it; the watchdog, [`renew`] and [`verify_holds`] use nothing else.
pub(crate) trait HoldKind: Send + Sync + 'static {
    /// The lock's keys.
    fn keys(&self) -> &LockKeys;
    /// Distinguishes different kinds of hold on the same lock by the same owner (read/write).
    fn hold_role(&self) -> &'static str {
        ""
    }
    /// The script that renews holds of this kind (see `lua/hold_renew.lua` for its contract).
    fn renew_script(&self) -> &'static Script {
        &SCRIPTS.hold_renew
    }
    /// The keys this lock passes to its renew script for one hold (default: the hold key).
    fn renew_keys(&self) -> Vec<String> {
        vec![self.keys().key("")]
    }
    /// The arguments this lock passes to its renew script for one hold.
    fn renew_args(&self, owner: &Owner, token: u64) -> Vec<Value> {
        vec![owner.id().into(), token.to_string().into()]
    }
}

/// Per-hold renewal bookkeeping, guarded by a std mutex (never held across an await).
#[derive(Debug)]
struct Timing {
    deadline: Instant,
    renew_at: Option<Instant>,
    last_error: Option<Arc<Error>>,
    /// When the last explicit extension ([`Hold::extended`]) was sent: a renewal sent before
    /// it reached Redis before it too (one connection, in order), so it cannot move the
    /// deadline the extension set.
    extended_at: Option<Instant>,
}

/// The registry key of a hold: `<role>|<owner id>|<lock id>`, built by hand (`format!`
/// costs several times more, on every acquisition).
fn hold_key(role: &str, owner: &str, lock: &str) -> String {
    let mut key = String::with_capacity(role.len() + owner.len() + lock.len() + 2);
    key.push_str(role);
    key.push('|');
    key.push_str(owner);
    key.push('|');
    key.push_str(lock);
    key
}

/// The hold in Redis that a [`Hold`] stands on. A hold taken from Redis (a take, or a grant or
/// hand-over by a release script) stands on its own; a hold a barging mutex handed over within
/// this process (`crate::engine::cohort`) stands on the Redis hold of the hold it came from,
/// written under that one's owner and token, while its own token (above them) is the one its
/// guard reports. Renewals and releases name the Redis hold; a release also names the hold's
/// own token, so that the lock's next tokens go above it.
#[derive(Clone, Debug)]
pub(crate) struct RedisHold {
    pub(crate) owner: Owner,
    pub(crate) token: u64,
    /// When the hold was written in Redis (the call was sent then), or, for a hold granted from
    /// the queue, when the grant arrived: hand-overs within the process stop a while after it
    /// (not a safety bound: the hold's deadline counts from an instant known to precede the
    /// write, which for a grant may be much earlier), and a release script looks at the
    /// Redis queue again.
    pub(crate) written_at: Instant,
    /// About how many waiters of other clients were queued in Redis when it was written.
    pub(crate) queued: u32,
    /// Until when none of them is due for a grant, when the release script that wrote it
    /// said so: hand-overs within the process may go on until then (`crate::engine::cohort`).
    pub(crate) quiet_until: Option<Instant>,
}

/// One hold: one owner's (possibly re-entered) hold on one lock, of kind `K` (the engine's
/// holds are of its drivers, `Hold<dyn Driver>`).
pub(crate) struct Hold<K: ?Sized + HoldKind> {
    pub(crate) lock: Arc<K>,
    pub(crate) owner: Owner,
    pub(crate) token: u64,
    /// The hold in Redis this one stands on (itself, unless handed over within the process).
    pub(crate) redis: RedisHold,
    pub(crate) lease: Lease,
    key: String,
    acquired_at: Instant,
    timing: StdMutex<Timing>,
    guards: AtomicUsize,
    /// Other acquisitions wait for the lock: they did when this hold began (it was granted or
    /// handed over), or one queued behind it since (a `held` notice, [`HoldRegistry::queued_behind`]).
    /// Its release is then worth deferring for a task of this client (see `crate::engine::release`).
    contended: AtomicBool,
    /// The acquisition took it over from a deferred release of this client (see
    /// `crate::engine::release`): a task that releases and asks again at once, which it will
    /// likely do again when it releases this hold.
    retaken: AtomicBool,
    lost: LostSignal,
}

impl<K: ?Sized + HoldKind> Hold<K> {
    pub(crate) fn deadline(&self) -> Instant {
        self.timing().deadline
    }

    /// Whether other acquisitions wait for the lock, as far as this client heard.
    pub(crate) fn is_contended(&self) -> bool {
        self.contended.load(Ordering::Acquire)
    }

    /// Marks the hold as taken over from a deferred release of this client.
    pub(crate) fn mark_retaken(&self) {
        self.retaken.store(true, Ordering::Relaxed);
    }

    /// Whether the hold was taken over from a deferred release of this client.
    pub(crate) fn was_retaken(&self) -> bool {
        self.retaken.load(Ordering::Relaxed)
    }

    /// Guards alive on this hold (0 once its last guard was released).
    pub(crate) fn guards(&self) -> usize {
        self.guards.load(Ordering::Acquire)
    }

    /// The hold's lost signal.
    pub(crate) fn lost(&self) -> &LostSignal {
        &self.lost
    }

    pub(crate) fn lost_cause(&self) -> Option<LostCause> {
        self.lost.cause()
    }

    /// Fires the lost signal once; later causes are ignored.
    pub(crate) fn mark_lost(&self, cause: LostCause) {
        if self.lost.fire(cause.clone()) {
            tracing::warn!(
                lock = self.lock.keys().name(),
                token = self.token,
                ?cause,
                "lease lost"
            );
            self.timing().renew_at = None;
        }
    }

    /// Records a successful explicit extension sent at `sent_at`: Redis set the remaining
    /// lease to `lease`, shorter or longer than before, and so does the local deadline (see
    /// [`HoldRegistry::extended`], which also tells the watchdog).
    fn extended(&self, sent_at: Instant, lease: Duration) {
        let mut timing = self.timing();
        timing.deadline = sent_at + lease;
        timing.extended_at = Some(sent_at);
        timing.last_error = None;
        if timing.renew_at.is_some() {
            timing.renew_at = match self.lease {
                Lease::Fixed(_) => None,
                Lease::Watchdog { .. } => Some(sent_at + lease / 3),
            };
        }
    }

    /// Records a successful renewal sent at `sent_at` for `lease`.
    pub(crate) fn renewed(&self, sent_at: Instant, lease: Duration) {
        let mut timing = self.timing();
        if timing.extended_at.is_some_and(|at| sent_at < at) {
            return;
        }
        timing.deadline = timing.deadline.max(sent_at + lease);
        timing.last_error = None;
        if timing.renew_at.is_some() {
            // A fixed lease is renewed only once, to top up a short grant.
            timing.renew_at = match self.lease {
                Lease::Fixed(_) => None,
                Lease::Watchdog { .. } => Some(sent_at + lease / 3),
            };
        }
    }

    fn timing(&self) -> std::sync::MutexGuard<'_, Timing> {
        self.timing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lease to request at the next renewal, or None when renewal is over (cap reached).
    /// A fixed lease is only renewed to top up a short grant: to its end as first requested.
    fn next_renewal_lease(&self, now: Instant) -> Option<Duration> {
        match self.lease {
            Lease::Fixed(lease) => {
                let left = (self.acquired_at + lease).saturating_duration_since(now);
                (left >= crate::config::MIN_LEASE).then_some(left)
            }
            Lease::Watchdog { .. } => self.lease.watchdog_renewal(self.acquired_at, now),
        }
    }
}

/// Every live hold of one client, by (role, owner, lock).
pub(crate) struct HoldRegistry<K: ?Sized + HoldKind> {
    holds: Table<String, Arc<Hold<K>>>,
    /// The holds of `holds` by lock id (several owners of a shared lock).
    by_lock: Table<Arc<str>, Vec<Arc<Hold<K>>>>,
    /// Wakes the watchdog early, when a new hold is due before its planned wake-up.
    kick: Notify,
    /// When the watchdog plans to wake up next, in ms since `epoch`.
    next_wake_ms: AtomicU64,
    epoch: Instant,
}

impl<K: ?Sized + HoldKind> Default for HoldRegistry<K> {
    fn default() -> Self {
        HoldRegistry {
            holds: Table::default(),
            by_lock: Table::default(),
            kick: Notify::new(),
            next_wake_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl<K: ?Sized + HoldKind> HoldRegistry<K> {
    /// Records a successful acquisition: joins the owner's existing hold with the same token
    /// (re-entry) or starts a new one. Returns the hold the new guard belongs to.
    ///
    /// `sent_at` is the latest instant known to precede the acquisition in Redis, and the hold
    /// lasts `lasts` from then: the lease requested, or less for a hold a fair release granted
    /// (see `lua/lib/hold.lua`), which is renewed to the full lease a third of `lasts` later.
    /// `queued`: about how many waiters stayed queued in Redis behind it (0: none; a hold that
    /// others wait for is contended). `redis`: the hold in Redis it stands on, for a hold
    /// handed over within the process
    /// (`crate::engine::cohort`); None for a hold taken from Redis, which stands on itself.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn adopt(
        &self,
        lock: Arc<K>,
        owner: &Owner,
        token: u64,
        lease: Lease,
        (sent_at, lasts): (Instant, Duration),
        queued: u32,
        redis: Option<RedisHold>,
    ) -> Arc<Hold<K>> {
        let contended = queued > 0;
        let redis = redis.unwrap_or_else(|| RedisHold {
            owner: owner.clone(),
            token,
            written_at: sent_at,
            queued,
            quiet_until: None,
        });
        let key = hold_key(lock.hold_role(), owner.id(), lock.keys().id());
        let initial = lease.initial();
        let lasts = lasts.min(initial);
        let fresh = |lock: Arc<K>| {
            let renew_at = if lasts < initial {
                // A short grant is topped up to the full lease on the watchdog's usual rhythm
                // (a third into what it has): a hold released before then costs no renewal.
                Some(sent_at + lasts / 3)
            } else {
                matches!(lease, Lease::Watchdog { .. }).then(|| sent_at + initial / 3)
            };
            Arc::new(Hold {
                lock,
                owner: owner.clone(),
                token,
                redis: redis.clone(),
                lease,
                key: key.clone(),
                acquired_at: sent_at,
                timing: StdMutex::new(Timing {
                    deadline: sent_at + lasts,
                    renew_at,
                    last_error: None,
                    extended_at: None,
                }),
                guards: AtomicUsize::new(1),
                contended: AtomicBool::new(contended),
                retaken: AtomicBool::new(false),
                lost: LostSignal::default(),
            })
        };
        let hold = match self.holds.entry(key.clone()) {
            dashmap::Entry::Occupied(mut entry) => {
                let existing = entry.get();
                if existing.token == token && existing.lost_cause().is_none() {
                    existing.guards.fetch_add(1, Ordering::AcqRel);
                    existing.renewed(sent_at, lasts.min(existing.lease.initial()));
                    existing.clone()
                } else {
                    let hold = fresh(lock);
                    let old = entry.insert(hold.clone());
                    if old.token != token {
                        old.mark_lost(LostCause::TokenChanged);
                    }
                    self.forget_lock(&old);
                    let lock_id = hold.lock.keys().id().clone();
                    self.by_lock.entry(lock_id).or_default().push(hold.clone());
                    hold
                }
            }
            dashmap::Entry::Vacant(entry) => {
                let hold = entry.insert(fresh(lock)).clone();
                let lock_id = hold.lock.keys().id().clone();
                self.by_lock.entry(lock_id).or_default().push(hold.clone());
                hold
            }
        };
        // Most holds are due a third of a lease from now, later than the watchdog's next
        // wake-up: then there is no need to disturb it (a kick costs a task wake-up per lock).
        let due = {
            let timing = hold.timing();
            timing.renew_at.unwrap_or(timing.deadline)
        };
        if self.ms_since_epoch(due) < self.next_wake_ms.load(Ordering::Acquire) {
            self.kick.notify_one();
        }
        hold
    }

    /// Records a successful explicit extension of `hold` (see [`Hold::extended`]) and wakes
    /// the watchdog: the deadline may be sooner than its next wake-up.
    pub(crate) fn extended(&self, hold: &Hold<K>, sent_at: Instant, lease: Duration) {
        hold.extended(sent_at, lease);
        self.kick.notify_one();
    }

    /// Forgets one guard of `hold`; the hold leaves the registry with its last guard.
    pub(crate) fn release_guard(&self, hold: &Arc<Hold<K>>) {
        if let dashmap::Entry::Occupied(entry) = self.holds.entry(hold.key.clone()) {
            if Arc::ptr_eq(entry.get(), hold) && hold.guards.fetch_sub(1, Ordering::AcqRel) == 1 {
                entry.remove();
                self.forget_lock(hold);
            }
        }
    }

    /// Every live hold (a snapshot).
    pub(crate) fn all(&self) -> Vec<Arc<Hold<K>>> {
        self.holds.iter().map(|e| e.value().clone()).collect()
    }

    /// Removes and returns every hold (shutdown).
    pub(crate) fn drain(&self) -> Vec<Arc<Hold<K>>> {
        let keys: Vec<String> = self.holds.iter().map(|e| e.key().clone()).collect();
        let holds: Vec<Arc<Hold<K>>> = keys
            .into_iter()
            .filter_map(|k| self.holds.remove(&k).map(|(_, h)| h))
            .collect();
        for hold in &holds {
            self.forget_lock(hold);
        }
        holds
    }

    /// The earliest lease deadline of this client's holds of `role` (see
    /// [`HoldKind::hold_role`]) of the lock `lock_id` for other owners than `owner`, if there
    /// are any.
    pub(crate) fn held_by_other(
        &self,
        lock_id: &str,
        role: &str,
        owner: &Owner,
    ) -> Option<Instant> {
        let holds = self.by_lock.get(lock_id)?;
        holds
            .iter()
            .filter(|hold| {
                hold.lock.hold_role() == role
                    && hold.owner.id() != owner.id()
                    && hold.lost_cause().is_none()
            })
            .map(|hold| hold.deadline())
            .min()
    }

    /// Whether this client keeps a hold of the lock `lock_id` (any owner, any role).
    pub(crate) fn holds_lock(&self, lock_id: &str) -> bool {
        self.by_lock.contains_key(lock_id)
    }

    /// A waiter queued behind this client's hold of the lock `lock_id` that stands on the
    /// Redis hold with `token` (None: every hold of the lock): the hold is contended now.
    pub(crate) fn queued_behind(&self, lock_id: &str, token: Option<u64>) {
        let Some(holds) = self.by_lock.get(lock_id) else {
            return;
        };
        for hold in holds
            .iter()
            .filter(|hold| token.map_or(true, |token| hold.redis.token == token))
        {
            hold.contended.store(true, Ordering::Release);
        }
    }

    fn forget_lock(&self, hold: &Arc<Hold<K>>) {
        let lock_id = hold.lock.keys().id();
        if let dashmap::Entry::Occupied(mut entry) = self.by_lock.entry(lock_id.clone()) {
            entry.get_mut().retain(|other| !Arc::ptr_eq(other, hold));
            if entry.get().is_empty() {
                entry.remove();
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.holds.len()
    }

    fn ms_since_epoch(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

/// A batch of holds renewed by one script call: same script, same hash slot, same lease.
type BatchKey = (&'static str, u16, u64);

/// Holds due for renewal, each with the lease to request.
type Due<K> = Vec<(Arc<Hold<K>>, Duration)>;

/// The watchdog: one task per client renewing every hold in batches.
///
/// Renewals run as their own tasks, so a slow or hanging server never delays the deadline
/// checks of other holds: a hold whose renewal does not come back in time is declared lost at
/// its deadline.
pub(crate) async fn run_watchdog<K: ?Sized + HoldKind>(
    ctx: Arc<Context>,
    registry: &HoldRegistry<K>,
    mut shutdown: watch::Receiver<bool>,
) {
    const MAX_BATCH: usize = 256;
    let mut renewals = tokio::task::JoinSet::new();
    loop {
        // While scanning, every new hold kicks (the scan may miss it); afterwards only holds
        // due before the planned wake-up do.
        registry.next_wake_ms.store(u64::MAX, Ordering::Release);
        let now = Instant::now();
        let mut next = now + Duration::from_secs(3600);
        let mut batches: std::collections::HashMap<BatchKey, Due<K>> = Default::default();
        for entry in registry.holds.iter() {
            let hold = entry.value();
            if hold.lost_cause().is_some() {
                continue;
            }
            let mut timing = hold.timing();
            if timing.deadline <= now {
                let cause = match timing.last_error.clone() {
                    Some(error) => LostCause::RenewalFailed(error),
                    None => LostCause::Expired,
                };
                drop(timing);
                hold.mark_lost(cause);
                continue;
            }
            next = next.min(timing.deadline);
            let Some(renew_at) = timing.renew_at else {
                continue;
            };
            if renew_at > now {
                next = next.min(renew_at);
                continue;
            }
            match hold.next_renewal_lease(now) {
                Some(lease) => {
                    // In flight: not due again until it answers (or a retry is scheduled).
                    timing.renew_at = Some(timing.deadline);
                    let script = hold.lock.renew_script();
                    let key = (
                        script.name(),
                        hold.lock.keys().shard(),
                        lease.as_millis() as u64,
                    );
                    batches.entry(key).or_default().push((hold.clone(), lease));
                }
                None => timing.renew_at = None,
            }
        }
        for (_, holds) in batches {
            for chunk in holds.chunks(MAX_BATCH) {
                renewals.spawn(renew_batch(ctx.clone(), chunk.to_vec()));
            }
        }

        let sleep_until = next.max(Instant::now() + Duration::from_millis(1));
        registry
            .next_wake_ms
            .store(registry.ms_since_epoch(sleep_until), Ordering::Release);
        tokio::select! {
            _ = tokio::time::sleep_until(sleep_until) => {}
            _ = registry.kick.notified() => {}
            Some(_) = renewals.join_next(), if !renewals.is_empty() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// One renew script call for holds that share a script and a hash slot: each gets `lease`
/// from now. Returns one code per hold (see `lua/hold_renew.lua`).
pub(crate) async fn renew<K: ?Sized + HoldKind>(
    ctx: &Context,
    holds: &[&Arc<Hold<K>>],
    lease: Duration,
) -> Result<Vec<i64>> {
    let holds: Vec<(&K, &Owner, u64)> = holds
        .iter()
        .map(|hold| (&*hold.lock, &hold.redis.owner, hold.redis.token))
        .collect();
    renew_holds(ctx, &holds, lease).await
}

/// One renew script call for the holds given as (lock, owner, token), which share a script
/// and a hash slot, whether or not a [`HoldRegistry`] tracks them (a Redlock's do not): each
/// gets `lease` from now. Returns one code per hold (see `lua/hold_renew.lua`).
pub(crate) async fn renew_holds<K: ?Sized + HoldKind>(
    ctx: &Context,
    holds: &[(&K, &Owner, u64)],
    lease: Duration,
) -> Result<Vec<i64>> {
    let Some(&(first, _, _)) = holds.first() else {
        return Ok(Vec::new());
    };
    let script: &Script = first.renew_script();
    let name = first.keys().name();
    let mut keys = Vec::new();
    let mut args: Vec<Value> = vec![(lease.as_millis() as i64).into()];
    for &(lock, owner, token) in holds {
        keys.extend(lock.renew_keys());
        args.extend(lock.renew_args(owner, token));
    }
    let reply = ctx.run(script, name, keys, args).await?;
    int_array(script.name(), reply)
}

/// Checks every hold of the client against Redis at once, without renewing any (the renew
/// scripts with lease 0), and reports each hold that is gone through its lost signal. Called
/// when the client saw signs that the server lost data (see [`crate::watch`]). A batch whose
/// check fails is left to the watchdog and the hold's deadline.
pub(crate) async fn verify_holds<K: ?Sized + HoldKind>(ctx: &Context, registry: &HoldRegistry<K>) {
    const MAX_BATCH: usize = 256;
    let mut batches: std::collections::HashMap<(&'static str, u16), Vec<Arc<Hold<K>>>> =
        Default::default();
    for hold in registry.all() {
        if hold.lost_cause().is_none() {
            let key = (hold.lock.renew_script().name(), hold.lock.keys().shard());
            batches.entry(key).or_default().push(hold);
        }
    }
    for (_, holds) in batches {
        for chunk in holds.chunks(MAX_BATCH) {
            let refs: Vec<&Arc<Hold<K>>> = chunk.iter().collect();
            match renew(ctx, &refs, Duration::ZERO).await {
                Ok(codes) => {
                    for (hold, code) in chunk.iter().zip(codes) {
                        if code != 1 {
                            apply_renewal(hold, code, Instant::now(), Duration::ZERO);
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, holds = chunk.len(), "hold check failed"),
            }
        }
    }
}

/// Applies a renew code to its hold.
pub(crate) fn apply_renewal<K: ?Sized + HoldKind>(
    hold: &Hold<K>,
    code: i64,
    sent_at: Instant,
    lease: Duration,
) {
    match code {
        1 => hold.renewed(sent_at, lease),
        0 => hold.mark_lost(LostCause::KeyDeleted),
        -1 => hold.mark_lost(LostCause::OwnerChanged),
        _ => hold.mark_lost(LostCause::TokenChanged),
    }
}

/// Renews one batch and applies each result to its hold.
async fn renew_batch<K: ?Sized + HoldKind>(ctx: Arc<Context>, holds: Due<K>) {
    let Some((_, lease)) = holds.first() else {
        return;
    };
    let lease = *lease;
    let sent_at = Instant::now();
    let span = tracing::debug_span!(
        "renew",
        holds = holds.len(),
        lease_ms = lease.as_millis() as u64
    );
    let refs: Vec<&Arc<Hold<K>>> = holds.iter().map(|(hold, _)| hold).collect();
    match renew(&ctx, &refs, lease).instrument(span).await {
        Ok(codes) => {
            for ((hold, lease), code) in holds.iter().zip(codes) {
                apply_renewal(hold, code, sent_at, *lease);
            }
            tracing::trace!(holds = holds.len(), "renewed");
        }
        Err(error) => {
            tracing::warn!(%error, holds = holds.len(), "renewal failed; retrying until the lease deadline");
            let error = Arc::new(error);
            let retry = Instant::now()
                + (lease / 10).clamp(Duration::from_millis(5), Duration::from_millis(500));
            for (hold, _) in &holds {
                let mut timing = hold.timing();
                timing.last_error = Some(error.clone());
                if timing.renew_at.is_some() {
                    timing.renew_at = Some(retry);
                }
            }
        }
    }
}

/// Caps a duration to what Redis and the crate accept.
pub(crate) fn clamp_ttl(ms: i64, fallback: Duration) -> Duration {
    if ms <= 0 {
        fallback
    } else {
        Duration::from_millis(ms as u64).min(MAX_DURATION)
    }
}

/// Validates a lease for an explicit extension.
pub(crate) fn check_extension(lease: Duration) -> Result<()> {
    check_lease("extension", lease)
}
