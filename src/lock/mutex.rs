//! [`Mutex`]: an exclusive, reentrant, barging lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::client::LockClient;
use crate::engine::{Attempt, BoxFuture, Driver, Released};
use crate::error::{NotHeldReason, Result};
use crate::keys::LockKeys;
use crate::lease::{clamp_ttl, Lease};
use crate::lock::guard::LockGuard;
use crate::lock::Acquirer;
use crate::notify::WaitKind;
use crate::owner::Owner;
use crate::scripts::{int_array, Script, SCRIPTS};

/// An exclusive, reentrant distributed lock (Redisson's `RLock`).
///
/// **Ordering.** Barging: whoever asks first after a release gets the lock, queued or not.
/// Within one process, local waiters are woken in arrival order, one per release. Use
/// [`FairMutex`](crate::LockClient) (when available) for strict FIFO across processes.
///
/// **Re-entry.** A handle without an owner takes every hold under a fresh [`Owner`], so two
/// tasks sharing a handle exclude each other. A handle bound with [`Mutex::with_owner`]
/// re-enters: each acquisition adds one to the hold count and each guard released takes one
/// away; the lock is free when the count reaches zero. The fencing token stays the same across
/// re-entry.
///
/// **Cancellation.** Dropping a pending [`lock`](Self::lock) future leaves nothing behind: no
/// local waiter, and a hold that its in-flight script took is released at once.
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
pub struct Mutex {
    inner: Acquirer<MutexDriver>,
}

/// The state of a lock as seen by [`Mutex::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockState {
    /// Whether anyone holds the lock.
    pub locked: bool,
    /// Hold count of the holder (re-entry depth), 0 when free.
    pub hold_count: u64,
    /// Fencing token of the current hold, if held.
    pub fencing_token: Option<u64>,
    /// Remaining lease of the current hold, if held.
    pub remaining: Option<Duration>,
}

impl Mutex {
    pub(crate) fn new(client: LockClient, name: &str) -> Result<Mutex> {
        let keys = client.keyspace().lock("mutex", name)?;
        Ok(Mutex {
            inner: Acquirer::new(MutexDriver {
                hold: keys.key(""),
                fence: keys.key("fence"),
                waiters: keys.key("wait"),
                keys,
                client,
            }),
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.driver.keys.name()
    }

    /// A handle whose acquisitions are taken under `owner`, so they re-enter each other.
    pub fn with_owner(self, owner: &Owner) -> Mutex {
        Mutex {
            inner: self.inner.with_owner(owner),
        }
    }

    /// A handle whose acquisitions use `lease`. Fails with
    /// [`Error::InvalidDuration`](crate::Error::InvalidDuration) for zero or out-of-range leases.
    pub fn with_lease(self, lease: Lease) -> Result<Mutex> {
        Ok(Mutex {
            inner: self.inner.with_lease(lease)?,
        })
    }

    /// The owner this handle is bound to, if any.
    pub fn owner(&self) -> Option<&Owner> {
        self.inner.owner()
    }

    /// Waits until the lock is acquired.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.inner.wait_forever().await
    }

    /// One attempt: `Ok(None)` when another owner holds the lock.
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.inner.wait_for(Duration::ZERO).await
    }

    /// Waits at most `timeout`: `Ok(None)` when it passed without the lock.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.inner.wait_for(timeout).await
    }

    /// Whether anyone holds the lock now.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.locked)
    }

    /// A consistent snapshot of the lock (one script call).
    pub async fn state(&self) -> Result<LockState> {
        self.inner.driver.state().await
    }

    /// Frees the lock whoever holds it and wakes a waiter. The fencing counter is not reset.
    /// Returns whether a hold was removed. The evicted holder's guard learns it through
    /// [`LockGuard::lost`] at its next renewal.
    pub async fn force_unlock(&self) -> Result<bool> {
        self.inner.driver.force_unlock().await
    }
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name())
            .field("owner", &self.owner())
            .finish()
    }
}

/// Keys and scripts of one mutex.
pub(crate) struct MutexDriver {
    client: LockClient,
    keys: LockKeys,
    hold: String,
    fence: String,
    waiters: String,
}

impl MutexDriver {
    async fn run(&self, script: &Script, keys: Vec<String>, args: Vec<Value>) -> Result<Vec<i64>> {
        let reply = self
            .client
            .core()
            .run(script, self.keys.name(), keys, args)
            .await?;
        int_array(script.name(), reply)
    }

    fn event_keys(&self) -> Vec<String> {
        vec![
            self.hold.clone(),
            self.waiters.clone(),
            self.keys.events().to_owned(),
            self.keys.seq().to_owned(),
        ]
    }

    async fn state(&self) -> Result<LockState> {
        let script = &SCRIPTS.hold_inspect;
        let reply = self.run(script, vec![self.hold.clone()], vec![]).await?;
        let [locked, count, token, ttl] = reply[..] else {
            return Err(crate::Error::Protocol {
                script: script.name(),
                detail: format!("expected 4 integers, got {reply:?}"),
            });
        };
        let locked = locked == 1;
        Ok(LockState {
            locked,
            hold_count: count.max(0) as u64,
            fencing_token: locked.then_some(token.max(0) as u64),
            remaining: (locked && ttl > 0).then(|| Duration::from_millis(ttl as u64)),
        })
    }

    async fn force_unlock(&self) -> Result<bool> {
        let script = &SCRIPTS.mutex_force_unlock;
        let core = self.client.core();
        let reply = self
            .run(script, self.event_keys(), core.event_args(&self.keys))
            .await?;
        let removed = reply.first() == Some(&1);
        tracing::info!(lock = self.keys.name(), removed, "force unlock");
        Ok(removed)
    }
}

impl Driver for MutexDriver {
    fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn client(&self) -> &LockClient {
        &self.client
    }

    fn wait_kind(&self) -> WaitKind {
        WaitKind::Exclusive
    }

    fn try_acquire(
        self: Arc<Self>,
        owner: Owner,
        op: String,
        lease: Duration,
        waiting: bool,
    ) -> BoxFuture<'static, Result<Attempt>> {
        Box::pin(async move {
            let grace = if waiting {
                self.client.config().waiter_grace.as_millis() as i64
            } else {
                0
            };
            let script = &SCRIPTS.mutex_acquire;
            let reply = self
                .run(
                    script,
                    vec![self.hold.clone(), self.fence.clone(), self.waiters.clone()],
                    vec![
                        owner.id().into(),
                        (lease.as_millis() as i64).into(),
                        op.into(),
                        grace.into(),
                    ],
                )
                .await?;
            match reply[..] {
                [1, token, ..] => Ok(Attempt::Acquired {
                    token: token.max(0) as u64,
                }),
                [0, ttl] => Ok(Attempt::Busy {
                    ttl: Some(clamp_ttl(ttl, self.client.config().watchdog_lease)),
                }),
                _ => Err(crate::Error::Protocol {
                    script: script.name(),
                    detail: format!("unexpected reply {reply:?}"),
                }),
            }
        })
    }

    fn release<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        op: &'a str,
        all: bool,
    ) -> BoxFuture<'a, Result<Released>> {
        Box::pin(async move {
            let core = self.client.core();
            let mut args: Vec<Value> = vec![
                owner.id().into(),
                token.to_string().into(),
                op.into(),
                if all { "1" } else { "0" }.into(),
                (core.tombstone_ttl().as_millis() as i64).into(),
            ];
            args.extend(core.event_args(&self.keys));
            let script = &SCRIPTS.mutex_release;
            let reply = self.run(script, self.event_keys(), args).await?;
            match reply[..] {
                [1, remaining] => Ok(Released::Yes {
                    remaining: remaining.max(0) as u64,
                }),
                [0, _] => Ok(Released::NotHeld(NotHeldReason::Expired)),
                [-1, _] => Ok(Released::NotHeld(NotHeldReason::HeldByOther)),
                _ => Err(crate::Error::Protocol {
                    script: script.name(),
                    detail: format!("unexpected reply {reply:?}"),
                }),
            }
        })
    }

    fn renew_script(&self) -> &'static Script {
        &SCRIPTS.hold_renew
    }

    fn renew_key(&self) -> String {
        self.hold.clone()
    }
}
