//! The client's heartbeat over its waiters queued in Redis.
//!
//! Instead of one timer per waiter, each client keeps a registry of its queued waiters and ONE
//! heartbeat task that, every third of the waiter lease, checks all of them with one script
//! call per hash slot and lock family. A release passes over waiters whose client is gone, but
//! a grant to a client that died unnoticed lapses after the waiter lease, and a lock's hash,
//! queue included, expires with its last hold: the call finds the waiters whose place is gone.
//!
//! * exclusive locks (`lua/hold_heartbeat.lua`) only read;
//! * the read-write lock (`lua/rw_heartbeat.lua`) also moves on the time until which each of
//!   the client's queued waiters is known alive: a writer that died waiting must not keep new
//!   readers out while readers hold the lock, so the scripts drop a waiter whose time passed.
//!
//! A waiter that the heartbeat finds gone from its queue is woken to try again; its next
//! attempt re-joins the queue at the tail, or takes the lock.
//!
//! A queued waiter's lock is known here only as a [`RedisQueue`] (its script keys, and how to
//! leave its queue), which the lock types' drivers implement: this module sits below the
//! engine and works over the shared [`Context`] and the [`WaiterTable`] alone.

use std::collections::HashMap;
use std::sync::Arc;

use fred::types::Value;
use tokio::sync::watch;

use crate::context::{BoxFuture, Context, Table};
use crate::error::Result;
use crate::notify::{WaiterTable, WakeRule};
use crate::scripts::{int_array, Script, ScriptKeys, SCRIPTS};

/// A lock whose waiting attempts join a queue in Redis, which the waiter must leave when it
/// gives up and which the heartbeat watches meanwhile.
pub(crate) trait RedisQueue: Send + Sync + 'static {
    /// This lock's script keys: its kind and its group in the batched heartbeat.
    fn queue_keys(&self) -> ScriptKeys<'_>;
    /// The keys the heartbeat script reads for this lock (`lua/hold_heartbeat.lua`,
    /// `lua/rw_heartbeat.lua`).
    fn place_keys(&self) -> Vec<String>;
    /// Whether the heartbeat vouches for this lock's waiters (the read-write lock and the
    /// semaphore, `lua/rw_heartbeat.lua`) rather than only checking their places
    /// (`lua/hold_heartbeat.lua`).
    fn vouches_for_waiters(&self) -> bool;
    /// Leaves the Redis-side wait queue after a timeout or cancellation.
    fn leave(&self, waiter: Arc<str>) -> BoxFuture<'static, Result<()>>;
}

/// The queued waiters of one client, by waiter id.
#[derive(Default)]
pub(crate) struct QueuedWaiters {
    waiters: Table<Arc<str>, Arc<dyn RedisQueue>>,
}

impl QueuedWaiters {
    pub(crate) fn join(&self, waiter: Arc<str>, lock: Arc<dyn RedisQueue>) {
        self.waiters.insert(waiter, lock);
    }

    pub(crate) fn leave(&self, waiter: &Arc<str>) {
        self.waiters.remove(waiter);
    }

    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }

    /// Whether `waiter` is queued in Redis (as far as its acquisition knows).
    pub(crate) fn contains(&self, waiter: &str) -> bool {
        self.waiters.contains_key(waiter)
    }
}

/// Most locks per heartbeat call (keeps each script short).
const MAX_LOCKS_PER_CALL: usize = 128;

/// Most heartbeat calls on their way at once. A call's keys and arguments are built when it
/// starts: with many thousand queued waiters, building every call of a round up front would
/// hold all of them in memory at once, several hundred bytes per waiter.
const MAX_CALLS_AT_ONCE: usize = 4;

/// The heartbeat task over `queued`: runs until shutdown. Wakes the displaced waiters in
/// `waiters`.
pub(crate) async fn run_heartbeat(
    ctx: Arc<Context>,
    queued: &QueuedWaiters,
    waiters: Arc<WaiterTable>,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = ctx.config.waiter_lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        beat(&ctx, queued, &waiters).await;
    }
}

/// One heartbeat round over every queued waiter of the client.
async fn beat(ctx: &Arc<Context>, queued: &QueuedWaiters, waiters: &Arc<WaiterTable>) {
    // (shard, read-write?) -> lock id -> (lock, waiter ids)
    type Locks = HashMap<Arc<str>, LockWaiters>;
    let mut shards: HashMap<(u16, bool), Locks> = HashMap::new();
    for entry in queued.waiters.iter() {
        let lock = entry.value();
        let queue_keys = lock.queue_keys();
        let keys = queue_keys.lock();
        shards
            .entry((keys.shard(), lock.vouches_for_waiters()))
            .or_default()
            .entry(keys.id().clone())
            .or_insert_with(|| (lock.clone(), Vec::new()))
            .1
            .push(entry.key().clone());
    }
    let mut calls = tokio::task::JoinSet::new();
    for ((_, rw), locks) in shards {
        // The read-write lock's call also vouches for its waiters for one more waiter lease.
        let (script, first_args): (_, Vec<Value>) = if rw {
            let lease = ctx.config.waiter_lease.as_millis() as i64;
            (&SCRIPTS.rw_heartbeat, vec![lease.into()])
        } else {
            (&SCRIPTS.hold_heartbeat, Vec::new())
        };
        let locks: Vec<_> = locks.into_values().collect();
        for chunk in locks.chunks(MAX_LOCKS_PER_CALL) {
            if calls.len() >= MAX_CALLS_AT_ONCE {
                calls.join_next().await;
            }
            let (ctx, waiters) = (ctx.clone(), waiters.clone());
            let call = (script, first_args.clone());
            calls.spawn(check_places(ctx, waiters, chunk.to_vec(), call));
        }
    }
    while calls.join_next().await.is_some() {}
}

/// The waiters of one lock in one heartbeat call.
type LockWaiters = (Arc<dyn RedisQueue>, Vec<Arc<str>>);

/// Finds which waiters of up to [`MAX_LOCKS_PER_CALL`] locks of one family and shard lost their
/// place (`script`, with its leading arguments: `lua/hold_heartbeat.lua` or
/// `lua/rw_heartbeat.lua`), and wakes them.
async fn check_places(
    ctx: Arc<Context>,
    waiter_table: Arc<WaiterTable>,
    locks: Vec<LockWaiters>,
    (script, mut args): (&'static Script, Vec<Value>),
) {
    let Some((first_lock, _)) = locks.first() else {
        return;
    };
    let mut keys = Vec::with_capacity(locks.len());
    for (lock, waiters) in &locks {
        keys.extend(lock.place_keys());
        args.push((waiters.len() as i64).into());
        args.extend(waiters.iter().map(|w| Value::from(w.as_ref())));
    }
    let reply = ctx
        .run(script, first_lock.queue_keys().lock().name(), keys, args)
        .await
        .and_then(|value| int_array(script.name(), value));
    wake_the_displaced(&waiter_table, &locks, reply);
}

/// Wakes each waiter whose code in a heartbeat reply is 0 (not queued any more), so that it
/// tries again (and joins the queue again if it still waits).
fn wake_the_displaced(waiter_table: &WaiterTable, locks: &[LockWaiters], reply: Result<Vec<i64>>) {
    match reply {
        Ok(codes) => {
            let waiters = locks
                .iter()
                .flat_map(|(lock, ids)| ids.iter().map(move |id| (lock, id)));
            for ((lock, waiter), code) in waiters.zip(codes) {
                if code == 0 {
                    waiter_table.dispatch(
                        lock.queue_keys().lock().id(),
                        &WakeRule::Named(waiter.to_string()),
                    );
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, locks = locks.len(), "waiter heartbeat failed; retrying next round")
        }
    }
}
