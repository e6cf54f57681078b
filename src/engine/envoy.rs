//! One envoy per process in a lock's Redis queue: of the tasks of this client that wait for a
//! barging [`crate::Mutex`] (or an [`crate::RwLock`]'s write side) held by another client,
//! only one asks Redis and queues there; the others wait behind it, in the process.
//!
//! Why: a hold that reaches this process passes from task to task without a call
//! ([`cohort`](super::cohort)), but only to a task that is not queued in Redis: a queued
//! task's place can only be taken out of the queue by a script, so each hand-over to one cost
//! a release script (about seven commands) and its join another. With every waiting task
//! queued, four processes of four tasks each paid a third of a script per acquisition for
//! hand-overs that changed nothing another client could see. With an envoy, a process joins
//! the queue once per turn, and its turn is one grant followed by hand-overs without a call.
//!
//! * **Who.** Waiting acquisitions of handles without an [`Owner`](crate::Owner), the ones a
//!   hand-over without a call may serve. An acquisition with an owner asks Redis itself: it
//!   may re-enter a hold of its owner that another task of the process holds.
//! * **Waiting behind the envoy.** At most a second past the end of the holder's lease as
//!   the envoy last heard of it, or the caller's patience: then the task asks Redis itself. The envoy's
//!   grant brings the lock to this process, and its release hands it on to the next task or
//!   wakes the tasks to ask.
//! * **The envoy leaves** (timeout, cancellation, error, or a hold it could not take up): it
//!   gives up its place and wakes the local waiters that have none in the Redis queue; the
//!   first of them to ask becomes the next envoy.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Driver;
use crate::context::Table;
use crate::error::Result;

/// How long past the envoy's holder bound the tasks behind it wait before they ask Redis
/// themselves (a fallback: the envoy's own attempt or its departure comes first).
const BOUND_GRACE: Duration = Duration::from_secs(1);

/// The envoys of this client, by lock id: the waiter id of the acquisition that asks Redis
/// for the lock, and until when the holder it last heard of may keep it (None: its first
/// attempt is in flight).
#[derive(Default)]
pub(crate) struct Envoys {
    slots: Table<Arc<str>, (Arc<str>, Option<Instant>)>,
}

impl Envoys {
    /// Makes `waiter` the envoy of `lock_id` if nobody is: Ok when it is now (or was),
    /// Err with the current envoy's holder bound otherwise.
    fn claim(
        &self,
        lock_id: &Arc<str>,
        waiter: &Arc<str>,
    ) -> std::result::Result<(), Option<Instant>> {
        let entry = self
            .slots
            .entry(lock_id.clone())
            .or_insert_with(|| (waiter.clone(), None));
        if entry.0 == *waiter {
            Ok(())
        } else {
            Err(entry.1)
        }
    }

    /// The envoy `waiter` heard that the holder may keep the lock until `until`.
    fn heard(&self, lock_id: &str, waiter: &Arc<str>, until: Instant) {
        if let Some(mut entry) = self.slots.get_mut(lock_id) {
            if entry.0 == *waiter {
                entry.1 = Some(until);
            }
        }
    }

    /// `waiter` gives up its place, if it holds it.
    fn leave(&self, lock_id: &str, waiter: &Arc<str>) {
        self.slots
            .remove_if(lock_id, |_, (envoy, _)| envoy == waiter);
    }

    /// Number of locks with an envoy.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

/// One waiting acquisition's side of the envoy rule; dropping it gives up the place, and
/// wakes the next local waiter unless the lock came to this process.
pub(super) struct EnvoyTurn<'a> {
    driver: &'a Arc<dyn Driver>,
    waiter: &'a Arc<str>,
    /// Whether the rule applies to this acquisition (see the module docs).
    eligible: bool,
    /// Whether it is the envoy.
    envoy: bool,
    /// Whether the lock came to this process (the acquisition got it).
    arrived: bool,
}

impl<'a> EnvoyTurn<'a> {
    pub(super) fn new(driver: &'a Arc<dyn Driver>, waiter: &'a Arc<str>, eligible: bool) -> Self {
        EnvoyTurn {
            driver,
            waiter,
            eligible,
            envoy: false,
            arrived: false,
        }
    }

    /// Before an attempt: None when this acquisition asks Redis (it is the envoy, or the rule
    /// does not apply, or the envoy's bound passed), else how long to wait behind the envoy:
    /// at most a second past the end of the holder's lease the envoy last heard of (a
    /// watchdog lease from now if it heard nothing yet), capped by `patience_left`. A zero
    /// wait means ask.
    pub(super) fn wait_behind(
        &mut self,
        patience_left: impl FnOnce(Duration) -> Option<Duration>,
    ) -> Option<Duration> {
        if !self.eligible {
            return None;
        }
        let envoys = &self.driver.engine().envoys;
        match envoys.claim(self.driver.keys().id(), self.waiter) {
            Ok(()) => {
                self.envoy = true;
                None
            }
            Err(until) => {
                // A grace past the envoy's bound: the envoy asks again only a ttl after its
                // reply arrived, a little after the bound it heard.
                let fallback = self.driver.engine().ctx.config.watchdog_lease;
                let bound = until.map_or(fallback, |until| {
                    (until + BOUND_GRACE).saturating_duration_since(Instant::now())
                });
                patience_left(bound).filter(|limit| !limit.is_zero())
            }
        }
    }

    /// A take-over queued this acquisition in Redis, with the holder's bound `ttl` from
    /// `sent_at`: it is the envoy now, unless another waiter is.
    pub(super) fn queued_by_take_over(&mut self, sent_at: Instant, ttl: Duration) {
        if self.eligible {
            let envoys = &self.driver.engine().envoys;
            self.envoy = envoys.claim(self.driver.keys().id(), self.waiter).is_ok();
            self.heard(sent_at, ttl);
        }
    }

    /// A busy attempt heard that the holder may keep the lock `ttl` from `sent_at`.
    pub(super) fn heard(&self, sent_at: Instant, ttl: Duration) {
        if self.envoy {
            let envoys = &self.driver.engine().envoys;
            envoys.heard(self.driver.keys().id(), self.waiter, sent_at + ttl);
        }
    }

    /// The acquisition's outcome, passed through: when it holds the lock, the lock came to
    /// this process, and its release hands it on to the local waiters or wakes them, so
    /// leaving wakes nobody. (A hold that could not be taken up, say for want of replica
    /// acknowledgements, was released without a word to them: leaving wakes them.)
    pub(super) fn settled<T>(&mut self, outcome: Result<Option<T>>) -> Result<Option<T>> {
        self.arrived = matches!(outcome, Ok(Some(_)));
        outcome
    }
}

impl Drop for EnvoyTurn<'_> {
    fn drop(&mut self) {
        if !self.envoy {
            return;
        }
        let engine = self.driver.engine();
        let lock_id = self.driver.keys().id();
        engine.envoys.leave(lock_id, self.waiter);
        if !self.arrived {
            // Every local waiter without a place in the Redis queue: the first of them that
            // may be an envoy takes the place (the first idle one may be a reader of a
            // read-write lock, or a task with an owner, which asks for itself alone).
            tracing::trace!(
                lock = self.driver.keys().name(),
                "envoy left; waking the others"
            );
            let queued = &engine.queued;
            engine
                .waiters
                .wake_unqueued(lock_id, |id| queued.contains(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn the_first_claim_wins_and_others_see_its_bound() {
        let envoys = Envoys::default();
        let (lock, a, b) = (id("l"), id("a"), id("b"));
        assert_eq!(envoys.claim(&lock, &a), Ok(()));
        assert_eq!(envoys.claim(&lock, &a), Ok(()), "a claim is repeatable");
        assert_eq!(envoys.claim(&lock, &b), Err(None));
        let until = Instant::now() + Duration::from_secs(3);
        envoys.heard(&lock, &b, until);
        assert_eq!(
            envoys.claim(&lock, &b),
            Err(None),
            "only the envoy's bound counts"
        );
        envoys.heard(&lock, &a, until);
        assert_eq!(envoys.claim(&lock, &b), Err(Some(until)));
    }

    #[test]
    fn only_the_envoy_gives_up_the_place() {
        let envoys = Envoys::default();
        let (lock, a, b) = (id("l"), id("a"), id("b"));
        assert_eq!(envoys.claim(&lock, &a), Ok(()));
        envoys.leave(&lock, &b);
        assert_eq!(envoys.len(), 1);
        envoys.leave(&lock, &a);
        assert_eq!(envoys.len(), 0);
        assert_eq!(envoys.claim(&lock, &b), Ok(()));
    }
}
