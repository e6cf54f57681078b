//! What the workers observe (sent to the parent as JSON lines) and the checks on it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::resource::ResourceCounts;
use crate::scenario::LockKind;

/// What one worker observed for one lock type (cumulative).
#[derive(Serialize, Deserialize, Default, Clone, Debug)]
#[serde(default)]
pub struct KindStats {
    /// Successful `lock()` calls.
    pub acquisitions: u64,
    /// Critical sections whose commit the resource accepted.
    pub sections: u64,
    /// Enters or commits the resource refused as stale.
    pub stale: u64,
    /// Stale refusals whose guard did not report `lost()` within three leases.
    pub stale_not_lost: u64,
    /// Guards that reported `lost()` by the end of their critical section.
    pub lost: u64,
    /// The same, by cause (the `LostCause` variant).
    pub lost_causes: BTreeMap<String, u64>,
    /// `lock()` calls that failed with `Error::OutOfMemory` / any other error.
    pub oom_errors: u64,
    pub lock_errors: u64,
    /// `unlock()` that found the hold gone / that failed.
    pub unlock_not_held: u64,
    pub unlock_errors: u64,
    /// Failed calls to the resource server (should never happen).
    pub resource_errors: u64,
    /// Longest single `lock()` wait, and how many waits took longer than the lease.
    pub max_wait_ms: u64,
    pub waits_over_lease: u64,
    /// `lock()` calls still waiting at the end of the run after more than one lease.
    pub unfinished_over_lease: u64,
    /// Data-loss scenarios: holds that were held across a loss of the lock server's data …
    pub across_loss: u64,
    /// … of which `lost()` fired within [`crate::worker::LOSS_WINDOW`] of the server being back,
    pub across_reported: u64,
    /// … were still held after that window (`unlock()` succeeded: the hold survived),
    pub across_survived: u64,
    /// … or had vanished without `lost()` firing in time (`unlock()` failed).
    pub across_unreported: u64,
    /// Longest time from the server being back to `lost()` firing (0: it fired before).
    pub max_lost_after_back_ms: u64,
    /// A few distinct error messages and lost causes, for the report.
    pub samples: Vec<String>,
}

pub const MAX_SAMPLES: usize = 6;

impl KindStats {
    pub fn sample(&mut self, text: String) {
        if self.samples.len() < MAX_SAMPLES && !self.samples.contains(&text) {
            self.samples.push(text);
        }
    }

    pub fn merge(&mut self, other: &KindStats) {
        self.acquisitions += other.acquisitions;
        self.sections += other.sections;
        self.stale += other.stale;
        self.stale_not_lost += other.stale_not_lost;
        self.lost += other.lost;
        for (cause, n) in &other.lost_causes {
            *self.lost_causes.entry(cause.clone()).or_default() += n;
        }
        self.oom_errors += other.oom_errors;
        self.lock_errors += other.lock_errors;
        self.unlock_not_held += other.unlock_not_held;
        self.unlock_errors += other.unlock_errors;
        self.resource_errors += other.resource_errors;
        self.max_wait_ms = self.max_wait_ms.max(other.max_wait_ms);
        self.waits_over_lease += other.waits_over_lease;
        self.unfinished_over_lease += other.unfinished_over_lease;
        self.across_loss += other.across_loss;
        self.across_reported += other.across_reported;
        self.across_survived += other.across_survived;
        self.across_unreported += other.across_unreported;
        self.max_lost_after_back_ms = self
            .max_lost_after_back_ms
            .max(other.max_lost_after_back_ms);
        for sample in &other.samples {
            self.sample(sample.clone());
        }
    }

    /// `lost()` causes as `KeyDeleted 3, Expired 1`.
    pub fn causes(&self) -> String {
        let parts: Vec<String> = self
            .lost_causes
            .iter()
            .map(|(cause, n)| format!("{cause} {n}"))
            .collect();
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// Per lock type, keyed by [`LockKind::id`].
pub type WorkerStats = BTreeMap<String, KindStats>;

/// The resource's and the workers' numbers of one lock type in one cell.
pub struct KindReport {
    pub kind: LockKind,
    pub resource: ResourceCounts,
    pub workers: KindStats,
}

impl KindReport {
    /// The safety properties: no accepted lost update, no shared token, exact counter, no
    /// late write accepted, every refused holder told through `lost()`.
    pub fn safe(&self, hung: usize) -> bool {
        let r = &self.resource;
        r.violations == 0
            && r.duplicates == 0
            && r.counter == r.accepted
            && r.late_accepted == 0
            && self.workers.stale_not_lost == 0
            && self.workers.resource_errors == 0
            && hung == 0
    }

    /// The data-loss requirement: safe (so no late write accepted, and no holder refused
    /// without being told: the fencing tokens kept increasing), and every hold that vanished
    /// was reported by `lost()` within a second of the server being back.
    pub fn loss_reported(&self, hung: usize) -> bool {
        self.safe(hung)
            && self.workers.across_unreported == 0
            && self.workers.max_lost_after_back_ms <= 1000
    }
}
