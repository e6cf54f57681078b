//! [`CountDownLatch`]: a count set once, counted down by anyone, and waited for until it
//! reaches zero.
//!
//! Why it needs no driver: a latch has no holder, no lease and no queue order, so it shares
//! none of the engine's acquisition machinery. What it shares is the wake-up path: a waiting
//! task registers in the client's waiter table under the latch's id before it looks, its
//! client's inbox tag joins the latch's set of waiting clients in the same script, and the
//! script that opens the latch sends one event into each of those inboxes (`lua/lib/latch.lua`),
//! which wakes every waiting task of that client. So opening costs one event per waiting
//! process, and no waiter polls: the bound on each wait is a safety net, not a poll.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::engine::{Engine, Patience, TransientRetry};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::{flag_reply, run_call, unexpected};
use crate::owner::op_id;
use crate::scripts::{int_array, Key, Script, ScriptArgs, ScriptKeys, SCRIPTS};

/// A distributed count-down latch (Redisson's `RCountDownLatch`), made by
/// [`LockClient::count_down_latch`](crate::LockClient::count_down_latch).
///
/// **Semantics.** [`try_set_count`](Self::try_set_count) gives a latch that is open (it has
/// no count) a count; each [`count_down`](Self::count_down) takes one off, from any process;
/// the one that reaches zero opens the latch, and every task that [`wait`](Self::wait)s for it
/// returns. A latch that was never set is open. An open latch can be set again. The count
/// lives in Redis without a ttl, until the latch opens or is [`delete`](Self::delete)d
/// (which opens it too).
///
/// **Wake-ups.** The opening script sends one event into the inbox of each client that has a
/// task waiting, and each client wakes all of its tasks waiting on the latch: no polling. Each
/// wait also looks again after [`Config::watchdog_lease`](crate::Config::watchdog_lease) (30 s
/// by default) without an event, as a safety net.
///
/// **Failures.** A waiting call retries a look that failed transiently (a timeout, a lost
/// connection, a failover) for [`Config::transient_retry`](crate::Config::transient_retry), as
/// a lock's acquisition does (not past its deadline). A count-down is not retried: it is not
/// idempotent, so one whose reply was lost (an error) may or may not have been applied
/// ([`count`](Self::count) tells, as long as nobody else counts down meanwhile).
///
/// **Setting it again.** A latch set again right after it opened (a new round) may hold back
/// a task that was woken by the opening but had not looked again yet: it sees the new count
/// and waits for that round, as in Redisson. Use a new name per round when every waiter must
/// see every opening.
///
/// **Cancellation.** Dropping a pending [`wait`](Self::wait) leaves nothing behind but its
/// client's inbox tag in the latch's set of waiting clients, which the opening drops.
///
/// ```no_run
/// # async fn run(locks: fredlock::LockClient) -> fredlock::Result<()> {
/// let ready = locks.count_down_latch("workers-ready")?;
/// ready.try_set_count(3).await?;
/// // ... in each of three workers, once it is ready:
/// ready.count_down().await?;
/// // ... anywhere, to wait for all three:
/// ready.wait().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CountDownLatch {
    engine: Arc<Engine>,
    keys: LockKeys,
}

impl CountDownLatch {
    pub(crate) fn new(engine: Arc<Engine>, name: &str) -> Result<CountDownLatch> {
        let keys = engine.ctx.keyspace.lock("latch", name)?;
        Ok(CountDownLatch { engine, keys })
    }

    /// The largest count, 2^53 − 1 (the scripts count in Lua numbers, exact up to it).
    pub const MAX_COUNT: u64 = (1 << 53) - 1;

    /// The latch's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// Gives the latch `count` if it is open (it has no count): `true` when this call set it,
    /// `false` when it has a count already (left as it is). A `count` of 0 or above
    /// [`CountDownLatch::MAX_COUNT`] is refused with [`Error::InvalidCount`] before any Redis
    /// call. A call whose reply a broken connection lost is sent again after the reconnect,
    /// and answers what its first delivery did.
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        if count == 0 || count > Self::MAX_COUNT {
            return Err(Error::InvalidCount(count));
        }
        let script = &SCRIPTS.latch_set;
        let args = self.changing().extra([count.to_string().into()]);
        let reply = self.call(script, Key::Ops, args).await?;
        let set = flag_reply(script, &reply)?;
        tracing::debug!(latch = self.name(), count, set, "latch count set");
        Ok(set)
    }

    /// Counts the latch down by one and returns what is left: 0 when this call opened it (and
    /// woke every waiting task), or when it was open already: never set, opened, or deleted
    /// (then nothing changes, as in Redisson; count down only once the count is set).
    pub async fn count_down(&self) -> Result<u64> {
        let script = &SCRIPTS.latch_count_down;
        let ctx = &self.engine.ctx;
        let args = ScriptArgs::no_call().events(ctx.event_args(&self.keys));
        let keys = ScriptKeys::new(&self.keys).through(Key::Events);
        // Sent at most once: fred would re-send it after a broken connection, and a second
        // delivery would count down twice.
        let reply = ctx
            .run_once(script, self.name(), keys, args.into_vec())
            .await?;
        let left = match int_array(script.name(), reply)?[..] {
            [left] if left >= 0 => left as u64,
            ref reply => return Err(unexpected(script, reply)),
        };
        tracing::debug!(latch = self.name(), left, "latch counted down");
        Ok(left)
    }

    /// The count left: 0 when the latch is open.
    pub async fn count(&self) -> Result<u64> {
        let script = &SCRIPTS.latch_wait;
        // A look without an inbox tag only reads.
        let args = ScriptArgs::own([Value::from("")]);
        self.count_reply(script, Key::Queue, args).await
    }

    /// Deletes the latch whatever its count, which opens it: every waiting task returns.
    /// `true` when it had a count (also when a broken connection lost the reply and the call
    /// was sent again, as for [`try_set_count`](Self::try_set_count)).
    pub async fn delete(&self) -> Result<bool> {
        let script = &SCRIPTS.latch_delete;
        let args = self
            .changing()
            .events(self.engine.ctx.event_args(&self.keys));
        let reply = self.call(script, Key::Ops, args).await?;
        let deleted = flag_reply(script, &reply)?;
        tracing::debug!(latch = self.name(), deleted, "latch deleted");
        Ok(deleted)
    }

    /// Waits until the latch is open.
    pub async fn wait(&self) -> Result<()> {
        self.wait_with(Patience::Forever).await.map(|_| ())
    }

    /// Waits at most `timeout` for the latch to open: `true` when it is open.
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<bool> {
        self.wait_with(Patience::within(timeout)?).await
    }

    /// Registers, then looks (the order that loses no wake-up: an opening after the look finds
    /// the registration), then waits for a wake-up, the safety-net bound or the deadline.
    async fn wait_with(&self, patience: Patience) -> Result<bool> {
        let ctx = &self.engine.ctx;
        ctx.check_open()?;
        if patience.is_over() {
            // No wait: a look that only reads.
            return Ok(self.count().await? == 0);
        }
        let registration = self.engine.waiters.register(self.keys.id(), None, None);
        loop {
            if self.look(patience).await? == 0 {
                tracing::debug!(latch = self.name(), "latch open");
                return Ok(true);
            }
            let Some(limit) = patience.wait_limit(ctx.config.watchdog_lease) else {
                return Ok(false);
            };
            tracing::trace!(
                latch = self.name(),
                wait_ms = limit.as_millis() as u64,
                "waiting"
            );
            let woken = registration.wait(limit).await;
            tracing::trace!(latch = self.name(), woken, "re-checking");
            ctx.check_open()?;
        }
    }

    /// One look on behalf of a waiting task (`latch_wait`): the count, with this client
    /// registered to hear of the opening. A transient failure is retried as an acquisition's
    /// attempt is (the look is idempotent).
    async fn look(&self, patience: Patience) -> Result<u64> {
        let ctx = &self.engine.ctx;
        let mut retry = TransientRetry::default();
        loop {
            let args = ScriptArgs::own([ctx.inbox_tag.as_ref().into()]);
            match self
                .count_reply(&SCRIPTS.latch_wait, Key::Queue, args)
                .await
            {
                Err(error) => {
                    let window = ctx.config.transient_retry;
                    let Some(pause) = retry.pause_after(&error, window, patience) else {
                        return Err(error);
                    };
                    tracing::debug!(latch = self.name(), %error, "latch look failed; retrying");
                    tokio::time::sleep(pause).await;
                    ctx.check_open()?;
                }
                outcome => return outcome,
            }
        }
    }

    /// The call section of a `try_set_count` or `delete`: a fresh op id and the window for
    /// which the latch remembers it once the call changed the latch (`lua/lib/latch.lua`), so
    /// that fred's re-sending of a call whose reply was lost is answered as the call was.
    fn changing(&self) -> ScriptArgs {
        let window_ms = self.engine.ctx.tombstone_ttl().as_millis() as i64;
        ScriptArgs::no_call().op(&op_id()).window(window_ms)
    }

    async fn call(&self, script: &Script, last: Key, args: ScriptArgs) -> Result<Vec<i64>> {
        let keys = ScriptKeys::new(&self.keys).through(last);
        run_call(&self.engine.ctx, &self.keys, script, keys, args).await
    }

    /// Runs a script whose reply is `{count}`.
    async fn count_reply(&self, script: &Script, last: Key, args: ScriptArgs) -> Result<u64> {
        match self.call(script, last, args).await?[..] {
            [count] if count >= 0 => Ok(count as u64),
            ref reply => Err(unexpected(script, reply)),
        }
    }
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountDownLatch")
            .field("latch", &self.keys.id())
            .finish()
    }
}
