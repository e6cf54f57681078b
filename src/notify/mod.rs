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
//! * `grant`: only the waiter with that id, which a fair release already made the owner; the
//!   event's token and times travel with the wakeup ([`Granted`]), so the waiter returns without
//!   asking Redis (`lua/lib/fair.lua`);
//! * `name`: only the waiter with that id (a fair lock left free, a writer at the head of a
//!   read-write lock's queue);
//! * `chain` (read-write lock, [`WakeRule::Chain`]): the readers that Redis admits now. The
//!   script that frees the lock (`fl_rw_announce` in `lua/lib/rw.lua`) finds a reader at the
//!   head of the Redis queue and lists the live readers from there up to the first live writer
//!   (the readers `rw_acquire.lua` admits right now); its event carries their waiter ids joined
//!   by [`ID_SEPARATOR`], and each process wakes exactly its local waiters with those ids. The
//!   local queue order plays no part: it is registration order, which can differ from the order
//!   in which the attempts reached Redis. When there are more such readers than one event names
//!   (32), the target is [`EVERY_READER`] and each process wakes all of its readers of that
//!   lock (those behind a writer try, fail and wait again);
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
//! wakeup on to the next one, unless a `chain` event woke it: every other reader that may go
//! was woken by the same event, and leaving the Redis queue (`fair_leave.lua`) announces the
//! new head if the leaver was the head.

pub(crate) mod pubsub;
pub(crate) mod stream;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;

/// What a waiter waits for; used by the `chain` rule when it wakes every local reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitKind {
    /// Needs the lock alone (mutex, write).
    Exclusive,
    /// Can share the lock with others of its kind (read).
    Shared,
}

/// Joins the waiter ids in the target of a `chain` event. Waiter ids are a role letter and a
/// hex op id (`engine.rs`), so they never contain it (nor the pub/sub separator `|`).
pub(crate) const ID_SEPARATOR: char = ',';

/// The target of a `chain` event that wakes every local reader of the lock.
pub(crate) const EVERY_READER: &str = "*";

/// A hold that a release granted to a queued waiter (fair lock, `lua/lib/fair.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    /// The fencing token of the granted hold.
    pub(crate) token: u64,
    /// Server time (ms) of the grant.
    pub(crate) at_ms: u64,
    /// How long the granted hold lasts from then, in ms, until its new owner renews it.
    pub(crate) lasts_ms: u64,
}

/// What a waiting acquisition asks for, so that a release in its own process can hand it the
/// lock directly (barging mutex, see [`WaiterTable::claim_handover`]).
#[derive(Debug, Clone)]
pub(crate) struct Bid {
    /// The owner the hold would be taken for.
    pub(crate) owner: crate::owner::Owner,
    /// The lease the acquisition asks for.
    pub(crate) lease: Duration,
}

/// A hold that a release in this process handed to a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOver {
    pub(crate) token: u64,
    /// When the release that handed it over was sent: the hold began after that.
    pub(crate) at: tokio::time::Instant,
}

/// Hand-over states of a waiter (see [`WaiterTable::claim_handover`]).
const OPEN: u8 = 0;
/// A release in flight may hand the lock to this waiter.
const CLAIMED: u8 = 1;
/// The release handed it the lock ([`Waiter::handed`] is set).
const DONE: u8 = 2;
/// The acquisition went away; a hand-over that arrives now is the releaser's to undo.
const GONE: u8 = 3;
/// The acquisition completed (by the hand-over or by its own attempt).
const TAKEN: u8 = 4;

/// How an event wakes the local waiters of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WakeRule {
    One,
    Named(String),
    /// Fair lock: the lock was granted to this waiter (wire name `grant`, target
    /// `id,token,at_ms,lasts_ms`); only it wakes, and it need not run a script.
    Grant(String, Granted),
    /// Read-write lock: the readers Redis admits now (wire name `chain`).
    Chain(Admitted),
    All,
}

/// The readers a `chain` event lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// These waiter ids: every live reader from the head of the Redis queue up to the first
    /// live writer.
    Listed(Vec<String>),
    /// Every local reader (`Shared` waiter) of the lock: more readers were admitted than one
    /// event names, or the event named none.
    Every,
}

impl Admitted {
    /// Reads a `chain` target: ids joined by [`ID_SEPARATOR`], or [`EVERY_READER`]. A target
    /// without any id (an event of an older version) is read as [`Admitted::Every`], which
    /// wakes a superset of the admitted readers.
    fn parse(target: &str) -> Admitted {
        if target == EVERY_READER {
            return Admitted::Every;
        }
        let ids: Vec<String> = target
            .split(ID_SEPARATOR)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect();
        if ids.is_empty() {
            Admitted::Every
        } else {
            Admitted::Listed(ids)
        }
    }
}

impl WakeRule {
    pub(crate) fn parse(rule: &str, target: &str) -> WakeRule {
        match rule {
            "one" => WakeRule::One,
            "name" => WakeRule::Named(target.to_owned()),
            "chain" => WakeRule::Chain(Admitted::parse(target)),
            "grant" => Self::parse_grant(target),
            _ => WakeRule::All,
        }
    }

    /// A `grant` target whose numbers do not parse still names its waiter: woken, it asks
    /// Redis, which answers that the lock is its own (`lua/fair_acquire.lua`).
    fn parse_grant(target: &str) -> WakeRule {
        let mut parts = target.split(ID_SEPARATOR);
        let id = parts.next().unwrap_or_default().to_owned();
        let mut number = || parts.next().and_then(|part| part.parse::<u64>().ok());
        match (number(), number(), number()) {
            (Some(token), Some(at_ms), Some(lasts_ms)) => WakeRule::Grant(
                id,
                Granted {
                    token,
                    at_ms,
                    lasts_ms,
                },
            ),
            _ => WakeRule::Named(id),
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

/// Where an event was read: a shard's stream or channel, or this client's inbox beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The shared events key of this shard; its events carry the shard's sequence numbers.
    Shard(usize),
    /// This client's inbox of the reader's n-th shard; its events carry the inbox's own
    /// sequence numbers (`fl_emit_direct` in `lua/lib/notify.lua`).
    Inbox(usize),
}

/// The sequence numbers a reader checks: one series per shard, one per inbox.
#[derive(Debug)]
pub(crate) struct Sequences {
    shards: SeqTracker,
    inboxes: SeqTracker,
}

impl Sequences {
    pub(crate) fn new(reader: &Reader) -> Self {
        Sequences {
            shards: SeqTracker::new(reader.keyspace.event_shards()),
            // The inboxes are as new as the client: the first event of each is number 1, so a
            // lost first grant shows as a gap too.
            inboxes: SeqTracker {
                last: vec![Some(0); reader.shards.len()],
            },
        }
    }

    /// Records `seq` read from `source`; true when events of that source were missed.
    pub(crate) fn gap(&mut self, source: Source, seq: u64) -> bool {
        match source {
            Source::Shard(shard) => self.shards.gap(shard, seq),
            // An inbox counter that expired (no grant for 5 minutes) starts again at 1.
            Source::Inbox(inbox) => self.inboxes.gap(inbox, seq) && seq != 1,
        }
    }

    /// Forgets every position (after a reconnect in pub/sub mode, where gaps are expected).
    pub(crate) fn reset(&mut self) {
        self.shards.reset();
        self.inboxes.reset();
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

/// Not woken since its last wait.
const IDLE: u8 = 0;
/// Woken together with every other waiter that may go (a `chain` event): if it leaves without
/// trying, it wakes nobody in its place.
const WOKEN_WITH_OTHERS: u8 = 1;
/// Woken in its own right: if it leaves without trying, the next local waiter is woken.
const WOKEN: u8 = 2;

/// One waiting acquisition.
pub(crate) struct Waiter {
    id: u64,
    kind: WaitKind,
    /// The id by which a `name` or `chain` event designates this waiter, if any.
    name: Option<Arc<str>>,
    /// [`IDLE`], [`WOKEN_WITH_OTHERS`] or [`WOKEN`]; only ever raised by a wakeup.
    woken: AtomicU8,
    notify: Notify,
    /// The latest hold a release granted to this waiter (fair lock), until it is looked at.
    granted: std::sync::Mutex<Option<Granted>>,
    /// What it asks for, if a release of this process may hand it the lock.
    bid: Option<Bid>,
    /// [`OPEN`], [`CLAIMED`], [`DONE`], [`GONE`] or [`TAKEN`].
    handover: AtomicU8,
    /// The hold a release of this process handed it.
    handed: OnceLock<HandedOver>,
}

impl Waiter {
    fn wake(&self, how: u8) {
        self.woken.fetch_max(how, Ordering::AcqRel);
        self.notify.notify_waiters();
    }

    fn is_idle(&self) -> bool {
        self.woken.load(Ordering::Acquire) == IDLE
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
            handover: AtomicU8::new(OPEN),
            handed: OnceLock::new(),
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

    /// Picks the first local waiter of `lock_id` that may be handed the lock by a release of
    /// this process: it has a bid with another owner than the releaser's, has not been woken
    /// and is not claimed by another release. The claim holds until the release answers
    /// ([`Claim::deliver`] or [`Claim::cancel`]).
    pub(crate) fn claim_handover(&self, lock_id: &str, releaser: &str) -> Option<Claim> {
        let queue = self.queues.get(lock_id)?;
        let waiter = queue.iter().find(|w| {
            w.is_idle()
                && w.name.is_some()
                && w.bid.as_ref().is_some_and(|bid| bid.owner.id() != releaser)
                && w.handover
                    .compare_exchange(OPEN, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        })?;
        Some(Claim {
            waiter: waiter.clone(),
        })
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

/// A waiter claimed by a release of this process (see [`WaiterTable::claim_handover`]).
pub(crate) struct Claim {
    waiter: Arc<Waiter>,
}

impl Claim {
    /// The waiter's id (the op id its hold is taken under) and what it asks for.
    pub(crate) fn bid(&self) -> (&str, &Bid) {
        let id = self.waiter.name.as_deref().unwrap_or_default();
        match self.waiter.bid.as_ref() {
            Some(bid) => (id, bid),
            None => unreachable!("only waiters with a bid are claimed"),
        }
    }

    /// The release handed the waiter the lock: tells it. False when the waiter went away
    /// meanwhile; then the caller must release the hold it was handed.
    pub(crate) fn deliver(self, handed: HandedOver) -> bool {
        let _ = self.waiter.handed.set(handed);
        match self.waiter.handover.compare_exchange(
            CLAIMED,
            DONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.waiter.wake(WOKEN);
                true
            }
            // Its own attempt already found the hold its own (answered by its waiter id).
            Err(TAKEN) => true,
            Err(_) => false,
        }
    }

    /// No hand-over happened (or it is unknown whether it did: `recheck` wakes the waiter, whose
    /// next attempt finds out).
    pub(crate) fn cancel(self, recheck: bool) {
        let reopened = self
            .waiter
            .handover
            .compare_exchange(CLAIMED, OPEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if reopened && recheck {
            self.waiter.wake(WOKEN);
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

    /// The hold a release of this process handed to this waiter, if one did.
    pub(crate) fn handed(&self) -> Option<HandedOver> {
        if self.waiter.handover.load(Ordering::Acquire) == DONE {
            self.waiter.handed.get().copied()
        } else {
            None
        }
    }

    /// The owner of this waiter's bid, if it has one.
    pub(crate) fn bid_owner(&self) -> Option<crate::owner::Owner> {
        self.waiter.bid.as_ref().map(|bid| bid.owner.clone())
    }

    /// The acquisition completed: a hand-over can no longer be left unused.
    pub(crate) fn taken(&self) {
        self.waiter.handover.store(TAKEN, Ordering::Release);
    }

    /// The acquisition is going away without the lock: a release that claimed this waiter
    /// will undo its hand-over itself. Returns the hold already handed over and never taken
    /// up, which the caller must release.
    pub(crate) fn abandon(&self) -> Option<HandedOver> {
        // An acquisition that completed stays TAKEN: a release still in flight that claimed it
        // must not mistake it for gone (and release what it holds).
        let previous =
            self.waiter
                .handover
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                    (state != TAKEN).then_some(GONE)
                });
        match previous {
            Ok(DONE) => self.waiter.handed.get().copied(),
            _ => None,
        }
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

/// Everything an event reader task needs.
pub(crate) struct Reader {
    /// The dedicated notifier connection.
    pub(crate) client: fred::clients::Client,
    pub(crate) keyspace: crate::keys::Keyspace,
    /// The shards this reader covers.
    pub(crate) shards: Vec<u16>,
    /// Subscribe with `SSUBSCRIBE` (Redis Cluster) instead of `SUBSCRIBE`.
    pub(crate) sharded_pubsub: bool,
    /// This client's inbox tag: the reader also reads the client's inbox of each of its shards.
    pub(crate) inbox_tag: Arc<str>,
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

    /// This client's inboxes (streams or channels) on this reader's shards, in the order of
    /// `shards`: the fair grants for its waiters, sent to it alone.
    pub(crate) fn inbox_keys(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|&shard| self.keyspace.inbox(shard, &self.inbox_tag))
            .collect()
    }

    /// Maps every key (stream or channel) this reader reads to where its events come from.
    pub(crate) fn sources(&self) -> std::collections::HashMap<String, Source> {
        let shards = self.shards.iter().map(|&shard| {
            (
                self.keyspace.events(shard),
                Source::Shard(usize::from(shard)),
            )
        });
        let inboxes = self
            .inbox_keys()
            .into_iter()
            .enumerate()
            .map(|(n, inbox)| (inbox, Source::Inbox(n)));
        shards.chain(inboxes).collect()
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
        let first = table.register(&lock, WaitKind::Exclusive, None, None);
        let second = table.register(&lock, WaitKind::Exclusive, None, None);
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
        let first = table.register(&lock, WaitKind::Exclusive, None, None);
        let second = table.register(&lock, WaitKind::Exclusive, None, None);
        table.dispatch("mutex:a", &WakeRule::One);
        drop(first);
        assert!(second.wait(Duration::from_millis(1)).await);
        drop(second);
        assert_eq!(table.waiters(), 0);
        assert_eq!(table.queues(), 0, "empty queues are removed");
    }

    fn listed(ids: &[&str]) -> WakeRule {
        WakeRule::Chain(Admitted::Listed(
            ids.iter().map(|id| (*id).to_owned()).collect(),
        ))
    }

    #[tokio::test]
    async fn chain_wakes_exactly_the_listed_readers_whatever_the_local_order() {
        let table = WaiterTable::new();
        let lock = id("rw:a");
        // Local (registration) order: a writer first. In Redis the readers r1 and r3 came first.
        let w1 = table.register(&lock, WaitKind::Exclusive, Some(id("w1")), None);
        let r1 = table.register(&lock, WaitKind::Shared, Some(id("r1")), None);
        let w2 = table.register(&lock, WaitKind::Exclusive, Some(id("w2")), None);
        let r2 = table.register(&lock, WaitKind::Shared, Some(id("r2")), None);
        let r3 = table.register(&lock, WaitKind::Shared, Some(id("r3")), None);
        table.dispatch("rw:a", &listed(&["r3", "r1", "r-elsewhere"]));
        assert!(r1.wait(Duration::from_millis(1)).await);
        assert!(r3.wait(Duration::from_millis(1)).await);
        assert!(
            !w1.wait(Duration::from_millis(1)).await,
            "a local head writer"
        );
        assert!(!w2.wait(Duration::from_millis(1)).await);
        assert!(
            !r2.wait(Duration::from_millis(1)).await,
            "a reader that is not listed (behind a writer in Redis)"
        );
        assert_eq!(table.wakeups(), 2);
        // Another lock's event wakes nobody here.
        table.dispatch("rw:b", &listed(&["r2"]));
        assert!(!r2.wait(Duration::from_millis(1)).await);
    }

    #[tokio::test]
    async fn a_capped_chain_wakes_every_local_reader_and_no_writer() {
        let table = WaiterTable::new();
        let lock = id("rw:a");
        let w1 = table.register(&lock, WaitKind::Exclusive, Some(id("w1")), None);
        let r1 = table.register(&lock, WaitKind::Shared, Some(id("r1")), None);
        let w2 = table.register(&lock, WaitKind::Exclusive, Some(id("w2")), None);
        let r2 = table.register(&lock, WaitKind::Shared, Some(id("r2")), None);
        table.dispatch("rw:a", &WakeRule::Chain(Admitted::Every));
        assert!(r1.wait(Duration::from_millis(1)).await);
        assert!(r2.wait(Duration::from_millis(1)).await);
        assert!(!w1.wait(Duration::from_millis(1)).await);
        assert!(!w2.wait(Duration::from_millis(1)).await);
    }

    #[tokio::test]
    async fn a_reader_woken_by_chain_that_leaves_wakes_nobody_else() {
        let table = WaiterTable::new();
        let lock = id("rw:a");
        let r1 = table.register(&lock, WaitKind::Shared, Some(id("r1")), None);
        let w1 = table.register(&lock, WaitKind::Exclusive, Some(id("w1")), None);
        let r2 = table.register(&lock, WaitKind::Shared, Some(id("r2")), None);
        table.dispatch("rw:a", &listed(&["r1"]));
        drop(r1);
        assert!(!w1.wait(Duration::from_millis(1)).await);
        assert!(!r2.wait(Duration::from_millis(1)).await);
        // Woken in its own right as well (here by name): then it does pass the wakeup on.
        let r3 = table.register(&lock, WaitKind::Shared, Some(id("r3")), None);
        table.dispatch("rw:a", &listed(&["r3"]));
        table.dispatch("rw:a", &WakeRule::Named("r3".into()));
        drop(r3);
        assert!(w1.wait(Duration::from_millis(1)).await);
    }

    #[test]
    fn chain_targets_parse_to_ids_or_every_reader() {
        let event = Event::from_payload("3|chain|rab,rcd|rw:x|y").unwrap();
        assert_eq!(event.lock_id, "rw:x|y");
        assert_eq!(event.rule, listed(&["rab", "rcd"]));
        assert_eq!(
            WakeRule::parse("chain", EVERY_READER),
            WakeRule::Chain(Admitted::Every)
        );
        assert_eq!(
            WakeRule::parse("chain", ""),
            WakeRule::Chain(Admitted::Every),
            "an event without ids wakes every reader"
        );
        assert_eq!(WakeRule::parse("chain", "r1,"), listed(&["r1"]));
    }

    #[test]
    fn waiter_ids_never_contain_an_event_separator() {
        for prefix in ["", "r", "w"] {
            let waiter = format!("{prefix}{}", crate::owner::op_id());
            assert!(!waiter.contains(ID_SEPARATOR), "{waiter}");
            assert!(!waiter.contains('|'), "{waiter}");
            assert_ne!(waiter, EVERY_READER);
        }
    }

    #[tokio::test]
    async fn named_wakes_only_its_target() {
        let table = WaiterTable::new();
        let lock = id("fair:a");
        let a = table.register(&lock, WaitKind::Exclusive, Some(id("w1")), None);
        let b = table.register(&lock, WaitKind::Exclusive, Some(id("w2")), None);
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

    #[test]
    fn inbox_sequences_start_at_one_and_may_restart() {
        let mut seq = Sequences {
            shards: SeqTracker::new(1),
            inboxes: SeqTracker {
                last: vec![Some(0); 2],
            },
        };
        assert!(!seq.gap(Source::Inbox(0), 1));
        assert!(!seq.gap(Source::Inbox(0), 2));
        assert!(seq.gap(Source::Inbox(0), 4), "grant 3 was missed");
        assert!(seq.gap(Source::Inbox(1), 2), "the first grant was missed");
        assert!(
            !seq.gap(Source::Inbox(0), 1),
            "an expired counter starts again"
        );
        assert!(!seq.gap(Source::Shard(0), 9), "shards are tracked apart");
        seq.reset();
        assert!(
            !seq.gap(Source::Inbox(1), 7),
            "after a reset any number is accepted"
        );
    }

    #[tokio::test]
    async fn a_woken_waiter_that_fails_hands_its_wakeup_on() {
        let table = WaiterTable::new();
        let lock = id("mutex:a");
        let first = table.register(&lock, WaitKind::Exclusive, None, None);
        let second = table.register(&lock, WaitKind::Exclusive, None, None);
        table.dispatch("mutex:a", &WakeRule::One);
        assert!(first.wait(Duration::from_millis(1)).await);
        // Its attempt failed (say, out of memory) and it gives up.
        first.hand_on_wakeup();
        drop(first);
        assert!(second.wait(Duration::from_millis(1)).await);
    }
}
