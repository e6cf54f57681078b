//! The local waiter table: every task of this process that waits for a lock, by lock id.
//!
//! One table per process, shared by every lock handle and fed by the one event reader
//! ([`super::stream`] or [`super::pubsub`]). A task that waits costs a queue entry and a
//! [`Notify`], not a connection or a subscription of its own.
//!
//! A waiter is registered *before* its acquire attempt ([`WaiterTable::register`]), so an event
//! for a release that happens after the attempt finds it. The reader applies each event to the
//! queue of its lock ([`WaiterTable::dispatch`], by the rules below), or wakes everybody when it
//! may have missed one ([`WaiterTable::wake_all`]). A wakeup that arrives before the waiter
//! waits is kept in its `woken` flag, and one that a waiter leaves unused is passed on when its
//! [`Registration`] is dropped. The hand-over side of a waiter (barging mutex) lives in
//! [`super::handover`].
//!
//! ## Wake rules
//!
//! * `one`: the first local waiter that is not already woken;
//! * `grant`: only the waiter with that id, which a release of an exclusive lock already made
//!   the owner; the event's token and grant time travel with the wakeup ([`Granted`]), so the
//!   waiter returns without asking Redis (`lua/lib/hold.lua`);
//! * `name`: only the waiter with that id (a writer at the head of a read-write lock's queue);
//! * `chain` (read-write lock, [`WakeRule::Chain`]): the readers that Redis admits now. The
//!   script that frees the lock (`fl_rw_announce` in `lua/lib/rw.lua`) finds a reader at the
//!   head of the Redis queue and lists the live readers from there up to the first live writer
//!   (the readers `rw_acquire.lua` admits right now); its event carries their waiter ids joined
//!   by [`ID_SEPARATOR`](super::event::ID_SEPARATOR), and each process wakes exactly its local
//!   waiters with those ids. The local queue order plays no part: it is registration order,
//!   which can differ from the order in which the attempts reached Redis. When there are more
//!   such readers than one event names (32), the target is
//!   [`EVERY_READER`](super::event::EVERY_READER) and each process wakes all of its readers of
//!   that lock (those behind a writer try, fail and wait again);
//! * `all`: everybody (after a reconnect, lag or gap).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;

use super::event::{Admitted, Granted, WakeRule};
use super::handover::{Bid, Handover};

/// What a waiter waits for; used by the `chain` rule when it wakes every local reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// Needs the lock alone (mutex, write).
    Exclusive,
    /// Can share the lock with others of its kind (read).
    Shared,
}

/// Not woken since its last wait.
const IDLE: u8 = 0;
/// Woken together with every other waiter that may go (a `chain` event): if it leaves without
/// trying, it wakes nobody in its place.
const WOKEN_WITH_OTHERS: u8 = 1;
/// Woken in its own right: if it leaves without trying, the next local waiter is woken.
pub(super) const WOKEN: u8 = 2;

/// One waiting acquisition.
pub(crate) struct Waiter {
    id: u64,
    kind: WaitKind,
    /// The id by which a `name` or `chain` event designates this waiter, if any.
    pub(super) name: Option<Arc<str>>,
    /// [`IDLE`], [`WOKEN_WITH_OTHERS`] or [`WOKEN`]; only ever raised by a wakeup.
    woken: AtomicU8,
    notify: Notify,
    /// The latest hold a release granted to this waiter (exclusive locks), until it is looked
    /// at.
    granted: std::sync::Mutex<Option<Granted>>,
    /// What it asks for, if a release of this process may hand it the lock.
    pub(super) bid: Option<Bid>,
    /// Whether a release of this process hands it the lock, and the hold it handed.
    pub(super) handover: Handover,
}

impl Waiter {
    pub(super) fn wake(&self, how: u8) {
        self.woken.fetch_max(how, Ordering::AcqRel);
        self.notify.notify_waiters();
    }

    pub(super) fn is_idle(&self) -> bool {
        self.woken.load(Ordering::Acquire) == IDLE
    }
}

/// All local waiters of this process, by lock id.
#[derive(Default)]
pub(crate) struct WaiterTable {
    pub(super) queues: DashMap<Arc<str>, VecDeque<Arc<Waiter>>>,
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
        bid: Option<Bid>,
    ) -> Registration {
        let waiter = Arc::new(Waiter {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            name,
            woken: AtomicU8::new(IDLE),
            notify: Notify::new(),
            granted: std::sync::Mutex::new(None),
            bid,
            handover: Handover::new(),
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
                .find(|w| w.is_idle())
                .map(|w| w.wake(WOKEN))
                .map_or(0, |_| 1),
            WakeRule::Named(target) => queue
                .iter()
                .filter(|w| w.name.as_deref() == Some(target.as_str()))
                .map(|w| w.wake(WOKEN))
                .count(),
            WakeRule::Grant(target, granted) => queue
                .iter()
                .filter(|w| w.name.as_deref() == Some(target.as_str()))
                .map(|w| {
                    *w.granted.lock().unwrap_or_else(|p| p.into_inner()) = Some(*granted);
                    w.wake(WOKEN)
                })
                .count(),
            WakeRule::Chain(Admitted::Listed(ids)) => {
                let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
                queue
                    .iter()
                    .filter(|w| w.name.as_deref().is_some_and(|name| ids.contains(name)))
                    .map(|w| w.wake(WOKEN_WITH_OTHERS))
                    .count()
            }
            WakeRule::Chain(Admitted::Every) => queue
                .iter()
                .filter(|w| w.kind == WaitKind::Shared)
                .map(|w| w.wake(WOKEN_WITH_OTHERS))
                .count(),
            WakeRule::All => queue.iter().map(|w| w.wake(WOKEN)).count(),
        };
        self.wakeups.fetch_add(woken as u64, Ordering::Relaxed);
        tracing::trace!(lock = lock_id, ?rule, woken, "wake");
    }

    /// Wakes every local waiter of every lock so that each re-checks its lock at once.
    pub(crate) fn wake_all(&self, why: &'static str) {
        let mut woken = 0u64;
        for queue in self.queues.iter() {
            for waiter in queue.iter() {
                waiter.wake(WOKEN);
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
    pub(super) waiter: Arc<Waiter>,
}

// The hand-over side of a registration (`handed`, `bid_owner`, `taken`, `abandon`) is in
// `handover.rs`.
impl Registration {
    /// Waits until this waiter is woken or `limit` passes. Returns true when woken.
    /// A wakeup that arrived since the previous wait is returned at once.
    pub(crate) async fn wait(&self, limit: Duration) -> bool {
        let notified = self.waiter.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.waiter.woken.swap(IDLE, Ordering::AcqRel) != IDLE {
            return true;
        }
        let woke = tokio::time::timeout(limit, notified).await.is_ok();
        self.waiter.woken.swap(IDLE, Ordering::AcqRel) != IDLE || woke
    }

    /// Takes the hold a release granted to this waiter since the last look, if one did (fair
    /// lock). The caller still checks that it is not older than the waiter's last busy attempt.
    pub(crate) fn granted(&self) -> Option<Granted> {
        self.waiter
            .granted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The attempt that answered this waiter's last wakeup failed and the waiter is about to
    /// give up: mark the wakeup unused, so that dropping the registration passes it on to the
    /// next local waiter.
    pub(crate) fn hand_on_wakeup(&self) {
        self.waiter.woken.fetch_max(WOKEN, Ordering::AcqRel);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.table.remove(&self.lock_id, &self.waiter);
        if self.waiter.woken.load(Ordering::Acquire) == WOKEN {
            // We were woken but never tried: give the wakeup to the next local waiter. (Not
            // after a `chain` event: it woke every reader that may go, this one included.)
            self.table.dispatch(&self.lock_id, &WakeRule::One);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Arc<str> {
        s.into()
    }

    /// Waits a millisecond: true when the waiter was woken.
    async fn woken(waiter: &Registration) -> bool {
        waiter.wait(Duration::from_millis(1)).await
    }

    /// Two waiters of `mutex:a` without a name, in registration order.
    fn two_mutex_waiters() -> (Arc<WaiterTable>, Registration, Registration) {
        let table = WaiterTable::new();
        let lock = id("mutex:a");
        let first = table.register(&lock, WaitKind::Exclusive, None, None);
        let second = table.register(&lock, WaitKind::Exclusive, None, None);
        (table, first, second)
    }

    /// Registers a waiter named `name`: a reader when the name starts with `r`, else a writer.
    fn named(table: &Arc<WaiterTable>, lock: &str, name: &str) -> Registration {
        let kind = if name.starts_with('r') {
            WaitKind::Shared
        } else {
            WaitKind::Exclusive
        };
        table.register(&id(lock), kind, Some(id(name)), None)
    }

    fn listed(ids: &[&str]) -> WakeRule {
        WakeRule::Chain(Admitted::Listed(
            ids.iter().map(|id| (*id).to_owned()).collect(),
        ))
    }

    #[tokio::test]
    async fn wake_one_wakes_the_first_idle_waiter_in_order() {
        let (table, first, second) = two_mutex_waiters();
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(woken(&first).await);
        assert!(!woken(&second).await);
        table.dispatch("mutex:a", &WakeRule::One);
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(woken(&first).await);
        assert!(woken(&second).await);
    }

    #[tokio::test]
    async fn a_woken_waiter_that_leaves_passes_the_wakeup_on() {
        let (table, first, second) = two_mutex_waiters();
        table.dispatch("mutex:a", &WakeRule::One);
        drop(first);
        assert!(woken(&second).await);
        drop(second);
        assert_eq!(table.waiters(), 0);
        assert_eq!(table.queues(), 0, "empty queues are removed");
    }

    #[tokio::test]
    async fn a_woken_waiter_that_fails_hands_its_wakeup_on() {
        let (table, first, second) = two_mutex_waiters();
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(woken(&first).await);
        // Its attempt failed (say, out of memory) and it gives up.
        first.hand_on_wakeup();
        drop(first);
        assert!(woken(&second).await);
    }

    #[tokio::test]
    async fn chain_wakes_exactly_the_listed_readers_whatever_the_local_order() {
        let table = WaiterTable::new();
        // Local (registration) order: a writer first. In Redis the readers r1 and r3 came first.
        let [w1, r1, w2, r2, r3] = ["w1", "r1", "w2", "r2", "r3"].map(|n| named(&table, "rw:a", n));
        table.dispatch("rw:a", &listed(&["r3", "r1", "r-elsewhere"]));
        assert!(woken(&r1).await);
        assert!(woken(&r3).await);
        assert!(!woken(&w1).await, "a local head writer");
        assert!(!woken(&w2).await);
        assert!(
            !woken(&r2).await,
            "a reader that is not listed (behind a writer in Redis)"
        );
        assert_eq!(table.wakeups(), 2);
        // Another lock's event wakes nobody here.
        table.dispatch("rw:b", &listed(&["r2"]));
        assert!(!woken(&r2).await);
    }

    #[tokio::test]
    async fn a_capped_chain_wakes_every_local_reader_and_no_writer() {
        let table = WaiterTable::new();
        let [w1, r1, w2, r2] = ["w1", "r1", "w2", "r2"].map(|n| named(&table, "rw:a", n));
        table.dispatch("rw:a", &WakeRule::Chain(Admitted::Every));
        assert!(woken(&r1).await);
        assert!(woken(&r2).await);
        assert!(!woken(&w1).await);
        assert!(!woken(&w2).await);
    }

    #[tokio::test]
    async fn a_reader_woken_by_chain_that_leaves_wakes_nobody_else() {
        let table = WaiterTable::new();
        let [r1, w1, r2] = ["r1", "w1", "r2"].map(|n| named(&table, "rw:a", n));
        table.dispatch("rw:a", &listed(&["r1"]));
        drop(r1);
        assert!(!woken(&w1).await);
        assert!(!woken(&r2).await);
        // Woken in its own right as well (here by name): then it does pass the wakeup on.
        let r3 = named(&table, "rw:a", "r3");
        table.dispatch("rw:a", &listed(&["r3"]));
        table.dispatch("rw:a", &WakeRule::Named("r3".into()));
        drop(r3);
        assert!(woken(&w1).await);
    }

    #[tokio::test]
    async fn named_wakes_only_its_target() {
        let table = WaiterTable::new();
        let [a, b] = ["w1", "w2"].map(|n| named(&table, "fair:a", n));
        table.dispatch("fair:a", &WakeRule::Named("w2".into()));
        assert!(!woken(&a).await);
        assert!(woken(&b).await);
    }
}
