//! Deferred releases: the holds of this client whose release waits for the releasing task to
//! yield (see [`release`](super::release)), and the acquisitions of this client that ask for
//! them meanwhile.
//!
//! A parked hold goes through three states, all under the map's entry lock, so each step has
//! one winner:
//!
//! * **parked**: nobody asked yet. The first acquisition that asks names itself the hold's
//!   successor ([`ParkedHolds::ask`]).
//! * **releasing**: the hold's release task, or the successor itself when that task is slow to
//!   start ([`ParkedHolds::withdraw`]), took the hold and sends its release (naming the
//!   successor, if any). An acquisition that asks now *follows*: it waits for that release to
//!   be done and then asks Redis like any other. Otherwise it could reach Redis before the
//!   release and re-enter the old hold of its own owner, ahead of every queued waiter.
//! * **gone**: the release is done ([`ParkedHolds::finish`]); its followers hear of it.
//!
//! A hold is parked *with* a release task of its own (spawned when it is parked, it runs once
//! the releasing task yields), or *lazily*: without one, when its acquisition took it over
//! from a deferred release itself (a task that releases and asks again at once, a loop) and
//! it may still pass on within the process (`super::cohort`). The task would run, as a rule,
//! only to find the hold taken over again, and on a multi-threaded runtime it costs more than
//! that: it sits in the worker's next slot, and the loop's next Redis command, which wakes
//! fred's router task into that slot, pushes it out and wakes an idle worker thread to steal
//! it (a futex call and two context switches per acquisition). Instead the lock gets a *turn
//! timer* ([`ParkedHolds::arm`]), armed by the first lazy park of a turn of this client on the
//! lock, at the end of its hand-over window (within [`TURN_TIMER_CAP`]): when it fires, the
//! lazily parked hold nobody took over is released ([`ParkedHolds::lazy_release`]). The turn
//! ends earlier as a rule (its last release goes to Redis, which drops the timer without
//! firing it), so a turn costs at most one timer, however many acquisitions it makes. An
//! acquisition that asks for a lazily parked hold sends the take-over itself
//! ([`Asked::Release`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::{Instant, Sleep};

use super::{Driver, DriverHold, Released, Successor};
use crate::context::Table;
use crate::error::Result;
use crate::notify::Bid;

/// Holds whose release is deferred, by lock id (at most one per lock: the lock is exclusive).
#[derive(Default)]
pub(crate) struct ParkedHolds {
    holds: Table<Arc<str>, Parked>,
    /// The turn timers of the locks with lazily parked holds (see the module docs).
    timers: Table<Arc<str>, Pin<Box<Sleep>>>,
    /// Signalled by every [`finish`](ParkedHolds::finish): shutdown waits for the releases on
    /// their way ([`ParkedHolds::settled`]).
    finished: Notify,
}

/// The longest a lazily parked hold waits for its turn timer: bounds the wait of the others
/// when the task that parked it does not ask again (however long the hand-over window).
pub(crate) const TURN_TIMER_CAP: Duration = Duration::from_millis(20);

/// A parked hold, the acquisition that asked to take it over, and those that asked after.
struct Parked {
    hold: Arc<DriverHold>,
    /// Parked without a release task of its own (see the module docs).
    lazy: bool,
    successor: Option<TakeOver>,
    /// Its release is on its way.
    releasing: bool,
    followers: Vec<oneshot::Sender<Result<Released>>>,
}

/// An acquisition's request to take a parked hold over: its waiter id and bid, when it gives
/// up retrying (its patience), and where the release's outcome goes.
pub(crate) struct TakeOver {
    pub(crate) waiter: Arc<str>,
    pub(crate) bid: Bid,
    pub(crate) give_up: Option<Instant>,
    pub(crate) reply: oneshot::Sender<Result<Released>>,
}

/// What an acquisition that asked for a parked hold waits for.
pub(crate) enum Asked {
    /// The outcome of the release naming it, sent by the hold's release task.
    Successor(oneshot::Receiver<Result<Released>>),
    /// The end of a release already on its way (the outcome says `Passed`).
    Follower(oneshot::Receiver<Result<Released>>),
    /// A lazily parked hold, whose release naming the acquisition the acquisition sends
    /// itself: nobody else would.
    Release(Arc<DriverHold>),
}

impl ParkedHolds {
    /// Parks `hold`, unless a hold of its lock is parked already; `lazily`: without a release
    /// task of its own (the caller arms the lock's turn timer).
    ///
    /// A parked hold whose release is on its way gives way: this client holds the lock again,
    /// so that release handed it over already (to `hold`'s acquisition, or to the one `hold`
    /// was handed on from) and is only finishing (a hand-over lets the new holder run before
    /// its task goes on). Its followers ask Redis, as when it finishes.
    pub(crate) fn park(&self, hold: &Arc<DriverHold>, lazily: bool) -> bool {
        let parked = Parked {
            hold: hold.clone(),
            lazy: lazily,
            successor: None,
            releasing: false,
            followers: Vec::new(),
        };
        match self.holds.entry(hold.lock.keys().id().clone()) {
            dashmap::Entry::Vacant(entry) => {
                entry.insert(parked);
                true
            }
            dashmap::Entry::Occupied(mut entry) if entry.get().releasing => {
                let done = entry.insert(parked);
                answer_followers(done.followers);
                true
            }
            dashmap::Entry::Occupied(_) => false,
        }
    }

    /// Asks for the parked hold of `lock_id`: as its successor if nobody asked before and its
    /// release has not started, else as a follower of that release. None when nothing is
    /// parked.
    pub(crate) fn ask(
        &self,
        lock_id: &str,
        waiter: &Arc<str>,
        bid: &Bid,
        give_up: Option<Instant>,
    ) -> Option<Asked> {
        let mut parked = self.holds.get_mut(lock_id)?;
        let (reply, outcome) = oneshot::channel();
        if parked.releasing || parked.successor.is_some() {
            parked.followers.push(reply);
            return Some(Asked::Follower(outcome));
        }
        if parked.lazy {
            parked.releasing = true;
            let hold = parked.hold.clone();
            drop(parked);
            // The turn ends here: its last release goes to Redis.
            self.disarm(lock_id);
            return Some(Asked::Release(hold));
        }
        parked.successor = Some(TakeOver {
            waiter: waiter.clone(),
            bid: bid.clone(),
            give_up,
            reply,
        });
        Some(Asked::Successor(outcome))
    }

    /// Takes the parked hold of `lock_id` away, released by nobody, when nobody asked for it
    /// yet, its release has not started and `take` hands it on (a hand-over within the
    /// process, [`super::cohort`]): its release task then finds it gone and does nothing.
    pub(crate) fn take_if<T>(
        &self,
        lock_id: &str,
        take: impl FnOnce(&Arc<DriverHold>) -> Option<T>,
    ) -> Option<T> {
        // Decided and removed under the entry's lock: the release task cannot start between.
        let mut taken = None;
        self.holds.remove_if(lock_id, |_, parked| {
            if parked.releasing || parked.successor.is_some() {
                return false;
            }
            taken = take(&parked.hold);
            taken.is_some()
        });
        taken
    }

    /// Arms the turn timer of `lock_id` to fire at `at` with `waker`, unless it is armed
    /// already (see the module docs). Polling the timer once registers it with the runtime's
    /// timer, which wakes `waker` then; no task waits on it.
    pub(crate) fn arm(&self, lock_id: &Arc<str>, at: Instant, waker: impl FnOnce() -> Waker) {
        if let dashmap::Entry::Vacant(entry) = self.timers.entry(lock_id.clone()) {
            let mut timer = Box::pin(tokio::time::sleep_until(at));
            let waker = waker();
            let _ = timer.as_mut().poll(&mut Context::from_waker(&waker));
            entry.insert(timer);
        }
    }

    /// Drops the turn timer of `lock_id` (unfired, it never wakes anything).
    pub(crate) fn disarm(&self, lock_id: &str) {
        self.timers.remove(lock_id);
    }

    /// The turn timer of `lock_id` fired: drops it, and takes the lazily parked hold of the
    /// lock that nobody asked for, if there is one, for the caller to start its release task.
    pub(crate) fn lazy_release(&self, lock_id: &str) -> Option<Arc<DriverHold>> {
        self.disarm(lock_id);
        let mut parked = self.holds.get_mut(lock_id)?;
        if !parked.lazy || parked.releasing || parked.successor.is_some() {
            return None;
        }
        parked.lazy = false;
        Some(parked.hold.clone())
    }

    /// The hold's release task starts: takes the successor, if one asked. None when `hold` is
    /// no longer parked, or its release was started by its successor.
    pub(crate) fn start(&self, hold: &Arc<DriverHold>) -> Option<Option<TakeOver>> {
        let lock_id = hold.lock.keys().id().as_ref();
        let mut parked = self.holds.get_mut(lock_id)?;
        if !Arc::ptr_eq(&parked.hold, hold) || parked.releasing {
            return None;
        }
        parked.releasing = true;
        let successor = parked.successor.take();
        drop(parked);
        self.disarm(lock_id);
        Some(successor)
    }

    /// The successor `waiter` of the parked hold of `lock_id` starts the release itself (the
    /// hold's task did not run in time): the hold, if its release has not started yet.
    pub(crate) fn withdraw(&self, lock_id: &str, waiter: &str) -> Option<Arc<DriverHold>> {
        let mut parked = self.holds.get_mut(lock_id)?;
        let ours = matches!(&parked.successor, Some(t) if t.waiter.as_ref() == waiter);
        if parked.releasing || !ours {
            return None;
        }
        parked.releasing = true;
        parked.successor = None;
        let hold = parked.hold.clone();
        drop(parked);
        self.disarm(lock_id);
        Some(hold)
    }

    /// The release of `hold` is done: it is no longer parked, and its followers ask Redis.
    pub(crate) fn finish(&self, hold: &Arc<DriverHold>) {
        let removed = self
            .holds
            .remove_if(hold.lock.keys().id().as_ref(), |_, parked| {
                Arc::ptr_eq(&parked.hold, hold)
            });
        if let Some((_, parked)) = removed {
            answer_followers(parked.followers);
        }
        self.finished.notify_waiters();
    }

    /// Waits until no hold is parked any more, at most until `deadline` (shutdown, after
    /// [`drain`](Self::drain) took those whose release had not started). A release already on
    /// its way (its task started on another worker thread while the client shut down) needs
    /// the connection that shutdown closes next: cut off, it would fail and leave the lock
    /// held in Redis until its lease ran out, with others waiting for it.
    pub(crate) async fn settled(&self, deadline: Instant) {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            finished.as_mut().enable();
            if self.holds.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                tracing::warn!(
                    parked = self.holds.len(),
                    "shutdown: deferred releases still on their way; closing the connection"
                );
                return;
            }
        }
    }

    /// Takes every parked hold whose release has not started (shutdown). Its successor and
    /// followers are dropped unanswered: they ask Redis like any other acquisition.
    pub(crate) fn drain(&self) -> Vec<Arc<DriverHold>> {
        self.timers.clear();
        let ids: Vec<Arc<str>> = self.holds.iter().map(|e| e.key().clone()).collect();
        ids.iter()
            .filter_map(|id| self.holds.remove_if(id, |_, parked| !parked.releasing))
            .map(|(_, parked)| parked.hold)
            .collect()
    }

    /// Parked holds that no acquisition asked for and whose release has not started
    /// (diagnostics).
    pub(crate) fn len(&self) -> usize {
        self.holds
            .iter()
            .filter(|e| e.successor.is_none() && !e.releasing)
            .count()
    }

    /// Whether a hold that an acquisition through `driver` may take over is parked: one of
    /// the same lock and the same role (a read acquisition never takes a write hold over).
    pub(crate) fn parked_for(&self, driver: &dyn Driver) -> bool {
        driver.take_over().is_some()
            && self
                .holds
                .get(driver.keys().id().as_ref())
                .is_some_and(|parked| parked.hold.lock.hold_role() == driver.hold_role())
    }
}

/// Tells the followers of a release that it is done: they ask Redis.
fn answer_followers(followers: Vec<oneshot::Sender<Result<Released>>>) {
    for follower in followers {
        let _ = follower.send(Ok(Released::Yes {
            remaining: 0,
            successor: Successor::Passed,
        }));
    }
}
