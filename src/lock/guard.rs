//! The guard every lock type returns ([`LockGuard`]), and the typed guards that wrap it.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::release::release_hold;
use crate::engine::{DriverHold, Engine, Released};
use crate::error::{Error, NotHeldReason, Result};
use crate::lease::{check_extension, renew, Lease, LostCause};
use crate::owner::Owner;

/// Proof of one hold on a lock: the guard all lock types share. Each lock type returns it
/// wrapped in its own guard type ([`MutexGuard`], [`FairMutexGuard`], [`ReadGuard`],
/// [`WriteGuard`]), which dereferences to it; `LockGuard::from(typed)` erases the lock type
/// for code that handles guards of several lock types.
///
/// * [`fencing_token`](Self::fencing_token): pass it to the resource you protect and let the
///   resource reject writes with a token lower than one it has seen.
/// * [`lost`](Self::lost): resolves when the hold can no longer be guaranteed; stop touching the
///   resource then.
/// * [`unlock`](Self::unlock): releases and reports errors. Dropping the guard releases too,
///   without blocking: the release is handed to the client's release worker (outside a runtime
///   nothing blocks or panics either; the lease then simply expires).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    hold: Arc<DriverHold>,
    engine: Arc<Engine>,
    armed: bool,
}

impl LockGuard {
    /// The guard of a hold the engine adopted for it (`engine`: its client's).
    pub(crate) fn new(hold: Arc<DriverHold>, engine: Arc<Engine>) -> Self {
        LockGuard {
            hold,
            engine,
            armed: true,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.hold.lock.keys().name()
    }

    /// The fencing token of this hold: strictly greater than the token of every earlier hold
    /// of this lock name, kept across re-entry, never reset (not even by `force_unlock`).
    pub fn fencing_token(&self) -> u64 {
        self.hold.token
    }

    /// The owner this hold belongs to. Bind a lock handle to it to re-enter.
    pub fn owner(&self) -> &Owner {
        &self.hold.owner
    }

    /// The lease policy of the hold.
    pub fn lease(&self) -> Lease {
        self.hold.lease
    }

    /// The latest instant until which the hold is guaranteed by the local clock (measured
    /// from when the last acquire or renewal was sent). The watchdog pushes it forward.
    pub fn lease_deadline(&self) -> Instant {
        self.hold.deadline()
    }

    /// Why the hold was lost, if it was.
    pub fn lost_cause(&self) -> Option<LostCause> {
        self.hold.lost_cause()
    }

    /// Resolves when the hold can no longer be guaranteed, with the cause. Never resolves while
    /// the hold is healthy. The future does not borrow the guard, so it can be raced against the
    /// critical section:
    ///
    /// ```no_run
    /// # async fn f(guard: fredlock::MutexGuard) {
    /// tokio::select! {
    ///     cause = guard.lost() => eprintln!("lost the lock: {cause:?}"),
    ///     _ = do_work() => {}
    /// }
    /// # }
    /// # async fn do_work() {}
    /// ```
    pub fn lost(&self) -> impl Future<Output = LostCause> + Send + 'static {
        self.hold.lost().wait()
    }

    /// Sets the hold's remaining lease to `lease` (owner and token checked), shorter or longer
    /// than what is left: [`lease_deadline`](Self::lease_deadline) and [`lost`](Self::lost)
    /// follow. For fixed leases this is the way to keep a hold longer; for watchdog leases the
    /// next renewal, a third of `lease` later, applies the watchdog lease again.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        check_extension(lease)?;
        let sent_at = Instant::now();
        let codes = renew(&self.engine.ctx, &[&self.hold], lease).await?;
        match codes.first() {
            Some(1) => {
                self.engine.holds.extended(&self.hold, sent_at, lease);
                tracing::debug!(
                    lock = self.name(),
                    lease_ms = lease.as_millis() as u64,
                    "extended"
                );
                Ok(())
            }
            Some(0) => Err(self.not_held(NotHeldReason::Expired)),
            _ => Err(self.not_held(NotHeldReason::HeldByOther)),
        }
    }

    /// Releases this hold (one level of re-entry) and reports the outcome. A hold that expired
    /// or passed to another owner gives [`Error::NotHeld`] and leaves the current holder alone.
    /// Transient failures (timeout, broken connection, failover) are retried with the same op
    /// id until the hold's lease would have ended; if Redis is still unreachable then, the
    /// result is `NotHeld { reason: Expired }` (the hold expires on its own).
    pub async fn unlock(mut self) -> Result<()> {
        self.armed = false;
        self.engine.holds.release_guard(&self.hold);
        let hold = self.hold.clone();
        let outcome = release_hold(&hold).await?;
        tracing::debug!(lock = self.name(), token = hold.token, ?outcome, "released");
        match outcome {
            Released::Yes { .. } => Ok(()),
            Released::NotHeld(reason) => Err(self.not_held(reason)),
        }
    }

    fn not_held(&self, reason: NotHeldReason) -> Error {
        Error::NotHeld {
            lock: self.name().to_owned(),
            reason,
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.engine.holds.release_guard(&self.hold);
        self.engine.release_later(self.hold.clone());
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.hold.lock.keys().id())
            .field("token", &self.hold.token)
            .field("owner", &self.hold.owner)
            .field("lost", &self.lost_cause())
            .finish()
    }
}

/// Defines a guard type of one lock type: a newtype over [`LockGuard`] that dereferences to
/// it, with a consuming `unlock` and conversions to the untyped guard.
macro_rules! typed_guard {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// It dereferences to [`LockGuard`] for everything but the consuming calls:
        /// [`fencing_token`](LockGuard::fencing_token), [`lost`](LockGuard::lost),
        /// [`lost_cause`](LockGuard::lost_cause), [`lease_deadline`](LockGuard::lease_deadline),
        /// [`extend`](LockGuard::extend), [`name`](LockGuard::name). Dropping it releases the
        /// hold like dropping a [`LockGuard`].
        #[must_use = "dropping the guard releases the lock at once"]
        #[derive(Debug)]
        pub struct $name(LockGuard);

        impl $name {
            pub(crate) fn new(guard: LockGuard) -> Self {
                $name(guard)
            }

            /// Releases this hold and reports the outcome (see [`LockGuard::unlock`]).
            pub async fn unlock(self) -> Result<()> {
                self.0.unlock().await
            }

            /// The untyped guard, for code that handles guards of several lock types.
            pub fn into_inner(self) -> LockGuard {
                self.0
            }
        }

        impl Deref for $name {
            type Target = LockGuard;

            fn deref(&self) -> &LockGuard {
                &self.0
            }
        }

        impl From<$name> for LockGuard {
            fn from(guard: $name) -> LockGuard {
                guard.0
            }
        }
    };
}

typed_guard!(
    /// The guard of a [`Mutex`](crate::Mutex) hold.
    MutexGuard
);
typed_guard!(
    /// The guard of a [`FairMutex`](crate::FairMutex) hold.
    FairMutexGuard
);
typed_guard!(
    /// The guard of a read hold on an [`RwLock`](crate::RwLock).
    ReadGuard
);
typed_guard!(
    /// The guard of a write hold on an [`RwLock`](crate::RwLock).
    WriteGuard
);
typed_guard!(
    /// The guard of a permit of a [`Semaphore`](crate::Semaphore).
    PermitGuard
);
