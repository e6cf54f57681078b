//! Local hand-over (barging mutex, `docs/design.md` §4.3): a release hands the lock straight to
//! a task of its own process that waits for it.
//!
//! The release first claims a local waiter ([`WaiterTable::claim_handover`]); its script then
//! takes the hold for that waiter while it frees the lock, and on the reply the releaser
//! delivers the token ([`Claim::deliver`]), so the waiter returns from `lock()` without a
//! script call. Releaser and waiter run concurrently, and the waiting acquisition may go away at
//! any moment (timeout, cancellation), so each waiter carries a small state machine
//! ([`Handover`]) that settles who releases a hold that was handed over and never taken up:
//!
//! ```text
//!          claim            deliver
//!   Open ─────────► Claimed ────────► Done
//!     ▲                │
//!     └──── cancel ────┘
//!   any state but Taken ── abandon ──► Gone
//!   any state ── taken ──► Taken
//! ```
//!
//! * `abandon` that leaves `Done`: the hold was handed over and the waiter is going; the waiter
//!   releases it.
//! * `deliver` that finds `Gone`: the waiter went away after the claim; the releaser releases
//!   what it handed over.
//! * `taken` (the acquisition completed, by the hand-over or by its own attempt, which finds
//!   the handed hold its own by its waiter id): nobody releases anything, and a `deliver` that
//!   arrives afterwards still counts as delivered.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::waiters::{Registration, Waiter, WaiterTable, WOKEN};
use crate::lease::RedisHold;

/// What a waiting acquisition asks for, so that a release in its own process can hand it the
/// lock directly (barging mutex, see [`WaiterTable::claim_handover`]).
#[derive(Debug, Clone)]
pub(crate) struct Bid {
    /// The owner the hold would be taken for.
    pub(crate) owner: crate::owner::Owner,
    /// The lease the acquisition asks for.
    pub(crate) lease: Duration,
    /// The acquisition asks by the release call itself (a take-over,
    /// `crate::engine::release`): if the lock goes to the queue instead, the call queues it
    /// there.
    pub(crate) joins_queue: bool,
}

/// A hold that a release in this process handed to a waiter.
#[derive(Debug, Clone)]
pub(crate) struct HandedOver {
    pub(crate) token: u64,
    /// When the release that handed it over was sent: the hold began after that.
    pub(crate) at: tokio::time::Instant,
    /// About how many waiters stayed queued in Redis behind the hand-over (0: none).
    pub(crate) queued: u32,
    /// None of them is due for a grant before this long after `at` (see
    /// `crate::engine::Successor::HandedOver`); None: unknown.
    pub(crate) quiet: Option<Duration>,
    /// Handed over without a call (`crate::engine::cohort`): how long the hold lasts from
    /// `at`, and the hold in Redis it stands on. None: a release script wrote the hold in the
    /// waiter's name, for its full lease.
    pub(crate) within: Option<(Duration, RedisHold)>,
}

/// Hand-over states of a waiter (see [`WaiterTable::claim_handover`]), stored as a `u8` in
/// [`Handover`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum State {
    /// No release is handing it the lock.
    Open = 0,
    /// A release in flight may hand the lock to this waiter.
    Claimed = 1,
    /// The release handed it the lock ([`Handover::handed`] is set).
    Done = 2,
    /// The acquisition went away; a hand-over that arrives now is the releaser's to undo.
    Gone = 3,
    /// The acquisition completed (by the hand-over or by its own attempt).
    Taken = 4,
}

impl State {
    fn from_u8(state: u8) -> State {
        match state {
            0 => State::Open,
            1 => State::Claimed,
            2 => State::Done,
            3 => State::Gone,
            4 => State::Taken,
            _ => unreachable!("a hand-over state is only ever stored from a State"),
        }
    }
}

/// A waiter's hand-over: its [`State`] and the hold a release of this process handed it.
pub(super) struct Handover {
    state: AtomicU8,
    /// Since when (µs on [`clock_us`]) the waiter waits for a release of this process to hand
    /// it the lock: since it registered, or since such a release last handed the lock to
    /// another waiter of the lock. Releases let their own task take the lock straight back
    /// (barging) until it has waited a while (see [`WaiterTable::handover_due`]).
    since: AtomicU64,
    /// Boxed: set only for the waiters a release hands the lock to, and every waiting task
    /// keeps a `Handover` (see `docs/benchmarks.md`, S4).
    handed: OnceLock<Box<HandedOver>>,
}

impl Handover {
    pub(super) fn new() -> Self {
        Handover {
            state: AtomicU8::new(State::Open as u8),
            since: AtomicU64::new(clock_us()),
            handed: OnceLock::new(),
        }
    }

    /// Moves from `from` to `to` if the state is `from`; otherwise returns the state it is in.
    fn transition(&self, from: State, to: State) -> Result<(), State> {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(State::from_u8)
    }
}

impl WaiterTable {
    /// Picks the first local waiter of `lock_id` that may be handed the lock by a release of
    /// this process: it has a bid with another owner than the releaser's, has not been woken
    /// and is not claimed by another release. The claim holds until the release answers
    /// ([`Claim::deliver`] or [`Claim::cancel`]).
    pub(crate) fn claim_handover(&self, lock_id: &str, releaser: &str) -> Option<Claim> {
        let queue = self.queues.get(lock_id)?;
        let waiter = queue.iter().find(|w| {
            w.may_take_over_from(releaser)
                && w.handover.transition(State::Open, State::Claimed).is_ok()
        })?;
        // The claimed waiter's turn begins: the others' patience counts from here.
        let now = clock_us();
        for other in queue.iter() {
            other.handover.since.store(now, Ordering::Relaxed);
        }
        Some(Claim {
            waiter: waiter.clone(),
        })
    }

    /// When the earliest lease ends of the holds of `lock_id` that a release of this process is
    /// handing (a claim in flight: at the latest a lease from now) or handed to a waiter
    /// bidding for another owner than `owner`, and that the waiter has not taken up yet. Such a
    /// hold is this client's, as one in the hold registry is, but it is not in the registry
    /// until its waiter's task runs; an acquisition that asks in that window may wait behind it
    /// as it would behind a registered one: its release hands the lock on or wakes the local
    /// waiters, and so do a release in flight that hands it to nobody and the release of a
    /// hold never taken up.
    pub(crate) fn handing_to_other(&self, lock_id: &str, owner: &str) -> Option<Instant> {
        let queue = self.queues.get(lock_id)?;
        queue
            .iter()
            .filter_map(|w| {
                let bid = w.bid.as_ref().filter(|bid| bid.owner.id() != owner)?;
                match State::from_u8(w.handover.state.load(Ordering::Acquire)) {
                    State::Claimed => Some(Instant::now() + bid.lease),
                    State::Done => w.handover.handed.get().map(|handed| {
                        handed.at
                            + handed
                                .within
                                .as_ref()
                                .map_or(bid.lease, |(lasts, _)| *lasts)
                    }),
                    State::Open | State::Gone | State::Taken => None,
                }
            })
            .min()
    }

    /// Whether a release by `releaser` would find a local waiter of `lock_id` to claim (None:
    /// it would not), and whether one of them has waited `patience` for it: since it began to
    /// wait, or since a release of this process last handed the lock to another of them. Until
    /// then the releasing task may take the lock straight back; after, the release hands it on.
    pub(crate) fn handover_due(
        &self,
        lock_id: &str,
        releaser: &str,
        patience: Duration,
    ) -> Option<bool> {
        let queue = self.queues.get(lock_id)?;
        let patience = u64::try_from(patience.as_micros()).unwrap_or(u64::MAX);
        let now = clock_us();
        queue
            .iter()
            .filter(|w| {
                w.may_take_over_from(releaser)
                    && State::from_u8(w.handover.state.load(Ordering::Acquire)) == State::Open
            })
            .map(|w| now.saturating_sub(w.handover.since.load(Ordering::Relaxed)) >= patience)
            .reduce(|a, b| a || b)
    }
}

/// Microseconds since this process first asked (a monotonic clock; tokio's, so that tests
/// with a paused clock see it advance with theirs).
fn clock_us() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(Instant::now().saturating_duration_since(base).as_micros()).unwrap_or(u64::MAX)
}

impl Waiter {
    /// Idle, named, and bidding for another owner than `releaser`.
    fn may_take_over_from(&self, releaser: &str) -> bool {
        self.is_idle()
            && self.name.is_some()
            && self
                .bid
                .as_ref()
                .is_some_and(|bid| bid.owner.id() != releaser)
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
        let within = handed.within.is_some();
        let _ = self.waiter.handover.handed.set(Box::new(handed));
        match self.waiter.handover.transition(State::Claimed, State::Done) {
            Ok(()) => {
                self.waiter.wake(WOKEN);
                true
            }
            // Its own attempt already found the hold its own (answered by its waiter id). A
            // hold handed over without a call is in nobody's name in Redis: it is the caller's.
            Err(State::Taken) => !within,
            Err(_) => false,
        }
    }

    /// No hand-over happened (or it is unknown whether it did: `recheck` wakes the waiter, whose
    /// next attempt finds out).
    pub(crate) fn cancel(self, recheck: bool) {
        let reopened = self
            .waiter
            .handover
            .transition(State::Claimed, State::Open)
            .is_ok();
        if reopened && recheck {
            self.waiter.wake(WOKEN);
        }
    }
}

/// The waiter's side of the hand-over.
impl Registration {
    /// The hold a release of this process handed to this waiter, if one did.
    pub(crate) fn handed(&self) -> Option<HandedOver> {
        let handover = &self.waiter.handover;
        if State::from_u8(handover.state.load(Ordering::Acquire)) == State::Done {
            handover
                .handed
                .get()
                .map(|handed| HandedOver::clone(handed))
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
        self.waiter
            .handover
            .state
            .store(State::Taken as u8, Ordering::Release);
    }

    /// The acquisition is going away without the lock: a release that claimed this waiter
    /// will undo its hand-over itself. Returns the hold already handed over and never taken
    /// up, which the caller must release.
    pub(crate) fn abandon(&self) -> Option<HandedOver> {
        let handover = &self.waiter.handover;
        // An acquisition that completed stays Taken: a release still in flight that claimed it
        // must not mistake it for gone (and release what it holds).
        let previous = handover
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (State::from_u8(state) != State::Taken).then_some(State::Gone as u8)
            })
            .map(State::from_u8);
        match previous {
            Ok(State::Done) => handover
                .handed
                .get()
                .map(|handed| HandedOver::clone(handed)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::Owner;

    fn bidder(table: &Arc<WaiterTable>, owner: &Owner) -> Registration {
        let bid = Bid {
            owner: owner.clone(),
            lease: Duration::from_secs(1),
            joins_queue: false,
        };
        table.register(&"mutex:a".into(), Some("w1".into()), Some(bid))
    }

    fn handed() -> HandedOver {
        HandedOver {
            queued: 0,
            quiet: None,
            token: 7,
            at: tokio::time::Instant::now(),
            within: None,
        }
    }

    #[test]
    fn states_round_trip_through_u8() {
        for state in [
            State::Open,
            State::Claimed,
            State::Done,
            State::Gone,
            State::Taken,
        ] {
            assert_eq!(State::from_u8(state as u8), state);
        }
    }

    #[tokio::test]
    async fn a_delivered_hold_wakes_the_waiter_and_is_its_own_to_release_if_it_goes() {
        let table = WaiterTable::new();
        let waiter = bidder(&table, &Owner::new());
        let claim = table.claim_handover("mutex:a", "releaser").expect("claim");
        assert!(
            table.claim_handover("mutex:a", "other").is_none(),
            "one claim at a time"
        );
        assert_eq!(claim.bid().0, "w1");
        assert!(claim.deliver(handed()));
        assert_eq!(waiter.handed().map(|h| h.token), Some(7));
        assert!(waiter.wait(Duration::from_millis(1)).await);
        assert_eq!(waiter.abandon().map(|h| h.token), Some(7));
    }

    #[test]
    fn a_waiter_gone_after_the_claim_leaves_the_hold_to_the_releaser() {
        let table = WaiterTable::new();
        let waiter = bidder(&table, &Owner::new());
        let claim = table.claim_handover("mutex:a", "releaser").expect("claim");
        assert!(waiter.abandon().is_none());
        assert!(!claim.deliver(handed()), "the releaser releases it");
        assert!(waiter.handed().is_none());
    }

    #[test]
    fn a_completed_acquisition_is_released_by_neither_side() {
        let table = WaiterTable::new();
        let waiter = bidder(&table, &Owner::new());
        let claim = table.claim_handover("mutex:a", "releaser").expect("claim");
        waiter.taken();
        assert!(claim.deliver(handed()), "its own attempt found the hold");
        assert!(waiter.abandon().is_none());
    }

    #[test]
    fn a_hand_over_in_flight_or_not_taken_up_counts_as_a_hold_of_this_client() {
        let table = WaiterTable::new();
        let owner = Owner::new();
        let waiter = bidder(&table, &owner);
        let asking = "another acquisition";
        assert_eq!(table.handing_to_other("mutex:a", asking), None, "open");
        let claim = table.claim_handover("mutex:a", "releaser").expect("claim");
        let in_flight = table.handing_to_other("mutex:a", asking).expect("claimed");
        assert!(in_flight > tokio::time::Instant::now());
        assert_eq!(
            table.handing_to_other("mutex:a", owner.id()),
            None,
            "not for the owner the hold would be taken for"
        );
        let handed = handed();
        assert!(claim.deliver(handed.clone()));
        assert_eq!(
            table.handing_to_other("mutex:a", asking),
            Some(handed.at + Duration::from_secs(1)),
            "handed over: until the bid's lease ends"
        );
        waiter.taken();
        assert_eq!(table.handing_to_other("mutex:a", asking), None, "taken up");
    }

    #[test]
    fn a_cancelled_claim_reopens_and_no_release_hands_to_its_own_owner() {
        let table = WaiterTable::new();
        let owner = Owner::new();
        let _waiter = bidder(&table, &owner);
        assert!(table.claim_handover("mutex:a", owner.id()).is_none());
        let claim = table.claim_handover("mutex:a", "releaser").expect("claim");
        claim.cancel(false);
        assert!(table.claim_handover("mutex:a", "releaser").is_some());
    }
}
