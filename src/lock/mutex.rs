//! [`Mutex`] and [`FairMutex`]: the exclusive reentrant lock handles (one shared core); and
//! the barging driver.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::context::BoxFuture;
use crate::engine::{Attempt, Driver, Engine, HandOver, Released};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lease::{HoldKind, Lease};
use crate::lock::guard::{FairMutexGuard, MutexGuard};
use crate::lock::{
    acquire_reply, force_unlock_with, inspect, leave_queue, release_call, release_reply,
    release_with, run_call, successor_args, Acquirer, LockState,
};
use crate::notify::{Bid, WakeRule};
use crate::owner::Owner;
use crate::queue::RedisQueue;
use crate::scripts::{Key, ScriptArgs, ScriptKeys, SCRIPTS};

/// An exclusive, reentrant distributed lock (Redisson's `RLock`), made by
/// [`LockClient::mutex`](crate::LockClient::mutex): *barging*. For strict FIFO across processes use [`FairMutex`]; a
/// `FairMutex` also converts into a `Mutex` (`Mutex::from`) for code that picks the ordering
/// at run time ([`is_fair`](Self::is_fair) tells which one a handle has).
///
/// **Ordering** (local first, then FIFO, with eventual fairness). A release whose process has
/// a task that wants the lock hands the lock straight to that task in the release's own round
/// trip (no event): a task already waiting, or one that asks before the releasing task next yields after
/// the release ([`Config::defer_release`](crate::Config::defer_release), the usual worker
/// loop). It does so only while no waiter queued in Redis has waited
/// [`Config::handover_limit`](crate::Config::handover_limit) (20 ms by default); otherwise
/// it grants the lock to the waiter queued longest, and only that waiter's process hears of
/// it (one event into its inbox): one release wakes one task of one process, however many
/// wait. The holder so granted may still hand the lock to a task of its own process once
/// before the queue's next turn, unless the next waiter has waited twice the bound. A free
/// lock goes to whoever asks first (nobody is queued while it is free). Within the bound,
/// hand-overs inside a process trade fairness for throughput, as `parking_lot`'s eventual
/// fairness does; past it the queue decides, every other hold, and every hold past twice the
/// bound, so waits settle near twice the bound under a full load. Of the tasks of one process
/// that wait (handles without an owner), one queues in Redis for all of them; the others wait
/// in the process and get the lock from it there, in the order they began to wait; a task
/// that releases and asks again at once takes the lock straight back until one of them has
/// waited a twentieth of the bound (1 ms by default).
///
/// A fair lock and a barging lock with the same name are different locks.
///
/// **Re-entry.** A handle without an owner takes every hold under a fresh [`Owner`], so two
/// tasks sharing a handle exclude each other. A handle bound with [`Mutex::with_owner`]
/// re-enters: each acquisition adds one to the hold count and each guard released takes one
/// away; the lock is free when the count reaches zero. The fencing token stays the same across
/// re-entry. Re-entry never waits, also on a [`FairMutex`].
///
/// **Cancellation.** Dropping a pending [`lock`](Self::lock) future leaves nothing behind: no
/// local waiter, no place in a queue, and a hold that its in-flight script took, or that a
/// release handed it, is released.
///
/// **Leases.** By default the hold has a watchdog lease ([`crate::Config::watchdog_lease`],
/// renewed every third of it while the guard lives); see [`Lease`] for fixed leases and caps.
///
/// ```no_run
/// # async fn demo(locks: fredlock::LockClient) -> fredlock::Result<()> {
/// let orders = locks.mutex("orders")?;
/// let guard = orders.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex(Handle);

/// An exclusive, reentrant, *fair* distributed lock (Redisson's `RFairLock`), made by
/// [`LockClient::fair_mutex`](crate::LockClient::fair_mutex). Same methods as [`Mutex`]; a function that needs FIFO order can
/// ask for this type.
///
/// **Ordering.** Strict FIFO across all processes, in the order in which acquisitions joined
/// the queue in Redis, with no hand-over inside a process. [`try_lock`](Self::try_lock) fails
/// while the lock is held (and nobody is queued while it is free). A release grants the lock
/// to the next waiter and wakes only it (no herd, and no script call of its own). A task that
/// asks again right after its own release joins the queue's tail in that release's call
/// ([`Config::defer_release`](crate::Config::defer_release)). A waiter
/// that times out or is cancelled leaves the queue at once and passes the turn on. A waiter
/// whose process died is passed over (see [`Config::waiter_lease`](crate::Config::waiter_lease)).
/// A holder whose process died takes the queue with it when its lease runs out: its waiters
/// queue again in the order they notice.
///
/// A fair lock and a barging lock with the same name are different locks. Re-entry,
/// cancellation and leases work as for [`Mutex`], and `Mutex::from(fair)` gives the same lock
/// behind the general handle type.
///
/// ```no_run
/// # async fn demo(locks: fredlock::LockClient) -> fredlock::Result<()> {
/// let tickets = locks.fair_mutex("tickets")?;
/// let guard: fredlock::FairMutexGuard = tickets.lock().await?;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FairMutex(Handle);

/// What [`Mutex`] and [`FairMutex`] share: the acquirer. The public handles forward to it
/// (see `mutex_handle!`) and wrap its guards in their own guard type.
#[derive(Clone)]
struct Handle {
    inner: Acquirer<ExclusiveDriver>,
    fair: bool,
}

impl Handle {
    /// The lock's key in Redis: the order in which a [`MultiLock`](crate::MultiLock) takes
    /// its members.
    fn hold_key(&self) -> String {
        self.inner.driver.keys().key("")
    }

    fn name(&self) -> &str {
        self.inner.driver.keys().name()
    }

    fn with_owner(self, owner: &Owner) -> Handle {
        Handle {
            inner: self.inner.with_owner(owner),
            fair: self.fair,
        }
    }

    fn with_lease(self, lease: Lease) -> Result<Handle> {
        Ok(Handle {
            inner: self.inner.with_lease(lease)?,
            fair: self.fair,
        })
    }

    async fn state(&self) -> Result<LockState> {
        inspect(self.inner.driver.as_ref()).await
    }

    async fn force_unlock(&self) -> Result<bool> {
        let removed = self.inner.driver.force_unlock().await?;
        tracing::info!(lock = self.name(), removed, "force unlock");
        Ok(removed)
    }

    fn debug(&self, f: &mut fmt::Formatter<'_>, kind: &str) -> fmt::Result {
        f.debug_struct(kind)
            .field("name", &self.name())
            .field("fair", &self.fair)
            .field("owner", &self.inner.owner())
            .finish()
    }
}

impl Mutex {
    pub(crate) fn barging(engine: Arc<Engine>, name: &str) -> Result<Mutex> {
        let keys = engine.ctx.keyspace.lock("mutex", name)?;
        let driver = ExclusiveDriver {
            keys,
            engine,
            fair: false,
            granted: true,
        };
        Ok(Mutex(Handle {
            inner: Acquirer::new(Arc::new(driver)),
            fair: false,
        }))
    }

    /// Whether this handle is a fair (FIFO) lock: one converted from a [`FairMutex`].
    pub fn is_fair(&self) -> bool {
        self.0.fair
    }

    /// The lock's key in Redis (see [`Handle::hold_key`]).
    pub(crate) fn hold_key(&self) -> String {
        self.0.hold_key()
    }

    /// The driver of one instance of a [`Redlock`](crate::Redlock): the barging mutex of that
    /// name, whose waiters queue only to be woken. A release never grants them the lock: a
    /// Redlock round must take it on every instance itself, with its own validity.
    pub(crate) fn redlock_instance(engine: Arc<Engine>, name: &str) -> Result<Arc<dyn Driver>> {
        let keys = engine.ctx.keyspace.lock("mutex", name)?;
        Ok(Arc::new(ExclusiveDriver {
            keys,
            engine,
            fair: false,
            granted: false,
        }))
    }
}

impl FairMutex {
    pub(crate) fn new(engine: Arc<Engine>, name: &str) -> Result<FairMutex> {
        let keys = engine.ctx.keyspace.lock("fair", name)?;
        let driver = ExclusiveDriver {
            keys,
            engine,
            fair: true,
            granted: true,
        };
        Ok(FairMutex(Handle {
            inner: Acquirer::new(Arc::new(driver)),
            fair: true,
        }))
    }
}

/// The same fair lock behind the general handle type, for code that picks the ordering at
/// run time; its acquisitions stay FIFO and return [`MutexGuard`]s.
impl From<FairMutex> for Mutex {
    fn from(fair: FairMutex) -> Mutex {
        Mutex(fair.0)
    }
}

/// The public methods of a mutex handle type, forwarding to [`Handle`]; `$guard` wraps the
/// guards it returns.
macro_rules! mutex_handle {
    ($handle:ident, $guard:ident) => {
        impl $handle {
            /// The lock's name.
            pub fn name(&self) -> &str {
                self.0.name()
            }

            /// A handle whose acquisitions are taken under `owner`, so they re-enter each other.
            pub fn with_owner(self, owner: &Owner) -> $handle {
                $handle(self.0.with_owner(owner))
            }

            /// A handle whose acquisitions use `lease`. Fails with
            /// [`Error::InvalidDuration`](crate::Error::InvalidDuration) for zero or
            /// out-of-range leases.
            pub fn with_lease(self, lease: Lease) -> Result<$handle> {
                Ok($handle(self.0.with_lease(lease)?))
            }

            /// The owner this handle is bound to, if any.
            pub fn owner(&self) -> Option<&Owner> {
                self.0.inner.owner()
            }

            /// Waits until the lock is acquired.
            pub async fn lock(&self) -> Result<$guard> {
                self.0.inner.wait_forever().await.map($guard::new)
            }

            /// One attempt without waiting: `Ok(None)` when another owner holds the lock (or,
            /// for a fair lock, when anyone is queued).
            pub async fn try_lock(&self) -> Result<Option<$guard>> {
                Ok(self
                    .0
                    .inner
                    .wait_for(Duration::ZERO)
                    .await?
                    .map($guard::new))
            }

            /// Waits at most `timeout`: `Ok(None)` when it passed without the lock.
            pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<$guard>> {
                Ok(self.0.inner.wait_for(timeout).await?.map($guard::new))
            }

            /// Whether anyone holds the lock now.
            pub async fn is_locked(&self) -> Result<bool> {
                Ok(self.0.state().await?.locked)
            }

            /// A consistent snapshot of the lock (one script call).
            pub async fn state(&self) -> Result<LockState> {
                self.0.state().await
            }

            /// Frees the lock whoever holds it and wakes the next waiter. The fencing counter is
            /// not reset. Returns whether a hold was removed. The evicted holder's guard learns
            /// it through [`LockGuard::lost`](crate::LockGuard::lost) at its next renewal.
            pub async fn force_unlock(&self) -> Result<bool> {
                self.0.force_unlock().await
            }
        }

        impl fmt::Debug for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.debug(f, stringify!($handle))
            }
        }
    };
}

mutex_handle!(Mutex, MutexGuard);
mutex_handle!(FairMutex, FairMutexGuard);

/// Keys and scripts of one exclusive lock, barging ([`Mutex`]) or fair ([`FairMutex`]): both
/// run the `hold_*` scripts (`lua/lib/hold.lua`), whose hash keeps the hold and the queue.
/// Key names are built per call rather than stored: a handle per lock stays small (thousands
/// of locks), and a script call allocates its key strings anyway.
pub(crate) struct ExclusiveDriver {
    engine: Arc<Engine>,
    keys: LockKeys,
    /// FIFO across all waiters: no hand-over to a waiter of the releasing process.
    fair: bool,
    /// Whether a release may grant the lock to a queued waiter of this handle (false for a
    /// Redlock instance: its waiters are only woken).
    granted: bool,
}

impl ExclusiveDriver {
    fn script_keys(&self) -> ScriptKeys<'_> {
        ScriptKeys::new(&self.keys)
    }

    /// The hand-over bound the release script applies (`ARGV[12]` of `lua/hold_release.lua`):
    /// 0 for a fair lock, whose queue is always due.
    fn handover_limit_ms(&self) -> i64 {
        if self.fair {
            0
        } else {
            self.engine.ctx.config.handover_limit.as_millis() as i64
        }
    }

    /// The retry window (tombstone ttl) in ms.
    fn window_ms(&self) -> i64 {
        self.engine.ctx.tombstone_ttl().as_millis() as i64
    }

    /// `lua/hold_release.lua`, handing the lock to `successor` if it frees it.
    async fn release_script(
        &self,
        owner: &Owner,
        token: u64,
        floor: Option<u64>,
        op: &str,
        all: bool,
        successor: Option<(&str, &Bid)>,
    ) -> Result<Released> {
        let ctx = &self.engine.ctx;
        if successor.is_none() && floor.is_none() && self.engine.contention.quiet(self.keys.id()) {
            if let Some(released) = self.free_fast(owner, token, op, all).await? {
                return Ok(released);
            }
        }
        let extra = successor_args(ctx, successor, self.handover_limit_ms(), floor);
        let args = release_call(ctx, owner, token, op, all)
            .events(ctx.event_args(&self.keys))
            .extra(extra);
        release_with(
            ctx,
            &self.keys,
            &SCRIPTS.hold_release,
            self.script_keys().through(Key::Events),
            args,
        )
        .await
    }
}

/// The fast paths of an uncontended take and release (`lua/hold_take.lua`,
/// `lua/hold_free.lua`), tried first for a lock this client has not seen contended lately
/// (`crate::engine::contention`); when one does not apply, it changes nothing and the full
/// script runs (and when it found the lock contended, the hints remember that).
impl ExclusiveDriver {
    /// Whether an attempt tries the fast take first: the lock is quiet, and this client holds
    /// none of it (a re-entry, or a wait behind a hold of this client, is no take).
    fn fast_first(&self) -> bool {
        let lock_id = self.keys.id();
        self.engine.contention.quiet(lock_id) && !self.engine.holds.holds_lock(lock_id)
    }

    /// `lua/hold_take.lua`: the attempt's answer, or None when the fast take does not apply.
    async fn take_fast(
        &self,
        owner: &Owner,
        op: &str,
        lease: Duration,
        notice: bool,
    ) -> Result<Option<Attempt>> {
        let ctx = &self.engine.ctx;
        let script = &SCRIPTS.hold_take;
        let tag = if notice { ctx.inbox_tag.as_ref() } else { "" };
        let args = ScriptArgs::acquire(owner.id(), lease.as_millis() as i64, op, "", 0)
            .extra([tag.into()]);
        let keys = self.script_keys().through(Key::Hold);
        let reply = run_call(ctx, &self.keys, script, keys, args).await?;
        if self.not_fast(&reply) {
            return Ok(None);
        }
        ctx.fast_paths.fetch_add(1, Ordering::Relaxed);
        acquire_reply(ctx, script, &reply).map(Some)
    }

    /// `lua/hold_free.lua`: the release's answer, or None when the fast release does not
    /// apply.
    async fn free_fast(
        &self,
        owner: &Owner,
        token: u64,
        op: &str,
        all: bool,
    ) -> Result<Option<Released>> {
        let ctx = &self.engine.ctx;
        let script = &SCRIPTS.hold_free;
        let args = release_call(ctx, owner, token, op, all);
        let keys = self.script_keys().through(Key::Hold);
        let reply = run_call(ctx, &self.keys, script, keys, args).await?;
        if self.not_fast(&reply) {
            return Ok(None);
        }
        ctx.fast_paths.fetch_add(1, Ordering::Relaxed);
        release_reply(script, &reply).map(Some)
    }

    /// Whether a fast path's reply says it did not apply; `{-2}` also says the lock is
    /// contended, which the hints remember.
    fn not_fast(&self, reply: &[i64]) -> bool {
        match reply {
            [CONTENDED] => {
                self.engine.contention.contended(self.keys.id());
                true
            }
            [NOT_ITS_CASE] => true,
            _ => false,
        }
    }
}

/// A fast path's reply when the lock is contended (held by another owner, or waiters queued).
const CONTENDED: i64 = -2;
/// A fast path's reply when the case is not its own for another reason (a lock without a
/// hash, a hold that is not the caller's).
const NOT_ITS_CASE: i64 = -3;

impl HoldKind for ExclusiveDriver {
    fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The hash and the wait queue, whose ttl follows the hold's (`lua/hold_renew.lua`).
    fn renew_keys(&self) -> Vec<String> {
        self.script_keys().through(Key::Queue)
    }
}

impl Driver for ExclusiveDriver {
    fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    fn try_acquire(
        self: Arc<Self>,
        owner: Owner,
        waiter: Arc<str>,
        op: String,
        lease: Duration,
        waiting: bool,
    ) -> BoxFuture<'static, Result<Attempt>> {
        Box::pin(async move {
            let ctx = &self.engine.ctx;
            // A hold whose release this client may defer wants to hear of its first waiter
            // (`lua/hold_acquire.lua`, `ARGV[10]`).
            let notice = self.defers_releases();
            if self.fast_first() {
                let fast = self.take_fast(&owner, &op, lease, notice).await?;
                if let Some(attempt) = fast {
                    return Ok(attempt);
                }
            }
            let (waiter, grant_ms) = match (waiting, self.granted) {
                (false, _) => ("", 0),
                (true, true) => (waiter.as_ref(), ctx.config.waiter_lease.as_millis() as i64),
                (true, false) => (waiter.as_ref(), -1),
            };
            let script = &SCRIPTS.hold_acquire;
            let args =
                ScriptArgs::acquire(owner.id(), lease.as_millis() as i64, &op, waiter, grant_ms)
                    .events(ctx.event_args(&self.keys))
                    .extra([
                        ctx.inbox_tag.as_ref().into(),
                        if notice { "1" } else { "" }.into(),
                    ]);
            let keys = self.script_keys().through(Key::Events);
            let reply = run_call(ctx, &self.keys, script, keys, args).await?;
            let attempt = acquire_reply(ctx, script, &reply)?;
            if matches!(attempt, Attempt::Busy { .. }) {
                self.engine.contention.contended(self.keys.id());
            }
            Ok(attempt)
        })
    }

    fn release<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        op: &'a str,
        all: bool,
    ) -> BoxFuture<'a, Result<Released>> {
        Box::pin(self.release_script(owner, token, None, op, all, None))
    }

    fn handover(&self) -> Option<&dyn HandOver> {
        let hands_over =
            !self.fair && self.granted && !self.engine.ctx.config.handover_limit.is_zero();
        hands_over.then_some(self as &dyn HandOver)
    }

    /// A fair lock takes deferred releases over too: its take-over never hands the lock over
    /// while anybody waits (limit 0), but one call both grants the lock to the queue and queues
    /// the acquisition, where a release and a busy attempt would take two.
    fn take_over(&self) -> Option<&dyn HandOver> {
        if self.fair && self.granted {
            return Some(self);
        }
        self.handover()
    }

    fn redis_queue(self: Arc<Self>) -> Option<Arc<dyn RedisQueue>> {
        Some(self)
    }
}

impl HandOver for ExclusiveDriver {
    fn release_to<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        floor: Option<u64>,
        op: &'a str,
        successor: Option<(&'a str, &'a Bid)>,
    ) -> BoxFuture<'a, Result<Released>> {
        Box::pin(self.release_script(owner, token, floor, op, false, successor))
    }

    fn hands_over_locally(&self) -> bool {
        self.engine.ctx.config.local_handover
    }
}

impl ExclusiveDriver {
    /// Frees the lock whoever holds it and wakes the next waiter; true if a hold was removed.
    async fn force_unlock(&self) -> Result<bool> {
        let args = ScriptArgs::no_call()
            .window(self.window_ms())
            .events(self.engine.ctx.event_args(&self.keys));
        let removed = force_unlock_with(
            &self.engine.ctx,
            &self.keys,
            &SCRIPTS.hold_force_unlock,
            self.script_keys().through(Key::Events),
            args,
        )
        .await?;
        // Tasks of this client that wait on a hold of this client, not queued in Redis, hear
        // of it from here.
        self.engine.waiters.dispatch(self.keys.id(), &WakeRule::All);
        Ok(removed)
    }
}

impl RedisQueue for ExclusiveDriver {
    fn queue_keys(&self) -> ScriptKeys<'_> {
        self.script_keys()
    }

    fn place_keys(&self) -> Vec<String> {
        self.script_keys().through(Key::Queue)
    }

    fn vouches_for_waiters(&self) -> bool {
        false
    }

    fn leave(&self, waiter: Arc<str>) -> BoxFuture<'static, Result<()>> {
        let (engine, keys) = (self.engine.clone(), self.keys.clone());
        leave_queue(engine, keys, &SCRIPTS.hold_leave, waiter)
    }
}
