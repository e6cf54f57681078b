//! [`MultiLock`]: several locks taken all or nothing, under one guard.
//!
//! Why one order: two tasks that each hold a lock the other one waits for wait forever. A
//! multi-lock takes its members one at a time in one total order that every process computes
//! the same way (the members' keys in Redis), so a task that holds members only ever waits for
//! members later in that order, and among the tasks that wait there is always one whose next
//! member is free or held by a task that waits for nobody. The members keep their own rules (a
//! barging [`Mutex`], a FIFO [`FairMutex`], either side of an [`RwLock`], each with its handle's
//! owner and lease); the multi-lock adds no script and no state in Redis.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Patience;
use crate::error::{Error, Result};
use crate::lease::LostCause;
use crate::lock::guard::LockGuard;
use crate::lock::mutex::{FairMutex, Mutex};
use crate::lock::rwlock::RwLock;

/// One member of a [`MultiLock`]: a lock handle and the hold to take on it. Made from a
/// [`Mutex`] or a [`FairMutex`] (`From`), or from either side of an [`RwLock`]
/// ([`MultiMember::read`], [`MultiMember::write`]). The handle's owner and lease apply to the
/// member's hold.
#[derive(Clone, Debug)]
pub struct MultiMember {
    lock: Member,
    /// The lock's key in Redis: the global order of the members.
    key: String,
}

#[derive(Clone, Debug)]
enum Member {
    /// A [`Mutex`], or a [`FairMutex`] behind the general handle (it stays FIFO).
    Exclusive(Mutex),
    Read(RwLock),
    Write(RwLock),
}

impl MultiMember {
    /// A read hold on `lock`.
    pub fn read(lock: RwLock) -> MultiMember {
        let key = lock.hold_key();
        MultiMember {
            lock: Member::Read(lock),
            key,
        }
    }

    /// A write hold on `lock`.
    pub fn write(lock: RwLock) -> MultiMember {
        let key = lock.hold_key();
        MultiMember {
            lock: Member::Write(lock),
            key,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        match &self.lock {
            Member::Exclusive(lock) => lock.name(),
            Member::Read(lock) | Member::Write(lock) => lock.name(),
        }
    }

    /// Takes the member's hold: waits forever (`None`), at most `timeout`, or only tries
    /// (`Some(Duration::ZERO)`).
    async fn take(&self, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        Ok(match (&self.lock, timeout) {
            (Member::Exclusive(lock), None) => Some(lock.lock().await?.into()),
            (Member::Exclusive(lock), Some(timeout)) => {
                lock.lock_timeout(timeout).await?.map(Into::into)
            }
            (Member::Read(lock), None) => Some(lock.read().await?.into()),
            (Member::Read(lock), Some(timeout)) => {
                lock.read_timeout(timeout).await?.map(Into::into)
            }
            (Member::Write(lock), None) => Some(lock.write().await?.into()),
            (Member::Write(lock), Some(timeout)) => {
                lock.write_timeout(timeout).await?.map(Into::into)
            }
        })
    }
}

impl From<Mutex> for MultiMember {
    fn from(lock: Mutex) -> MultiMember {
        let key = lock.hold_key();
        MultiMember {
            lock: Member::Exclusive(lock),
            key,
        }
    }
}

impl From<FairMutex> for MultiMember {
    fn from(lock: FairMutex) -> MultiMember {
        MultiMember::from(Mutex::from(lock))
    }
}

/// Several locks taken all or nothing, under one guard (Redisson's `RedissonMultiLock`), made
/// by [`MultiLock::new`] from [`Mutex`], [`FairMutex`] and [`RwLock`] handles, of one
/// [`LockClient`](crate::LockClient) or of several.
///
/// **Ordering.** The members are taken one at a time, in the order of their keys in Redis,
/// whatever the order they were given in: every process orders the same locks the same way,
/// so multi-locks that share members never deadlock on each other (nor on a plain lock of one
/// member). Each member waits by its own rules: FIFO for a [`FairMutex`], barging for a
/// [`Mutex`], writer-first for an [`RwLock`]. While a later member is awaited the earlier ones
/// stay held, renewed by the watchdog (a fixed lease may run out meanwhile: then the
/// acquisition releases everything and starts over).
///
/// **All or nothing.** When a member cannot be had (a `try_lock` that finds it held, a timeout,
/// an error), the guards of the members already taken are dropped before the call returns,
/// which sends their releases at once (without waiting for their replies), so a failed
/// acquisition leaves nothing held.
///
/// **Cancellation.** Dropping a pending acquisition drops the guards of the members it took,
/// which releases them (see [`LockGuard`]); a member's own pending acquisition leaves no trace.
///
/// **The guard.** [`MultiLockGuard`] gives each member's [`LockGuard`] (fencing token, lost
/// signal, lease) and releases every member at once.
///
/// ```no_run
/// use fredlock::{LockClient, MultiLock, MultiMember};
///
/// # async fn transfer(locks: &LockClient) -> fredlock::Result<()> {
/// let both = MultiLock::new([locks.mutex("account:7")?, locks.mutex("account:3")?])?;
/// let guard = both.lock().await?;
/// for member in guard.guards() {
///     println!("{} token {}", member.name(), member.fencing_token());
/// }
/// guard.unlock().await?;
///
/// let ledger = locks.rwlock("ledger")?;
/// let audit = MultiLock::new([
///     MultiMember::read(ledger),
///     MultiMember::from(locks.fair_mutex("audit-log")?),
/// ])?;
/// drop(audit.lock().await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    /// In lock order (by key), no key twice.
    members: Vec<MultiMember>,
}

impl MultiLock {
    /// A multi-lock over `members`, in any order. Fails with [`Error::InvalidMultiLock`] when
    /// there is none, or when one lock comes twice (an acquisition would wait for its own
    /// hold; both sides of one [`RwLock`] count as one lock). Locks are told apart by their
    /// key: members on different Redis deployments that share a key prefix and a name count
    /// as one lock (give the deployments different prefixes).
    pub fn new<I>(members: I) -> Result<MultiLock>
    where
        I: IntoIterator,
        I::Item: Into<MultiMember>,
    {
        let mut members: Vec<MultiMember> = members.into_iter().map(Into::into).collect();
        if members.is_empty() {
            return Err(Error::InvalidMultiLock(
                "a multi-lock needs at least one lock".to_owned(),
            ));
        }
        members.sort_by(|a, b| a.key.cmp(&b.key));
        if let Some(pair) = members.windows(2).find(|pair| pair[0].key == pair[1].key) {
            return Err(Error::InvalidMultiLock(format!(
                "lock {:?} is a member twice",
                pair[0].name()
            )));
        }
        Ok(MultiLock { members })
    }

    /// The members, in the order in which they are taken.
    pub fn members(&self) -> &[MultiMember] {
        &self.members
    }

    /// Waits until every member is held.
    pub async fn lock(&self) -> Result<MultiLockGuard> {
        // Without a deadline a member is had or fails; `None` cannot come back.
        self.acquire(Patience::Forever)
            .await?
            .ok_or(Error::Shutdown)
    }

    /// Takes every member if each one is free now; `Ok(None)`, with nothing held, otherwise.
    /// No member is waited for.
    pub async fn try_lock(&self) -> Result<Option<MultiLockGuard>> {
        self.acquire(Patience::None).await
    }

    /// Waits at most `timeout` for all the members together: `Ok(None)`, with nothing held,
    /// when it passed first.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<MultiLockGuard>> {
        self.acquire(Patience::within(timeout)?).await
    }

    /// One round over the members in order, repeated while a member's hold ends before the
    /// last member is taken. `None`: a member was not had in time (nothing is held then).
    async fn acquire(&self, patience: Patience) -> Result<Option<MultiLockGuard>> {
        loop {
            let mut guards = Vec::with_capacity(self.members.len());
            for member in &self.members {
                match member.take(patience.left()).await {
                    Ok(Some(guard)) => guards.push(guard),
                    Ok(None) => {
                        give_back(guards);
                        return Ok(None);
                    }
                    Err(error) => {
                        give_back(guards);
                        return Err(error);
                    }
                }
            }
            // A member's hold ended while later ones were awaited: lost, or past its lease
            // (a fixed lease the watchdog has not looked at yet).
            let now = Instant::now();
            let ended =
                |guard: &&LockGuard| guard.lost_cause().is_some() || guard.lease_deadline() <= now;
            let Some(lost) = guards.iter().find(ended) else {
                tracing::debug!(members = guards.len(), "multi-lock acquired");
                return Ok(Some(MultiLockGuard { guards }));
            };
            tracing::debug!(
                lock = lost.name(),
                cause = ?lost.lost_cause(),
                "a multi-lock member's hold ended while later ones were awaited; starting over"
            );
            give_back(guards);
            if patience.is_over() {
                return Ok(None);
            }
        }
    }
}

/// Gives back the members an acquisition took before it gave up: their guards are dropped,
/// which hands each release to the client's release worker at once (see [`LockGuard`]), last
/// taken first. Not awaited: a caller's deadline is not stretched by releases that retry, and
/// a cancelled caller cannot leave a member held.
fn give_back(guards: Vec<LockGuard>) {
    for guard in guards.into_iter().rev() {
        tracing::trace!(lock = guard.name(), "multi-lock member given back");
        drop(guard);
    }
}

/// Releases `guards` last taken first and returns the first error; run in a task of its own
/// by [`MultiLockGuard::unlock`].
async fn release_all(guards: Vec<LockGuard>) -> Result<()> {
    let mut first_error = None;
    for guard in guards.into_iter().rev() {
        let name = guard.name().to_owned();
        if let Err(error) = guard.unlock().await {
            tracing::debug!(lock = name, %error, "a multi-lock member's release failed");
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The holds of every member of a [`MultiLock`], in lock order. Dropping it releases them all
/// without blocking, like dropping their [`LockGuard`]s; [`unlock`](Self::unlock) releases
/// them and reports errors.
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// Each member's guard, in lock order: its name, fencing token, lease and lost signal.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Why a member's hold was lost, for the first member (in lock order) that lost it.
    pub fn lost_cause(&self) -> Option<LostCause> {
        self.guards.iter().find_map(LockGuard::lost_cause)
    }

    /// Resolves with the cause as soon as any member's hold can no longer be guaranteed
    /// (see [`LockGuard::lost`]): the cause of whichever member's signal fires first;
    /// [`guards`](Self::guards) tells which. Does not borrow the guard.
    pub fn lost(&self) -> impl Future<Output = LostCause> + Send + 'static {
        type Lost = Pin<Box<dyn Future<Output = LostCause> + Send>>;
        let mut members: Vec<Lost> = self
            .guards
            .iter()
            .map(|guard| Box::pin(guard.lost()) as Lost)
            .collect();
        poll_fn(move |cx| {
            for member in &mut members {
                if let Poll::Ready(cause) = member.as_mut().poll(cx) {
                    return Poll::Ready(cause);
                }
            }
            Poll::Pending
        })
    }

    /// The earliest of the members' lease deadlines (see [`LockGuard::lease_deadline`]).
    pub fn lease_deadline(&self) -> Instant {
        self.guards
            .iter()
            .map(LockGuard::lease_deadline)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Sets every member's remaining lease to `lease` (see [`LockGuard::extend`]). Every
    /// member is asked, also after a failure; the first error is returned.
    pub async fn extend(&self, lease: Duration) -> Result<()> {
        let mut first_error = None;
        for guard in &self.guards {
            if let Err(error) = guard.extend(lease).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Releases every member, last taken first, and returns the first error (see
    /// [`LockGuard::unlock`]); every member is released also after a failure, and also when
    /// the caller stops waiting for this call.
    pub async fn unlock(self) -> Result<()> {
        // In a task of its own: a caller that stops waiting does not stop the releases.
        match tokio::spawn(release_all(self.guards)).await {
            Ok(outcome) => outcome,
            // The runtime is shutting down: the guards not released yet were dropped with the
            // task, which hands their releases to the release worker.
            Err(_) => Err(Error::Shutdown),
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("guards", &self.guards)
            .finish()
    }
}
