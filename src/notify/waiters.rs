//! The local waiter table: every task of this process that waits for a lock, by lock id.
//!
//! One table per process, shared by every lock handle and fed by the one event reader
//! ([`super::stream`] or [`super::pubsub`]). A task that waits costs a queue entry and the
//! waker of its task, not a connection or a subscription of its own. (A waiter has exactly one
//! task waiting on it, so a waker slot does what a `tokio::sync::Notify` would, and the wait's
//! future, which is most of a waiting task's memory, is a timer and a reference.)
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
//! * `grants` (read-write lock, [`WakeRule::Grants`]): the readers at the head of the lock's
//!   queue, which a release granted read holds together (`fl_rw_grant` in `lua/lib/rw.lua`):
//!   one event per client, naming its granted readers with their token and grant time, so
//!   each process wakes exactly those waiters, whatever the order of its local queue;
//! * `name`: only the waiter with that id (a Redlock waiter, or a reader of a read-write lock
//!   whose owner holds a read hold already: it re-enters by its own call);
//! * `all`: everybody (after a reconnect, lag or gap).
//!
//! A `held` notice ([`WakeRule::QueuedBehind`]) wakes nobody: it tells the client that a
//! waiter queued behind one of its holds, and goes to whoever registered for it
//! ([`WaiterTable::on_queued_behind`]: the engine, which marks the hold contended).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Sleep;

use super::event::{Granted, WakeRule};
use super::handover::{Bid, Handover};
use crate::context::Table;

/// Not woken since its last wait.
const IDLE: u8 = 0;
/// Woken in its own right: if it leaves without trying, the next local waiter is woken.
pub(super) const WOKEN: u8 = 2;

/// One waiting acquisition.
pub(crate) struct Waiter {
    /// The id by which a `name`, `grant` or `grants` event designates this waiter, if any.
    pub(super) name: Option<Arc<str>>,
    /// [`IDLE`] or [`WOKEN`]; only ever raised by a wakeup.
    woken: AtomicU8,
    /// The waker of the task waiting on it, while it waits ([`Wait`]).
    waker: Mutex<Option<Waker>>,
    /// The latest hold a release granted to this waiter, until it is looked at.
    granted: Mutex<Option<Granted>>,
    /// What it asks for, if a release of this process may hand it the lock.
    pub(super) bid: Option<Bid>,
    /// Whether a release of this process hands it the lock, and the hold it handed.
    pub(super) handover: Handover,
}

impl Waiter {
    /// Raises `woken` first, then wakes the waiting task, if any: a [`Wait`] stores its waker
    /// before it looks at `woken`, so one of the two sees the other.
    pub(super) fn wake(&self, how: u8) {
        self.woken.fetch_max(how, Ordering::AcqRel);
        let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.woken.load(Ordering::Acquire) == IDLE
    }
}

/// Where `held` notices go: the lock id and the hold's token (None: any hold of the lock).
type QueuedBehind = Box<dyn Fn(&str, Option<u64>) + Send + Sync>;

/// All local waiters of this process, by lock id.
#[derive(Default)]
pub(crate) struct WaiterTable {
    pub(super) queues: Table<Arc<str>, VecDeque<Arc<Waiter>>>,
    wakeups: AtomicU64,
    queued_behind: OnceLock<QueuedBehind>,
    /// `held` notices heard.
    notices: AtomicU64,
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
        name: Option<Arc<str>>,
        bid: Option<Bid>,
    ) -> Registration {
        let waiter = Arc::new(Waiter {
            name,
            woken: AtomicU8::new(IDLE),
            waker: Mutex::new(None),
            granted: Mutex::new(None),
            bid,
            handover: Handover::new(),
        });
        // Most locks have one local waiter: room for one, where `or_default` makes room for 4.
        self.queues
            .entry(lock_id.clone())
            .or_insert_with(|| VecDeque::with_capacity(1))
            .push_back(waiter.clone());
        Registration {
            table: self.clone(),
            lock_id: lock_id.clone(),
            waiter,
        }
    }

    /// Sets where `held` notices go (once; a later call is ignored).
    pub(crate) fn on_queued_behind(
        &self,
        notice: impl Fn(&str, Option<u64>) + Send + Sync + 'static,
    ) {
        let _ = self.queued_behind.set(Box::new(notice));
    }

    /// Applies an event to the local queue of its lock.
    pub(crate) fn dispatch(&self, lock_id: &str, rule: &WakeRule) {
        if let WakeRule::QueuedBehind(token) = rule {
            self.notices.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(lock = lock_id, ?token, "a waiter queued behind a hold");
            if let Some(notice) = self.queued_behind.get() {
                notice(lock_id, *token);
            }
            return;
        }
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
            WakeRule::Grants(grants) => {
                let grants: HashMap<&str, Option<Granted>> = grants
                    .iter()
                    .map(|(id, granted)| (id.as_str(), *granted))
                    .collect();
                queue
                    .iter()
                    .filter_map(|w| Some((w, grants.get(w.name.as_deref()?)?)))
                    .map(|(w, granted)| {
                        if let Some(granted) = granted {
                            *w.granted.lock().unwrap_or_else(|p| p.into_inner()) = Some(*granted);
                        }
                        w.wake(WOKEN)
                    })
                    .count()
            }
            WakeRule::All => queue.iter().map(|w| w.wake(WOKEN)).count(),
            WakeRule::QueuedBehind(_) => 0,
        };
        self.wakeups.fetch_add(woken as u64, Ordering::Relaxed);
        tracing::trace!(lock = lock_id, ?rule, woken, "wake");
    }

    /// Wakes the local waiters of `lock_id` whose waiter id `queued` does not tell queued in
    /// Redis (or that have none), so that each asks Redis at once: a grant from the Redis
    /// queue reaches the others by an event of its own.
    pub(crate) fn wake_unqueued(&self, lock_id: &str, queued: impl Fn(&str) -> bool) {
        let Some(queue) = self.queues.get(lock_id) else {
            return;
        };
        let woken = queue
            .iter()
            .filter(|w| !w.name.as_deref().is_some_and(&queued))
            .map(|w| w.wake(WOKEN))
            .count();
        self.wakeups.fetch_add(woken as u64, Ordering::Relaxed);
        tracing::trace!(lock = lock_id, woken, "wake (waiters not queued in Redis)");
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

    /// `held` notices heard so far (diagnostics and tests).
    pub(crate) fn notices(&self) -> u64 {
        self.notices.load(Ordering::Relaxed)
    }

    /// Total wakeups delivered so far (diagnostics and tests).
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn remove(&self, lock_id: &Arc<str>, waiter: &Arc<Waiter>) {
        if let dashmap::Entry::Occupied(mut entry) = self.queues.entry(lock_id.clone()) {
            let queue = entry.get_mut();
            if let Some(pos) = queue.iter().position(|w| Arc::ptr_eq(w, waiter)) {
                queue.remove(pos);
            }
            if queue.is_empty() {
                entry.remove();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Registration::wait`]'s future: the waiter's wakeup or its timer, whichever comes
    /// first. Resolves to true when woken, and consumes the wakeup.
    pub(crate) struct Wait<'a> {
        waiter: &'a Waiter,
        #[pin]
        timer: Sleep,
    }

    impl PinnedDrop for Wait<'_> {
        fn drop(this: Pin<&mut Self>) {
            // The task stops waiting: a wakeup from now on is kept in `woken` only.
            *this.waiter.waker.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

impl Future for Wait<'_> {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = self.project();
        let waiter = *this.waiter;
        {
            let mut slot = waiter.waker.lock().unwrap_or_else(|p| p.into_inner());
            match slot.as_ref() {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                _ => *slot = Some(cx.waker().clone()),
            }
        }
        if waiter.woken.swap(IDLE, Ordering::AcqRel) != IDLE {
            return Poll::Ready(true);
        }
        match this.timer.poll(cx) {
            Poll::Ready(()) => Poll::Ready(waiter.woken.swap(IDLE, Ordering::AcqRel) != IDLE),
            Poll::Pending => Poll::Pending,
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
    /// Waits until this waiter is woken or `limit` passes. Resolves to true when woken.
    /// A wakeup that arrived since the previous wait is returned at once.
    pub(crate) fn wait(&self, limit: Duration) -> Wait<'_> {
        Wait {
            waiter: &self.waiter,
            timer: tokio::time::sleep(limit),
        }
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
            // We were woken but never tried: give the wakeup to the next local waiter.
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
        let first = table.register(&lock, None, None);
        let second = table.register(&lock, None, None);
        (table, first, second)
    }

    /// Registers a waiter named `name`.
    fn named(table: &Arc<WaiterTable>, lock: &str, name: &str) -> Registration {
        table.register(&id(lock), Some(id(name)), None)
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
    async fn a_waiting_task_is_woken_by_a_later_dispatch_and_a_wakeup_is_used_once() {
        let (table, first, _second) = two_mutex_waiters();
        let waiting = tokio::spawn(async move {
            // Far longer than any test run: only the wakeup can end this wait.
            let woken = first.wait(Duration::from_secs(3600)).await;
            (woken, first)
        });
        // On this single-threaded runtime the spawned task runs until it waits.
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing woke it yet");
        table.dispatch("mutex:a", &WakeRule::One);
        let ended = tokio::time::timeout(Duration::from_secs(30), waiting).await;
        let (woken_up, first) = ended
            .expect("the dispatch wakes the waiting task")
            .expect("the waiting task");
        assert!(woken_up);
        // The wakeup was consumed: the next wait runs into its limit.
        assert!(!first.wait(Duration::from_millis(5)).await);
    }

    #[tokio::test]
    async fn a_wait_without_a_wakeup_ends_at_its_limit_not_before() {
        let (_table, first, _second) = two_mutex_waiters();
        let started = tokio::time::Instant::now();
        assert!(!first.wait(Duration::from_millis(20)).await);
        assert!(started.elapsed() >= Duration::from_millis(20));
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
    async fn grants_wake_exactly_the_granted_readers_whatever_the_local_order() {
        let table = WaiterTable::new();
        // Local (registration) order: a writer first. In Redis the readers r1 and r3 came first.
        let [w1, r1, w2, r2, r3] = ["w1", "r1", "w2", "r2", "r3"].map(|n| named(&table, "rw:a", n));
        let granted = Granted {
            token: 7,
            lasts_ms: 3000,
            queued: 1,
        };
        let grants = WakeRule::Grants(vec![
            ("r3".into(), Some(granted)),
            ("r1".into(), None),
            ("r-elsewhere".into(), Some(granted)),
        ]);
        table.dispatch("rw:a", &grants);
        assert!(woken(&r1).await);
        assert!(woken(&r3).await);
        assert_eq!(
            r3.granted(),
            Some(granted),
            "the grant travels with the wakeup"
        );
        assert_eq!(r1.granted(), None, "a grant that did not parse only wakes");
        assert!(!woken(&w1).await, "a local head writer");
        assert!(!woken(&w2).await);
        assert!(!woken(&r2).await, "a reader that was not granted");
        assert_eq!(table.wakeups(), 2);
        // Another lock's event wakes nobody here.
        table.dispatch("rw:b", &WakeRule::Grants(vec![("r2".into(), None)]));
        assert!(!woken(&r2).await);
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
