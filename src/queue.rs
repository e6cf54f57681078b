//! The client's heartbeat over its waiters queued in Redis.
//!
//! Instead of one timer per waiter, each client keeps a registry of its queued waiters and ONE
//! heartbeat task that, every third of the waiter lease, handles all of them with one script
//! call per hash slot and lock family:
//!
//! * read-write locks (`lua/queue_heartbeat.lua`): a queued waiter must prove it is alive, or a
//!   crashed process would stall everyone behind it. The call refreshes the waiters' leases,
//!   evicts dead waiters at the head of free locks and tells the new head, so a dead head
//!   stalls its queue for at most one waiter lease;
//! * exclusive locks (`lua/hold_heartbeat.lua`, read only): a release passes over waiters whose
//!   client is gone, but a grant to a client that died unnoticed lapses after the waiter lease
//!   and takes the lock's hash, queue included, with it. The call finds the waiters whose place
//!   is gone.
//!
//! A waiter that the heartbeat finds gone from its queue is woken to try again; its next
//! attempt re-joins the queue at the tail, or takes the lock.

use std::collections::HashMap;
use std::sync::Arc;

use dashmap::DashMap;
use fred::types::Value;
use tokio::sync::watch;

use crate::client::Core;
use crate::engine::Driver;
use crate::notify::WakeRule;
use crate::scripts::{int_array, Key, SCRIPTS};

/// The queued waiters of one client, by waiter id.
#[derive(Default)]
pub(crate) struct QueuedWaiters {
    waiters: DashMap<Arc<str>, Arc<dyn Driver>>,
}

impl QueuedWaiters {
    pub(crate) fn join(&self, waiter: Arc<str>, driver: Arc<dyn Driver>) {
        self.waiters.insert(waiter, driver);
    }

    pub(crate) fn leave(&self, waiter: &Arc<str>) {
        self.waiters.remove(waiter);
    }

    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }
}

/// Most locks per heartbeat call (keeps each script short).
const MAX_LOCKS_PER_CALL: usize = 128;

/// The heartbeat task: runs until shutdown.
pub(crate) async fn run_heartbeat(core: Arc<Core>, mut shutdown: watch::Receiver<bool>) {
    let period = core.config.waiter_lease / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        beat(&core).await;
    }
}

/// One heartbeat round over every queued waiter of the client.
async fn beat(core: &Arc<Core>) {
    // (shard, read-write?) -> lock id -> (driver, waiter ids)
    type Locks = HashMap<Arc<str>, LockWaiters>;
    let mut shards: HashMap<(u16, bool), Locks> = HashMap::new();
    for entry in core.queued.waiters.iter() {
        let driver = entry.value();
        let keys = driver.keys();
        shards
            .entry((keys.shard(), keys.kind() == "rw"))
            .or_default()
            .entry(keys.id().clone())
            .or_insert_with(|| (driver.clone(), Vec::new()))
            .1
            .push(entry.key().clone());
    }
    let mut calls = tokio::task::JoinSet::new();
    for ((_, rw), locks) in shards {
        let locks: Vec<_> = locks.into_values().collect();
        for chunk in locks.chunks(MAX_LOCKS_PER_CALL) {
            if rw {
                calls.spawn(beat_shard(core.clone(), chunk.to_vec()));
            } else {
                calls.spawn(check_places(core.clone(), chunk.to_vec()));
            }
        }
    }
    while calls.join_next().await.is_some() {}
}

/// The waiters of one lock in one heartbeat call.
type LockWaiters = (Arc<dyn Driver>, Vec<Arc<str>>);

/// Finds which waiters of up to [`MAX_LOCKS_PER_CALL`] exclusive locks of one shard lost their
/// place (`lua/hold_heartbeat.lua`), and wakes them.
async fn check_places(core: Arc<Core>, locks: Vec<LockWaiters>) {
    let Some((first_driver, _)) = locks.first() else {
        return;
    };
    let script = &SCRIPTS.hold_heartbeat;
    let mut keys = Vec::with_capacity(locks.len());
    let mut args: Vec<Value> = Vec::new();
    for (driver, waiters) in &locks {
        keys.push(driver.keys().key(""));
        args.push((waiters.len() as i64).into());
        args.extend(waiters.iter().map(|w| Value::from(w.as_ref())));
    }
    let reply = core
        .run(script, first_driver.keys().name(), keys, args)
        .await
        .and_then(|value| int_array(script.name(), value));
    wake_the_displaced(&core, &locks, reply);
}

/// Refreshes the waiters of up to [`MAX_LOCKS_PER_CALL`] read-write locks of one shard.
async fn beat_shard(core: Arc<Core>, locks: Vec<LockWaiters>) {
    let Some((first_driver, _)) = locks.first() else {
        return;
    };
    let Some(first) = first_driver.wait_queue() else {
        return;
    };
    let script = &SCRIPTS.queue_heartbeat;
    let mut keys = Vec::new();
    let mut args: Vec<Value> = vec![(core.config.waiter_lease.as_millis() as i64).into()];
    args.extend(core.event_args_mode());
    for (driver, waiters) in &locks {
        let Some(lock) = driver.wait_queue() else {
            continue;
        };
        keys.extend(lock.group(Key::Alive));
        args.push(lock.kind().into());
        args.push(driver.keys().id().as_ref().into());
        args.push((waiters.len() as i64).into());
        args.extend(waiters.iter().map(|w| Value::from(w.as_ref())));
    }
    keys.extend(first.shard_events());
    let reply = core
        .run(script, first_driver.keys().name(), keys, args)
        .await
        .and_then(|value| int_array(script.name(), value));
    wake_the_displaced(&core, &locks, reply);
}

/// Wakes each waiter whose code in a heartbeat reply is 0 (not queued any more), so that it
/// tries again (and joins the queue again if it still waits).
fn wake_the_displaced(core: &Core, locks: &[LockWaiters], reply: crate::Result<Vec<i64>>) {
    match reply {
        Ok(codes) => {
            let waiters = locks
                .iter()
                .flat_map(|(driver, ids)| ids.iter().map(move |id| (driver, id)));
            for ((driver, waiter), code) in waiters.zip(codes) {
                if code == 0 {
                    core.waiters
                        .dispatch(driver.keys().id(), &WakeRule::Named(waiter.to_string()));
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, locks = locks.len(), "waiter heartbeat failed; retrying next round")
        }
    }
}
