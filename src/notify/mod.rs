//! Push notifications: one reader per process, one local waiter queue per lock.
//!
//! Scripts that free a lock while someone may be waiting emit one event (see `lua/lib/notify.lua`)
//! into their shard's stream or channel, atomically with the state change. Each process runs a
//! single reader ([`stream`] or [`pubsub`]) on its own connection; it turns every event into a
//! wakeup of the *local* waiters of that lock, kept in [`WaiterTable`] (a `DashMap` from lock id
//! to a FIFO queue). So a process uses a fixed number of connections however many tasks wait.
//!
//! ## Wake rules
//!
//! * `one`: the first local waiter that is not already woken (barging locks: one attempt per
//!   process per release, not a herd);
//! * `name`: only the waiter with that id (fair lock hand-off);
//! * `chain`: the head, and if it is a reader, the readers queued directly behind it up to the
//!   first writer (read-write lock);
//! * `all`: everybody (after a reconnect, lag or gap).
//!
//! ## No lost wakeups
//!
//! A waiter is registered in the table *before* its acquire attempt, so an event for a release
//! that happens after the attempt finds it. Readers never skip events silently: every event
//! carries its shard's sequence number, and a jump (trimmed stream, dropped message), a read
//! error or a reconnect wakes every local waiter to re-check at once. Finally every wait is
//! bounded by the remaining lease the attempt reported, so even an event that never comes
//! costs at most one lease. A woken waiter that is dropped before it could try passes its
//! wakeup on to the next one.

pub(crate) mod pubsub;
pub(crate) mod stream;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;

/// What a waiter waits for; used by the `chain` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// Needs the lock alone (mutex, write).
    Exclusive,
    /// Can share the lock with others of its kind (read).
    Shared,
}

/// How an event wakes the local waiters of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WakeRule {
    One,
    Named(String),
    Chain,
    All,
}

impl WakeRule {
    pub(crate) fn parse(rule: &str, target: &str) -> WakeRule {
        match rule {
            "one" => WakeRule::One,
            "name" => WakeRule::Named(target.to_owned()),
            "chain" => WakeRule::Chain,
            _ => WakeRule::All,
        }
    }
}

/// One release event as read from a stream entry or a channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) seq: u64,
    pub(crate) lock_id: String,
    pub(crate) rule: WakeRule,
}

impl Event {
    /// Parses the pub/sub payload `seq|rule|target|lock_id` (the lock id may contain `|`).
    pub(crate) fn from_payload(payload: &str) -> Option<Event> {
        let mut parts = payload.splitn(4, '|');
        let seq = parts.next()?.parse().ok()?;
        let rule = parts.next()?;
        let target = parts.next()?;
        let lock_id = parts.next()?;
        Some(Event {
            seq,
            lock_id: lock_id.to_owned(),
            rule: WakeRule::parse(rule, target),
        })
    }
}

/// Tracks the event sequence of each shard and reports gaps.
#[derive(Debug, Default)]
pub(crate) struct SeqTracker {
    last: Vec<Option<u64>>,
}

impl SeqTracker {
    pub(crate) fn new(shards: u16) -> Self {
        SeqTracker {
            last: vec![None; usize::from(shards)],
        }
    }

    /// Records `seq` for `shard`; true when events were missed since the previous one.
    pub(crate) fn gap(&mut self, shard: usize, seq: u64) -> bool {
        let Some(slot) = self.last.get_mut(shard) else {
            return false;
        };
        let missed = matches!(*slot, Some(last) if seq != last.wrapping_add(1));
        *slot = Some(seq);
        missed
    }

    /// Forgets every position (after a reconnect in pub/sub mode, where gaps are expected).
    pub(crate) fn reset(&mut self) {
        self.last.iter_mut().for_each(|slot| *slot = None);
    }
}

const IDLE: bool = false;
const WOKEN: bool = true;

/// One waiting acquisition.
pub(crate) struct Waiter {
    id: u64,
    kind: WaitKind,
    /// The id by which a `name` event designates this waiter (fair lock), if any.
    name: Option<Arc<str>>,
    woken: AtomicBool,
    notify: Notify,
}

impl Waiter {
    fn wake(&self) {
        self.woken.store(WOKEN, Ordering::Release);
        self.notify.notify_waiters();
    }
}

/// All local waiters of this process, by lock id.
#[derive(Default)]
pub(crate) struct WaiterTable {
    queues: DashMap<Arc<str>, VecDeque<Arc<Waiter>>>,
    next_id: AtomicU64,
    wakeups: AtomicU64,
}

impl WaiterTable {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(WaiterTable::default())
    }

    /// Registers a waiter at the tail of the lock's local queue. Do this before the acquire
    /// attempt whose failure you will wait on.
    pub(crate) fn register(
        self: &Arc<Self>,
        lock_id: &Arc<str>,
        kind: WaitKind,
        name: Option<Arc<str>>,
    ) -> Registration {
        let waiter = Arc::new(Waiter {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            name,
            woken: AtomicBool::new(IDLE),
            notify: Notify::new(),
        });
        self.queues
            .entry(lock_id.clone())
            .or_default()
            .push_back(waiter.clone());
        Registration {
            table: self.clone(),
            lock_id: lock_id.clone(),
            waiter,
        }
    }

    /// Applies an event to the local queue of its lock.
    pub(crate) fn dispatch(&self, lock_id: &str, rule: &WakeRule) {
        let Some(queue) = self.queues.get(lock_id) else {
            return;
        };
        let woken = match rule {
            WakeRule::One => queue
                .iter()
                .find(|w| !w.woken.load(Ordering::Acquire))
                .map(|w| w.wake())
                .map_or(0, |_| 1),
            WakeRule::Named(target) => queue
                .iter()
                .filter(|w| w.name.as_deref() == Some(target.as_str()))
                .map(|w| w.wake())
                .count(),
            WakeRule::Chain => {
                let mut count = 0;
                for (i, waiter) in queue.iter().enumerate() {
                    if i > 0 && waiter.kind == WaitKind::Exclusive {
                        break;
                    }
                    waiter.wake();
                    count += 1;
                    if waiter.kind == WaitKind::Exclusive {
                        break;
                    }
                }
                count
            }
            WakeRule::All => queue.iter().map(|w| w.wake()).count(),
        };
        self.wakeups.fetch_add(woken as u64, Ordering::Relaxed);
        tracing::trace!(lock = lock_id, ?rule, woken, "wake");
    }

    /// Wakes every local waiter of every lock so that each re-checks its lock at once.
    pub(crate) fn wake_all(&self, why: &'static str) {
        let mut woken = 0u64;
        for queue in self.queues.iter() {
            for waiter in queue.iter() {
                waiter.wake();
                woken += 1;
            }
        }
        self.wakeups.fetch_add(woken, Ordering::Relaxed);
        if woken > 0 {
            tracing::debug!(why, woken, "waking every local waiter to re-check");
        }
    }

    /// Number of registered waiters (all locks).
    pub(crate) fn waiters(&self) -> usize {
        self.queues.iter().map(|q| q.len()).sum()
    }

    /// Number of local waiters of one lock.
    pub(crate) fn waiting_on(&self, lock_id: &str) -> usize {
        self.queues.get(lock_id).map_or(0, |queue| queue.len())
    }

    /// Number of locks with a local queue.
    pub(crate) fn queues(&self) -> usize {
        self.queues.len()
    }

    /// Total wakeups delivered so far (diagnostics and tests).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn remove(&self, lock_id: &Arc<str>, waiter: &Arc<Waiter>) {
        if let dashmap::Entry::Occupied(mut entry) = self.queues.entry(lock_id.clone()) {
            let queue = entry.get_mut();
            if let Some(pos) = queue.iter().position(|w| w.id == waiter.id) {
                queue.remove(pos);
            }
            if queue.is_empty() {
                entry.remove();
            }
        }
    }
}

/// A registered waiter; dropping it leaves the queue (and hands on an unused wakeup).
pub(crate) struct Registration {
    table: Arc<WaiterTable>,
    lock_id: Arc<str>,
    waiter: Arc<Waiter>,
}

impl Registration {
    /// Waits until this waiter is woken or `limit` passes. Returns true when woken.
    /// A wakeup that arrived since the previous wait is returned at once.
    pub(crate) async fn wait(&self, limit: Duration) -> bool {
        let notified = self.waiter.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.waiter.woken.swap(IDLE, Ordering::AcqRel) {
            return true;
        }
        let woke = tokio::time::timeout(limit, notified).await.is_ok();
        self.waiter.woken.swap(IDLE, Ordering::AcqRel) || woke
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.remove(&self.lock_id, &self.waiter);
        if self.waiter.woken.load(Ordering::Acquire) {
            // We were woken but never tried: give the wakeup to the next local waiter.
            self.table.dispatch(&self.lock_id, &WakeRule::One);
        }
    }
}

/// Everything an event reader task needs.
pub(crate) struct Reader {
    /// The dedicated notifier connection.
    pub(crate) client: fred::clients::Client,
    pub(crate) keyspace: crate::keys::Keyspace,
    /// The shards this reader covers.
    pub(crate) shards: Vec<u16>,
    /// Subscribe with `SSUBSCRIBE` (Redis Cluster) instead of `SUBSCRIBE`.
    pub(crate) sharded_pubsub: bool,
    pub(crate) waiters: Arc<WaiterTable>,
    pub(crate) config: crate::config::Config,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Reader {
    /// The event keys (streams or channels) of this reader's shards, in the order of `shards`.
    pub(crate) fn event_keys(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|&shard| self.keyspace.events(shard))
            .collect()
    }

    /// Maps an event key back to its shard number.
    pub(crate) fn shard_of_key(&self) -> std::collections::HashMap<String, usize> {
        self.shards
            .iter()
            .map(|&shard| (self.keyspace.events(shard), usize::from(shard)))
            .collect()
    }
}

/// Backoff between failed reads: 50 ms doubling up to the configured reconnect delay.
pub(crate) fn backoff(failures: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(50).saturating_mul(1 << failures.min(10));
    base.min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Arc<str> {
        s.into()
    }

    #[tokio::test]
    async fn wake_one_wakes_the_first_idle_waiter_in_order() {
        let table = WaiterTable::new();
        let lock = id("mutex:a");
        let first = table.register(&lock, WaitKind::Exclusive, None);
        let second = table.register(&lock, WaitKind::Exclusive, None);
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(first.wait(Duration::from_millis(1)).await);
        assert!(!second.wait(Duration::from_millis(1)).await);
        table.dispatch("mutex:a", &WakeRule::One);
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(first.wait(Duration::from_millis(1)).await);
        assert!(second.wait(Duration::from_millis(1)).await);
    }

    #[tokio::test]
    async fn a_woken_waiter_that_leaves_passes_the_wakeup_on() {
        let table = WaiterTable::new();
        let lock = id("mutex:a");
        let first = table.register(&lock, WaitKind::Exclusive, None);
        let second = table.register(&lock, WaitKind::Exclusive, None);
        table.dispatch("mutex:a", &WakeRule::One);
        drop(first);
        assert!(second.wait(Duration::from_millis(1)).await);
        drop(second);
        assert_eq!(table.waiters(), 0);
        assert_eq!(table.queues(), 0, "empty queues are removed");
    }

    #[tokio::test]
    async fn chain_wakes_leading_readers_and_stops_at_a_writer() {
        let table = WaiterTable::new();
        let lock = id("rw:a");
        let r1 = table.register(&lock, WaitKind::Shared, None);
        let r2 = table.register(&lock, WaitKind::Shared, None);
        let w = table.register(&lock, WaitKind::Exclusive, None);
        let r3 = table.register(&lock, WaitKind::Shared, None);
        table.dispatch("rw:a", &WakeRule::Chain);
        assert!(r1.wait(Duration::from_millis(1)).await);
        assert!(r2.wait(Duration::from_millis(1)).await);
        assert!(!w.wait(Duration::from_millis(1)).await);
        assert!(!r3.wait(Duration::from_millis(1)).await);
        drop((r1, r2));
        table.dispatch("rw:a", &WakeRule::Chain);
        assert!(w.wait(Duration::from_millis(1)).await);
        assert!(
            !r3.wait(Duration::from_millis(1)).await,
            "a writer head stops the chain"
        );
    }

    #[tokio::test]
    async fn named_wakes_only_its_target() {
        let table = WaiterTable::new();
        let lock = id("fair:a");
        let a = table.register(&lock, WaitKind::Exclusive, Some(id("w1")));
        let b = table.register(&lock, WaitKind::Exclusive, Some(id("w2")));
        table.dispatch("fair:a", &WakeRule::Named("w2".into()));
        assert!(!a.wait(Duration::from_millis(1)).await);
        assert!(b.wait(Duration::from_millis(1)).await);
    }

    #[test]
    fn payloads_and_gaps() {
        let event = Event::from_payload("7|name|w1|fair:a|b").unwrap();
        assert_eq!(event.seq, 7);
        assert_eq!(event.lock_id, "fair:a|b");
        assert_eq!(event.rule, WakeRule::Named("w1".into()));
        assert!(Event::from_payload("garbage").is_none());
        let mut seq = SeqTracker::new(2);
        assert!(!seq.gap(0, 5));
        assert!(!seq.gap(0, 6));
        assert!(seq.gap(0, 8));
        assert!(!seq.gap(1, 1));
        assert!(!seq.gap(9, 1), "unknown shard is ignored");
    }
}
