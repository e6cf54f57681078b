//! [`Semaphore`]: a bounded number of permits, each held like a lock.
//!
//! A semaphore is the read side of a read-write lock with a bound: at most `permits` read holds
//! at once, and no writer ever. Every acquisition has an owner of its own, so one read hold is
//! one permit, with everything a hold has: its own lease kept by the watchdog, a fencing token,
//! a lease-lost signal and a release on drop. The bound lives in the lock's hash (field `n` of
//! `lua/lib/rw.lua`), so the read-write lock's queue, grants, heartbeat and renewal serve it
//! unchanged: the engine sees one more [`RwDriver`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lease::{HoldKind, Lease};
use crate::lock::guard::PermitGuard;
use crate::lock::rwlock::{Mode, RwDriver};
use crate::lock::Acquirer;

/// A distributed semaphore whose permits are held like locks (Redisson's
/// `RPermitExpirableSemaphore`, with fencing tokens and push wake-ups).
///
/// **Ordering.** Strict FIFO across processes: an acquisition takes a permit when fewer than
/// [`permits`](Semaphore::permits) are held and nobody is queued; otherwise it queues in Redis.
/// A released permit is granted to the head of the queue at once, and only the process of that
/// waiter hears of it (one event into its inbox), holding the permit already.
///
/// **Permits.** Each acquisition takes one permit and gets a [`PermitGuard`]. Every user of
/// one semaphore name must give the same count: while permits are held or waiters queue, a
/// handle with another count gets [`Error::PermitsMismatch`] and changes nothing. Once the
/// semaphore is idle, the next acquisition's count applies. There is no re-entry: an
/// acquisition never shares a permit with another.
///
/// **Leases.** Each permit has its own lease, renewed by the watchdog (or fixed, see
/// [`with_lease`](Semaphore::with_lease)). A permit whose holder died frees itself when its
/// lease ends; the waiter at the head looks again by then, without an event.
///
/// **Fencing tokens.** Every permit gets a new token, strictly greater than every earlier token
/// of the semaphore, so concurrent holders hold different tokens.
///
/// **Cancellation.** A dropped acquisition leaves the queue; a permit granted to it meanwhile is
/// given back, to the next in line.
///
/// **Size.** The holds are lines of one hash that every call reads, so a semaphore is sized for
/// up to [`MAX_PERMITS`](Semaphore::MAX_PERMITS) permits.
#[derive(Clone)]
pub struct Semaphore {
    permits: u32,
    acquirer: Acquirer<RwDriver>,
}

/// The state of a semaphore as seen by [`Semaphore::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreState {
    /// Permits held now (live leases).
    pub held: u32,
    /// Permits free now, by this handle's count.
    pub available: u32,
    /// Time until the last held permit's lease ends, if any is held.
    pub remaining: Option<Duration>,
}

impl Semaphore {
    /// The largest permit count.
    pub const MAX_PERMITS: u32 = 1024;

    pub(crate) fn new(engine: Arc<Engine>, name: &str, permits: u32) -> Result<Semaphore> {
        if permits == 0 || permits > Semaphore::MAX_PERMITS {
            return Err(Error::InvalidPermits(permits.into()));
        }
        let keys = engine.ctx.keyspace.lock("sem", name)?;
        let driver = RwDriver::new(engine, keys, Mode::Read, Some(permits));
        Ok(Semaphore {
            permits,
            acquirer: Acquirer::new(Arc::new(driver)),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.acquirer.driver.keys().name()
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// A handle whose permits use `lease` (see [`Lease`]).
    pub fn with_lease(self, lease: Lease) -> Result<Semaphore> {
        Ok(Semaphore {
            permits: self.permits,
            acquirer: self.acquirer.with_lease(lease)?,
        })
    }

    /// Waits for a permit.
    pub async fn acquire(&self) -> Result<PermitGuard> {
        self.acquirer.wait_forever().await.map(PermitGuard::new)
    }

    /// One attempt at a permit: `Ok(None)` when every permit is held or others queue.
    pub async fn try_acquire(&self) -> Result<Option<PermitGuard>> {
        self.acquire_timeout(Duration::ZERO).await
    }

    /// Waits at most `timeout` for a permit.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<PermitGuard>> {
        Ok(self.acquirer.wait_for(timeout).await?.map(PermitGuard::new))
    }

    /// A consistent snapshot (one script call).
    pub async fn state(&self) -> Result<SemaphoreState> {
        let [_, _, _, held, last] = self.acquirer.driver.inspect().await?;
        let held = u32::try_from(held.max(0)).unwrap_or(u32::MAX);
        Ok(SemaphoreState {
            held,
            available: self.permits.saturating_sub(held),
            remaining: (last > 0).then(|| Duration::from_millis(last as u64)),
        })
    }

    /// Takes every permit back from its holder (their guards see the loss when they next renew
    /// or release) and grants the freed permits to the queue. The fencing counter is kept.
    /// True if a permit was held.
    pub async fn force_release(&self) -> Result<bool> {
        let removed = self.acquirer.driver.release_all().await?;
        tracing::info!(semaphore = self.name(), removed, "force release");
        Ok(removed)
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name())
            .field("permits", &self.permits)
            .finish()
    }
}
