//! [`RwLock`]: many readers or one writer, with writer-starvation prevention.
//!
//! Like Curator's read-write lock, it is two locks over one state with different rules: a
//! [`RwDriver`] in read mode and one in write mode, both on the same keys (see
//! `lua/lib/rw.lua`). Waiters of both kinds share one queue in Redis.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::context::BoxFuture;
use crate::engine::{Attempt, Driver, Engine, HandOver, Released};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lease::{HoldKind, Lease};
use crate::lock::guard::{ReadGuard, WriteGuard};
use crate::lock::{
    acquire_reply, force_unlock_with, leave_queue, release_call, release_with, run_call, run_ints,
    successor_args, unexpected, Acquirer,
};
use crate::notify::{Bid, WakeRule};
use crate::owner::{op_id, Owner};
use crate::queue::RedisQueue;
use crate::scripts::{Key, Script, ScriptArgs, ScriptKeys, SCRIPTS};

/// A distributed read-write lock (Redisson's `RReadWriteLock`, with writer-starvation
/// prevention and eventual fairness).
///
/// **Ordering.** Many readers or one writer. Waiters of both kinds queue in Redis in arrival
/// order. A writer gets the lock when no hold is left and it is first in the queue. A reader
/// gets it when no writer holds it and no live writer is queued: so once a writer waits, new
/// readers queue behind it and the writer cannot starve. A waiting writer whose process died
/// is dropped within [`Config::waiter_lease`](crate::Config::waiter_lease).
///
/// **Barging writers.** As on a [`Mutex`](crate::Mutex), the write side passes the lock from
/// a writer to another writer of the same client (through handles without an
/// [`Owner`]) ahead of the queue, without a round trip while the client's window lasts, until
/// the head of the queue has waited [`Config::handover_limit`](crate::Config::handover_limit)
/// (20 ms by default): from then on a release grants the lock to the queue. That bounds every
/// wait and keeps the cost of a write acquisition under contention at a `Mutex`'s. A zero
/// limit makes the lock strictly fair: every hold goes to the queue in arrival order. Readers
/// never barge.
///
/// **Wakeups.** The release that frees the lock for the head of the queue grants it there: to
/// the writer at the head alone, or to every reader up to the first writer at once (a wave),
/// with one event into the inbox of each client concerned, and each process wakes exactly
/// those of its waiters, holding the lock already, whatever the order of its local queue. The
/// lock's whole state is one hash (`lua/lib/rw.lua`); a task that asks for the write hold right
/// after releasing it takes its deferred release over, as on a
/// [`FairMutex`](crate::FairMutex).
///
/// **Re-entry, downgrade, no upgrade.** Bind the handle to an [`Owner`] to re-enter. A writer
/// may take read holds (downgrade) and keep them after its write unlock. An owner holding a read
/// hold that asks for a write hold gets [`Error::UpgradeNotSupported`] at once (waiting would
/// deadlock on itself).
///
/// **Leases.** Every hold has its own lease: one reader's expiry never extends or cuts
/// another's, and a crashed reader's hold ends alone. The watchdog renews each live hold.
///
/// **Fencing tokens.** Every hold, write or read, gets a new token, strictly greater than every
/// earlier token of the lock: concurrent readers hold different tokens, and a write hold that
/// starts after a read hold has a higher token than it. A downgrade's read hold carries its
/// write hold's token.
///
/// **Cancellation.** As for [`Mutex`](crate::Mutex): a dropped acquisition leaves no trace.
#[derive(Clone)]
pub struct RwLock {
    read: Acquirer<RwDriver>,
    write: Acquirer<RwDriver>,
}

/// The state of a read-write lock as seen by [`RwLock::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockState {
    /// Whether a writer holds the lock.
    pub write_locked: bool,
    /// The writer's hold count (re-entry depth), 0 without writer.
    pub write_hold_count: u64,
    /// Fencing token of the current write hold, if any.
    pub fencing_token: Option<u64>,
    /// Number of owners holding read holds.
    pub readers: u64,
    /// Time until the last live hold ends, if any.
    pub remaining: Option<Duration>,
}

impl RwLock {
    pub(crate) fn new(engine: Arc<Engine>, name: &str) -> Result<RwLock> {
        let keys = engine.ctx.keyspace.lock("rw", name)?;
        let driver = |mode| Arc::new(RwDriver::new(engine.clone(), keys.clone(), mode, None));
        Ok(RwLock {
            read: Acquirer::new(driver(Mode::Read)),
            write: Acquirer::new(driver(Mode::Write)),
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.driver.keys().name()
    }

    /// The lock's key in Redis: the order in which a [`MultiLock`](crate::MultiLock) takes
    /// its members.
    pub(crate) fn hold_key(&self) -> String {
        self.read.driver.keys().key("")
    }

    /// A handle whose holds are taken under `owner` (re-entry, downgrade).
    pub fn with_owner(self, owner: &Owner) -> RwLock {
        RwLock {
            read: self.read.with_owner(owner),
            write: self.write.with_owner(owner),
        }
    }

    /// A handle whose holds use `lease` (see [`Lease`]).
    pub fn with_lease(self, lease: Lease) -> Result<RwLock> {
        Ok(RwLock {
            read: self.read.with_lease(lease)?,
            write: self.write.with_lease(lease)?,
        })
    }

    /// The owner this handle is bound to, if any.
    pub fn owner(&self) -> Option<&Owner> {
        self.read.owner()
    }

    /// Waits for a read hold.
    pub async fn read(&self) -> Result<ReadGuard> {
        self.read.wait_forever().await.map(ReadGuard::new)
    }

    /// Waits for a write hold.
    pub async fn write(&self) -> Result<WriteGuard> {
        self.write.wait_forever().await.map(WriteGuard::new)
    }

    /// One attempt at a read hold: `Ok(None)` when a writer holds or waits ahead.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        Ok(self
            .read
            .wait_for(Duration::ZERO)
            .await?
            .map(ReadGuard::new))
    }

    /// One attempt at a write hold: `Ok(None)` when the lock is held or others queue.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        Ok(self
            .write
            .wait_for(Duration::ZERO)
            .await?
            .map(WriteGuard::new))
    }

    /// Waits at most `timeout` for a read hold.
    pub async fn read_timeout(&self, timeout: Duration) -> Result<Option<ReadGuard>> {
        Ok(self.read.wait_for(timeout).await?.map(ReadGuard::new))
    }

    /// Waits at most `timeout` for a write hold.
    pub async fn write_timeout(&self, timeout: Duration) -> Result<Option<WriteGuard>> {
        Ok(self.write.wait_for(timeout).await?.map(WriteGuard::new))
    }

    /// A consistent snapshot of the lock (one script call).
    pub async fn state(&self) -> Result<RwLockState> {
        let [held, count, token, readers, last] = self.write.driver.inspect().await?;
        Ok(RwLockState {
            write_locked: held == 1,
            write_hold_count: count.max(0) as u64,
            fencing_token: (held == 1).then_some(token.max(0) as u64),
            readers: readers.max(0) as u64,
            remaining: (last > 0).then(|| Duration::from_millis(last as u64)),
        })
    }

    /// Removes every read and write hold and wakes the waiters. The fencing counter is kept.
    pub async fn force_unlock(&self) -> Result<bool> {
        let removed = self.write.driver.force_unlock().await?;
        tracing::info!(lock = self.name(), removed, "force unlock");
        Ok(removed)
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name())
            .field("owner", &self.owner())
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// One side (read or write) of a read-write lock: both run the `rw_*` scripts over the lock's
/// one hash (`lua/lib/rw.lua`). With a permit count, the read side of a
/// [`Semaphore`](crate::Semaphore): at most that many read holds at once.
pub(crate) struct RwDriver {
    engine: Arc<Engine>,
    keys: LockKeys,
    mode: Mode,
    permits: Option<u32>,
}

impl RwDriver {
    pub(crate) fn new(
        engine: Arc<Engine>,
        keys: LockKeys,
        mode: Mode,
        permits: Option<u32>,
    ) -> Self {
        RwDriver {
            keys,
            engine,
            mode,
            permits,
        }
    }

    /// Removes every hold and grants the lock to the queue (the semaphore's force release).
    pub(crate) async fn release_all(&self) -> Result<bool> {
        self.force_unlock().await
    }

    /// A consistent snapshot of the lock (one script call): write held, write hold count,
    /// write token, live read holds, ms until the last hold ends (-2 when free).
    pub(crate) async fn inspect(&self) -> Result<[i64; 5]> {
        let script = &SCRIPTS.rw_inspect;
        let reply = run_ints(
            &self.engine.ctx,
            script,
            self.keys.name(),
            self.script_keys(),
            vec![],
        )
        .await?;
        match reply[..] {
            [held, count, token, readers, last] => Ok([held, count, token, readers, last]),
            _ => Err(unexpected(script, &reply)),
        }
    }

    /// `KEYS[1..=6]` of the `rw_*` scripts that work on one lock.
    fn script_keys(&self) -> Vec<String> {
        ScriptKeys::new(&self.keys).through(Key::Reads)
    }

    fn retry_window_ms(&self) -> i64 {
        self.engine.ctx.tombstone_ttl().as_millis() as i64
    }

    /// Removes every read and write hold and grants the lock to the queue; true if a hold was
    /// removed.
    async fn force_unlock(&self) -> Result<bool> {
        let ctx = &self.engine.ctx;
        let args = ScriptArgs::no_call()
            .window(self.retry_window_ms())
            .events(ctx.event_args(&self.keys));
        let script = &SCRIPTS.rw_force_unlock;
        let removed = force_unlock_with(ctx, &self.keys, script, self.script_keys(), args).await?;
        // Tasks of this client that wait on a hold of this client hear of it from here.
        self.engine.waiters.dispatch(self.keys.id(), &WakeRule::All);
        Ok(removed)
    }

    /// A semaphore's `FLPERMITS <count>` refusal (`lua/rw_acquire.lua`) as
    /// [`Error::PermitsMismatch`]; any other error as it is.
    fn permits_refusal(&self, err: Error) -> Error {
        let stored = match (&err, self.permits) {
            (Error::Redis(source), Some(_)) => source
                .details()
                .split("FLPERMITS ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|count| count.parse().ok()),
            _ => None,
        };
        match (stored, self.permits) {
            (Some(stored), Some(asked)) => Error::PermitsMismatch {
                name: self.keys.name().to_owned(),
                stored,
                asked,
            },
            _ => err,
        }
    }

    /// `lua/rw_release.lua`, naming `successor` (a waiting writer of this client, or a write
    /// side's take-over) and `floor` (the last token of local hand-overs) if any.
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
        // The write side's hand-over bound (`ARGV[13]`): 0, every queued waiter due, for a
        // side that does not hand over (a take-over alone never passes a queued waiter).
        let limit = if self.handover().is_some() {
            ctx.config.handover_limit.as_millis() as i64
        } else {
            0
        };
        let extra = successor_args(ctx, successor, limit, floor);
        let args = release_call(ctx, owner, token, op, all)
            .events(ctx.event_args(&self.keys))
            .kind(self.mode.as_str())
            .extra(extra);
        let script = &SCRIPTS.rw_release;
        release_with(ctx, &self.keys, script, self.script_keys(), args).await
    }
}

impl HoldKind for RwDriver {
    fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn hold_role(&self) -> &'static str {
        self.mode.as_str()
    }

    fn renew_script(&self) -> &'static Script {
        &SCRIPTS.rw_renew
    }

    /// The hash and the read holds' ends (`lua/rw_renew.lua`).
    fn renew_keys(&self) -> Vec<String> {
        ScriptKeys::new(&self.keys).of(&[Key::Hold, Key::Reads])
    }

    fn renew_args(&self, owner: &Owner, token: u64) -> Vec<Value> {
        vec![
            self.mode.as_str().into(),
            owner.id().into(),
            token.to_string().into(),
        ]
    }
}

impl Driver for RwDriver {
    fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// `r` or `w`, the inbox tag of the client, `.`, an op id: the queue tells readers from
    /// writers by the first letter (`lua/lib/rw.lua`).
    fn waiter_id(&self) -> Arc<str> {
        let side = match self.mode {
            Mode::Read => 'r',
            Mode::Write => 'w',
        };
        format!("{side}{}.{}", self.engine.ctx.inbox_tag, op_id()).into()
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
            let (waiter, waiter_lease) = if waiting {
                (waiter.as_ref(), ctx.config.waiter_lease.as_millis() as i64)
            } else {
                ("", 0)
            };
            let args = ScriptArgs::acquire(
                owner.id(),
                lease.as_millis() as i64,
                &op,
                waiter,
                waiter_lease,
            )
            .events(ctx.event_args(&self.keys))
            .kind(self.mode.as_str())
            .extra([
                ctx.inbox_tag.as_ref().into(),
                self.retry_window_ms().into(),
                // A write hold whose release this client may defer wants to hear of its first
                // waiter (`lua/rw_acquire.lua`, `ARGV[12]`).
                if self.defers_releases() { "1" } else { "" }.into(),
                // A semaphore's permit count (`ARGV[13]`).
                self.permits
                    .map_or_else(|| "".into(), |permits| permits.into()),
            ]);
            let script = &SCRIPTS.rw_acquire;
            let reply = run_call(ctx, &self.keys, script, self.script_keys(), args)
                .await
                .map_err(|err| self.permits_refusal(err))?;
            if reply.first() == Some(&-2) {
                return Err(Error::UpgradeNotSupported(self.keys.name().to_owned()));
            }
            acquire_reply(ctx, script, &reply)
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

    /// The write side hands the lock to a writer of this client that waits for it, as the
    /// barging [`Mutex`](crate::Mutex) does: without a call within the window of
    /// [`Config::local_handover`](crate::Config::local_handover), else by the release script,
    /// which passes no queued waiter (eventual fairness, bounded by the window). Off with a
    /// zero [`Config::handover_limit`](crate::Config::handover_limit): every hold then goes
    /// to the queue in arrival order. A semaphore's permits are never handed over.
    fn handover(&self) -> Option<&dyn HandOver> {
        let hands_over = self.mode == Mode::Write
            && self.permits.is_none()
            && !self.engine.ctx.config.handover_limit.is_zero();
        hands_over.then_some(self as &dyn HandOver)
    }

    /// The write side takes deferred releases over: one call grants the lock to the queue (or
    /// hands it over when nobody else waits) and queues the acquisition, where a release and a
    /// busy attempt would take two.
    fn take_over(&self) -> Option<&dyn HandOver> {
        (self.mode == Mode::Write).then_some(self as &dyn HandOver)
    }

    fn redis_queue(self: Arc<Self>) -> Option<Arc<dyn RedisQueue>> {
        Some(self)
    }
}

impl HandOver for RwDriver {
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

impl RedisQueue for RwDriver {
    fn queue_keys(&self) -> ScriptKeys<'_> {
        ScriptKeys::new(&self.keys)
    }

    /// The hash, the queue and the read holds' ends (`lua/rw_heartbeat.lua`).
    fn place_keys(&self) -> Vec<String> {
        ScriptKeys::new(&self.keys).of(&[Key::Hold, Key::Queue, Key::Reads])
    }

    fn vouches_for_waiters(&self) -> bool {
        true
    }

    fn leave(&self, waiter: Arc<str>) -> BoxFuture<'static, Result<()>> {
        let (engine, keys) = (self.engine.clone(), self.keys.clone());
        leave_queue(engine, keys, &SCRIPTS.rw_leave, waiter)
    }
}
