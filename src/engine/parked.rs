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

use std::sync::Arc;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::{Driver, DriverHold, Released, Successor};
use crate::context::Table;
use crate::error::Result;
use crate::notify::Bid;

/// Holds whose release is deferred, by lock id (at most one per lock: the lock is exclusive).
#[derive(Default)]
pub(crate) struct ParkedHolds {
    holds: Table<Arc<str>, Parked>,
    /// Signalled by every [`finish`](ParkedHolds::finish): shutdown waits for the releases on
    /// their way ([`ParkedHolds::settled`]).
    finished: Notify,
}

/// A parked hold, the acquisition that asked to take it over, and those that asked after.
struct Parked {
    hold: Arc<DriverHold>,
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
}

impl ParkedHolds {
    /// Parks `hold`, unless a hold of its lock is parked already.
    pub(crate) fn park(&self, hold: &Arc<DriverHold>) -> bool {
        match self.holds.entry(hold.lock.keys().id().clone()) {
            dashmap::Entry::Vacant(entry) => {
                entry.insert(Parked {
                    hold: hold.clone(),
                    successor: None,
                    releasing: false,
                    followers: Vec::new(),
                });
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

    /// The hold's release task starts: takes the successor, if one asked. None when `hold` is
    /// no longer parked, or its release was started by its successor.
    pub(crate) fn start(&self, hold: &Arc<DriverHold>) -> Option<Option<TakeOver>> {
        let mut parked = self.holds.get_mut(hold.lock.keys().id().as_ref())?;
        if !Arc::ptr_eq(&parked.hold, hold) || parked.releasing {
            return None;
        }
        parked.releasing = true;
        Some(parked.successor.take())
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
        Some(parked.hold.clone())
    }

    /// The release of `hold` is done: it is no longer parked, and its followers ask Redis.
    pub(crate) fn finish(&self, hold: &Arc<DriverHold>) {
        let removed = self
            .holds
            .remove_if(hold.lock.keys().id().as_ref(), |_, parked| {
                Arc::ptr_eq(&parked.hold, hold)
            });
        if let Some((_, parked)) = removed {
            for follower in parked.followers {
                let _ = follower.send(Ok(Released::Yes {
                    remaining: 0,
                    successor: Successor::Passed,
                }));
            }
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
