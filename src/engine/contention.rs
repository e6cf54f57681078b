//! Which locks this client has seen contended lately: it picks each exclusive lock's first
//! script call.
//!
//! An uncontended take or release of an exclusive lock needs little of what its full script
//! does (the wait queue, grants, hand-overs, the fence key), so each has a fast path of its
//! own (`lua/hold_take.lua`, `lua/hold_free.lua`): about half the server's work of the full
//! script, with fewer arguments to send. The fast path answers "not mine" (and changes
//! nothing) when the lock turns out to be contended, and the full script runs next: one round
//! trip more. So the client takes the fast path only for locks it has not seen contended
//! lately, and these hints are that memory.
//!
//! A lock counts as contended for [`QUIET_AFTER`] after this client last saw it so: an attempt
//! found it busy, a release granted or handed it the lock, a take-over queued it, a release
//! was deferred (others wait), a waiter queued behind a hold of this client (a `held`
//! notice), or a fast path found it contended. The signals of the contended loop itself
//! (grants, take-overs, deferred releases) keep the hint fresh while a lock stays contended,
//! even when no acquisition of the client runs an acquire script of its own for a while: an
//! acquisition that took the fast path there would join a fair lock's queue one round trip
//! after it asked, behind waiters that asked later.
//!
//! The hints are a fixed table of slots indexed by a hash of the lock id, so they cost no
//! memory per lock and never need cleaning: two locks that share a slot share their hint,
//! which at worst sends a quiet lock through its full script for a while. A hint only ever
//! chooses between two correct scripts.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How long a lock counts as contended after this client last saw it so.
pub(crate) const QUIET_AFTER: Duration = Duration::from_secs(1);

/// Slots of the table: a power of two.
const SLOTS: usize = 256;

/// The contention hints of one client (see the module docs).
pub(crate) struct ContentionHints {
    /// Per slot, when its locks were last seen contended, in ms since `epoch` plus one (0:
    /// never).
    seen: Box<[AtomicU64]>,
    epoch: Instant,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for ContentionHints {
    fn default() -> Self {
        ContentionHints {
            seen: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl ContentionHints {
    /// Records that the lock `lock_id` was seen contended now.
    pub(crate) fn contended(&self, lock_id: &str) {
        self.contended_at(lock_id, self.now_ms());
    }

    /// Whether the lock `lock_id` has not been seen contended for [`QUIET_AFTER`].
    pub(crate) fn quiet(&self, lock_id: &str) -> bool {
        self.quiet_at(lock_id, self.now_ms())
    }

    /// [`contended`](Self::contended) at `now` ms since the table's epoch.
    fn contended_at(&self, lock_id: &str, now: u64) {
        self.slot(lock_id).fetch_max(now + 1, Ordering::Relaxed);
    }

    /// [`quiet`](Self::quiet) at `now` ms since the table's epoch.
    fn quiet_at(&self, lock_id: &str, now: u64) -> bool {
        let seen = self.slot(lock_id).load(Ordering::Relaxed);
        seen == 0 || now + 1 >= seen + QUIET_AFTER.as_millis() as u64
    }

    fn slot(&self, lock_id: &str) -> &AtomicU64 {
        let mut hasher = self.hasher.build_hasher();
        hasher.write(lock_id.as_bytes());
        &self.seen[hasher.finish() as usize & (SLOTS - 1)]
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_is_quiet_until_seen_contended_and_again_a_while_after() {
        let hints = ContentionHints::default();
        let quiet_ms = QUIET_AFTER.as_millis() as u64;
        assert!(hints.quiet_at("mutex:a", 0));
        hints.contended_at("mutex:a", 0);
        assert!(!hints.quiet_at("mutex:a", 0));
        assert!(!hints.quiet_at("mutex:a", quiet_ms - 10));
        hints.contended_at("mutex:a", quiet_ms - 10);
        assert!(
            !hints.quiet_at("mutex:a", 2 * quiet_ms - 20),
            "seen again: quiet a full while later"
        );
        assert!(hints.quiet_at("mutex:a", 2 * quiet_ms - 10));
        // An older sighting does not move the hint back.
        hints.contended_at("mutex:a", 0);
        assert!(hints.quiet_at("mutex:a", 2 * quiet_ms - 10));
    }

    #[test]
    fn the_table_has_a_slot_for_every_lock_and_forgets_nothing_it_must_not() {
        let hints = ContentionHints::default();
        hints.contended_at("mutex:busy", 5);
        let quiet: Vec<String> = (0..1000)
            .map(|i| format!("mutex:{i}"))
            .filter(|id| hints.quiet_at(id, 5))
            .collect();
        assert!(
            quiet.len() >= 990,
            "one contended lock keeps few others from the fast path: {}",
            1000 - quiet.len()
        );
        assert!(!hints.quiet_at("mutex:busy", 5));
    }
}
