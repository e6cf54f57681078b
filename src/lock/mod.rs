//! Lock types: each is a thin [`Driver`] (its keys, scripts and wake rule) plus a public handle;
//! waiting, renewal and release are shared (see [`crate::engine`] and [`crate::lease`]). Beside
//! them, two synchronizers without a driver of their own: `MultiLock` over the lock handles,
//! and `CountDownLatch` on the engine's waiter table.
//!
//! This module also holds what the drivers share: the handle core ([`Acquirer`]) and the
//! decoding of the replies that all hold-based scripts give. The lock types sit below the
//! client, which makes them (`crate::LockClient`), and above the engine: a handle, its driver
//! and its guards reach the client's state through its [`Engine`], never through the client.

pub(crate) mod guard;
pub(crate) mod inspect;
pub(crate) mod latch;
pub(crate) mod multi;
pub(crate) mod mutex;
pub(crate) mod redlock;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::config::MAX_DURATION;
use crate::context::{BoxFuture, Context};
use crate::engine::{acquire, Attempt, Driver, DriverHold, Engine, Patience, Released, Successor};
use crate::error::{Error, NotHeldReason, Result};
use crate::keys::LockKeys;
use crate::lease::{clamp_ttl, Lease};
use crate::lock::guard::LockGuard;
use crate::notify::Bid;
use crate::owner::Owner;
use crate::scripts::{int_array, Key, Script, ScriptArgs, ScriptKeys, SCRIPTS};

/// What every lock handle carries: the driver (of type `D`), an optional fixed owner and an
/// optional lease.
pub(crate) struct Acquirer<D> {
    pub(crate) driver: Arc<D>,
    owner: Option<Owner>,
    lease: Option<Lease>,
}

impl<D> Clone for Acquirer<D> {
    fn clone(&self) -> Self {
        Acquirer {
            driver: self.driver.clone(),
            owner: self.owner.clone(),
            lease: self.lease,
        }
    }
}

impl<D: Driver> Acquirer<D> {
    pub(crate) fn new(driver: Arc<D>) -> Self {
        Acquirer {
            driver,
            owner: None,
            lease: None,
        }
    }

    pub(crate) fn with_owner(mut self, owner: &Owner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    pub(crate) fn with_lease(mut self, lease: Lease) -> Result<Self> {
        lease.validate()?;
        self.lease = Some(lease);
        Ok(self)
    }

    pub(crate) fn owner(&self) -> Option<&Owner> {
        self.owner.as_ref()
    }

    fn lease(&self) -> Lease {
        self.lease
            .unwrap_or_else(|| Lease::watchdog(self.driver.engine().ctx.config.watchdog_lease))
    }

    /// The engine's future itself, not wrapped in another `async fn`: an async layer that
    /// takes the arguments by value keeps its own copy of them for as long as the acquisition
    /// waits, and a pending acquisition's size is a waiting task's main memory cost. Its hold
    /// becomes a guard in the caller's own `async fn`, at once.
    fn acquire(
        &self,
        patience: Patience,
    ) -> impl Future<Output = Result<Option<Arc<DriverHold>>>> + Send + 'static {
        let owner = self.owner.clone().unwrap_or_else(Owner::anonymous);
        acquire(self.driver.clone(), owner, self.lease(), patience)
    }

    /// The guard of a hold the engine adopted for this handle.
    fn guard(&self, hold: Arc<DriverHold>) -> LockGuard {
        LockGuard::new(hold, self.driver.engine().clone())
    }

    pub(crate) async fn wait_forever(&self) -> Result<LockGuard> {
        let hold = self.acquire(Patience::Forever).await?;
        hold.map(|hold| self.guard(hold)).ok_or(Error::Shutdown)
    }

    /// `Duration::ZERO` means one attempt without waiting.
    pub(crate) async fn wait_for(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        let patience = Patience::within(timeout)?;
        let hold = self.acquire(patience).await?;
        Ok(hold.map(|hold| self.guard(hold)))
    }
}

/// Runs a script of the lock `lock` with its KEYS and ARGV, and decodes its integer-array
/// reply.
pub(crate) async fn run_call(
    ctx: &Context,
    lock: &LockKeys,
    script: &Script,
    script_keys: Vec<String>,
    args: ScriptArgs,
) -> Result<Vec<i64>> {
    run_ints(ctx, script, lock.name(), script_keys, args.into_vec()).await
}

/// Runs a script for a lock and decodes its integer-array reply.
pub(crate) async fn run_ints(
    ctx: &Context,
    script: &Script,
    lock: &str,
    keys: Vec<String>,
    args: Vec<Value>,
) -> Result<Vec<i64>> {
    let reply = ctx.run(script, lock, keys, args).await?;
    int_array(script.name(), reply)
}

/// The error for a script reply that is not one of the script's documented replies.
pub(crate) fn unexpected(script: &Script, reply: &[i64]) -> Error {
    Error::Protocol {
        script: script.name(),
        detail: format!("unexpected reply {reply:?}"),
    }
}

/// Decodes `{1, token, count}` / `{0, ttl}` (every acquire script), and the exclusive locks'
/// `{1, token, count, remaining ms}` (a hold granted or handed to the caller already) and
/// `{0, ttl, holder's token}`.
pub(crate) fn acquire_reply(ctx: &Context, script: &Script, reply: &[i64]) -> Result<Attempt> {
    match *reply {
        [1, token, _count] => Ok(Attempt::Acquired {
            token: token.max(0) as u64,
            lasts: None,
        }),
        [1, token, _count, remaining] => Ok(Attempt::Acquired {
            token: token.max(0) as u64,
            lasts: Some(clamp_ttl(remaining, Duration::from_millis(1))),
        }),
        [0, ttl] => Ok(Attempt::Busy {
            ttl: Some(clamp_ttl(ttl, ctx.config.watchdog_lease)),
            token: None,
        }),
        [0, ttl, token] => Ok(Attempt::Busy {
            ttl: Some(clamp_ttl(ttl, ctx.config.watchdog_lease)),
            token: Some(token.max(0) as u64),
        }),
        _ => Err(unexpected(script, reply)),
    }
}

/// Decodes `{1, left}` / `{0, 0}` / `{-1, 0}` (every release script, see `lua/lib/hold.lua`),
/// and the barging mutex's `{1, 0, token, queued}` and `{1, 0, token, queued, quiet ms}`
/// (handed to a task of this process) and `{2, ttl, token}` (the successor queued behind a
/// grant).
pub(crate) fn release_reply(script: &Script, reply: &[i64]) -> Result<Released> {
    match *reply {
        [1, remaining] => Ok(Released::Yes {
            remaining: remaining.max(0) as u64,
            successor: Successor::Passed,
        }),
        [1, _, token, queued] => Ok(Released::Yes {
            remaining: 0,
            successor: Successor::HandedOver {
                token: token.max(0) as u64,
                queued: u32::try_from(queued.max(0)).unwrap_or(u32::MAX),
                quiet: None,
            },
        }),
        [1, _, token, queued, quiet] => Ok(Released::Yes {
            remaining: 0,
            successor: Successor::HandedOver {
                token: token.max(0) as u64,
                queued: u32::try_from(queued.max(0)).unwrap_or(u32::MAX),
                quiet: Some(clamp_ttl(quiet, MAX_DURATION)),
            },
        }),
        [2, ttl, token] => Ok(Released::Yes {
            remaining: 0,
            successor: Successor::Queued {
                ttl: clamp_ttl(ttl, MAX_DURATION),
                token: token.max(0) as u64,
            },
        }),
        [0, _] => Ok(Released::NotHeld(NotHeldReason::Expired)),
        [-1, _] => Ok(Released::NotHeld(NotHeldReason::HeldByOther)),
        _ => Err(unexpected(script, reply)),
    }
}

/// The call section of every release script (`ARGV[1..=5]`): owner, token, op id, all flag,
/// retry window (the tombstone ttl).
pub(crate) fn release_call(
    ctx: &Context,
    owner: &Owner,
    token: u64,
    op: &str,
    all: bool,
) -> ScriptArgs {
    let window = ctx.tombstone_ttl().as_millis() as i64;
    ScriptArgs::release(owner.id(), token, op, all, window)
}

/// How many arguments [`successor_args`] gives for a successor.
const SUCCESSOR_ARGS: usize = 6;

/// The successor arguments of a release script (`lua/hold_release.lua` `ARGV[9..14]`,
/// `lua/rw_release.lua` `ARGV[10..15]`): the successor's owner, waiter id and lease, the
/// hand-over limit (ms), the client's inbox tag, and, for a successor that joins the queue
/// when the queue's turn comes (a waiting take-over), the client's waiter lease; then `floor`,
/// the last token handed out within the process (`ARGV[15]` / `ARGV[16]`), if any. Without
/// either there are none: the scripts read missing ones as empty, and every argument costs
/// its encoding here and its parsing in Redis on the hot path of a plain release.
pub(crate) fn successor_args(
    ctx: &Context,
    successor: Option<(&str, &Bid)>,
    limit_ms: i64,
    floor: Option<u64>,
) -> Vec<Value> {
    let mut args = match successor {
        None => Vec::new(),
        Some((waiter, bid)) => {
            let joins = if bid.joins_queue {
                (ctx.config.waiter_lease.as_millis() as i64).into()
            } else {
                // A try never queues: it is handed the lock or answered busy.
                "".into()
            };
            vec![
                bid.owner.id().into(),
                waiter.into(),
                (bid.lease.as_millis() as i64).into(),
                limit_ms.into(),
                ctx.inbox_tag.as_ref().into(),
                joins,
            ]
        }
    };
    if let Some(floor) = floor {
        // After the six successor positions (empty without a successor).
        args.resize(SUCCESSOR_ARGS, "".into());
        args.push(floor.to_string().into());
    }
    args
}

/// Runs a release script and decodes its reply.
pub(crate) async fn release_with(
    ctx: &Context,
    keys: &LockKeys,
    script: &Script,
    script_keys: Vec<String>,
    args: ScriptArgs,
) -> Result<Released> {
    let reply = run_call(ctx, keys, script, script_keys, args).await?;
    release_reply(script, &reply)
}

/// Runs a force-unlock script with its arguments.
pub(crate) async fn force_unlock_with(
    ctx: &Context,
    keys: &LockKeys,
    script: &Script,
    script_keys: Vec<String>,
    args: ScriptArgs,
) -> Result<bool> {
    let reply = run_call(ctx, keys, script, script_keys, args).await?;
    flag_reply(script, &reply)
}

/// Leaves the Redis wait queue of a lock (`script`: `lua/hold_leave.lua` or
/// `lua/rw_leave.lua`): the waiter's line goes, and a hold a release granted it meanwhile is
/// released, which may grant the lock to the next in line.
pub(crate) fn leave_queue(
    engine: Arc<Engine>,
    keys: LockKeys,
    script: &'static Script,
    waiter: Arc<str>,
) -> BoxFuture<'static, Result<()>> {
    Box::pin(async move {
        let window_ms = engine.ctx.tombstone_ttl().as_millis() as i64;
        let args = ScriptArgs::leave(&waiter)
            .window(window_ms)
            .events(engine.ctx.event_args(&keys));
        let script_keys = ScriptKeys::new(&keys).for_script(script);
        let reply = run_call(&engine.ctx, &keys, script, script_keys, args).await?;
        let left = flag_reply(script, &reply)?;
        tracing::debug!(lock = keys.name(), left, "left the wait queue");
        Ok(())
    })
}

/// Decodes `{1}` / `{0}` (force unlock scripts).
pub(crate) fn flag_reply(script: &Script, reply: &[i64]) -> Result<bool> {
    match *reply {
        [flag] => Ok(flag == 1),
        _ => Err(unexpected(script, reply)),
    }
}

/// The state of a lock as seen by [`Mutex::state`](crate::Mutex::state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

/// Reads a hold hash atomically (`lua/hold_inspect.lua`).
pub(crate) async fn inspect(driver: &dyn Driver) -> Result<LockState> {
    let script = &SCRIPTS.hold_inspect;
    let reply = run_ints(
        &driver.engine().ctx,
        script,
        driver.keys().name(),
        ScriptKeys::new(driver.keys()).through(Key::Hold),
        vec![],
    )
    .await?;
    let [locked, count, token, ttl] = reply[..] else {
        return Err(unexpected(script, &reply));
    };
    let locked = locked == 1;
    Ok(LockState {
        locked,
        hold_count: count.max(0) as u64,
        fencing_token: locked.then_some(token.max(0) as u64),
        remaining: (locked && ttl > 0).then(|| Duration::from_millis(ttl as u64)),
    })
}
