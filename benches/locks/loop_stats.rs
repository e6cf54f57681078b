//! The figures of a contended loop (see [`crate::loops`]), computed from the acquisitions
//! every worker recorded.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};

use crate::measure::{histogram, round, round2, PingBracket, Summary};
use crate::redis::CommandStats;
use crate::workers::{Record, WorkerReport};

/// A wait this long on a lock held for microseconds at a time means a lost wakeup (the waiter
/// re-checked only when the lease it had been told about ran out).
pub const STALL_US: u64 = 1_000_000;

/// Two arrivals (`lock()` calls) closer than this are taken as simultaneous by the FIFO check:
/// which of them reached Redis first is not known to the bench.
pub const INVERSION_MARGIN_US: u64 = 1_000;

/// The measurement window in wall-clock µs: tasks start `lock()` calls in [go, end).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub go: u64,
    pub end: u64,
}

/// CPU time (user + system, µs) used in the window by the worker processes (`/proc/<pid>/stat`)
/// and by the server (`INFO cpu`).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSample {
    pub workers_us: u64,
    pub redis_us: u64,
}

impl CpuSample {
    pub fn since(&self, earlier: &CpuSample) -> CpuSample {
        CpuSample {
            workers_us: self.workers_us.saturating_sub(earlier.workers_us),
            redis_us: self.redis_us.saturating_sub(earlier.redis_us),
        }
    }
}

/// A looping scenario's figures.
pub struct LoopResult {
    /// Reference: PINGs before and after the scenario together.
    pub ping: Summary,
    pub ping_before: Summary,
    pub ping_after: Summary,
    /// Every acquisition, including the drain after the window.
    pub acquisitions: u64,
    /// Acquisitions inside the window.
    pub in_window: u64,
    /// Writes (`GET` + `SET` critical sections) among them.
    pub writes_in_window: u64,
    /// `in_window` per second of the window.
    pub acq_per_s: f64,
    /// Reads and writes among all acquisitions.
    pub reads: u64,
    pub writes: u64,
    /// Time from the end of the window until the last task released.
    pub drain_s: f64,
    pub handoff_other: Summary,
    pub handoff_same: Summary,
    pub same_share: f64,
    /// Every acquisition's wait (from calling `lock()` until it returned), drain included.
    pub wait: Summary,
    pub wait_read: Summary,
    pub wait_write: Summary,
    /// The longest wait among the acquisitions made inside the window.
    pub longest_wait_in_window_us: u64,
    /// The longest wait among the acquisitions inside the window whose `lock()` call came after
    /// the ramp-up ([`ramp_up_end`]): the steady state, without the start instant's crowd.
    pub longest_wait_steady_us: u64,
    /// Pairs of acquisitions where the later arrival (by more than [`INVERSION_MARGIN_US`])
    /// acquired first (see [`inversions`]), among the `lock()` calls made once every task had
    /// acquired the lock once (see [`ramp_up_end`]): the lock's own ordering.
    pub inversions: u64,
    /// The same over every acquisition, the ramp-up's included.
    pub inversions_all: u64,
    /// Acquisitions that waited longer than [`STALL_US`].
    pub stalls: u64,
    pub per_task_min: u64,
    pub per_task_max: u64,
    /// Holds that overlapped a write hold (or, for exclusive locks, any other hold).
    pub overlaps: u64,
    pub counter: i64,
    pub unlock_errors: u64,
    pub wakeups: u64,
    /// CPU used by the workers and the redis-server during the window.
    pub cpu: CpuSample,
    pub window_s: f64,
    /// Redis command statistics during the window.
    pub commands: CommandStats,
}

impl LoopResult {
    pub fn throughput_ratio(&self) -> f64 {
        self.acq_per_s * self.ping.p50 * 1e-6
    }

    /// CPU µs per acquisition in the window of (workers, redis-server).
    pub fn cpu_per_acquisition(&self) -> (f64, f64) {
        let n = self.in_window.max(1) as f64;
        (self.cpu.workers_us as f64 / n, self.cpu.redis_us as f64 / n)
    }

    /// Redis commands per acquisition in the window (calls inside scripts included; `INFO` and
    /// the critical sections' `GET` and `SET` excluded).
    pub fn commands_per_acquisition(&self) -> f64 {
        let total = self.commands.total_calls(&["info"]);
        let sections = self.in_window + self.writes_in_window;
        total.saturating_sub(sections) as f64 / self.in_window.max(1) as f64
    }

    /// Share of the machine's CPU capacity used by workers and redis-server in the window.
    pub fn machine_busy(&self) -> f64 {
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let used = (self.cpu.workers_us + self.cpu.redis_us) as f64;
        used / (self.window_s.max(1e-9) * 1e6 * nproc)
    }

    pub fn wakeups_per_acquisition(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.wakeups as f64 / self.acquisitions as f64
        }
    }

    /// The final counter differs from the number of increments (writes).
    pub fn counter_mismatch(&self) -> bool {
        self.counter != self.writes as i64
    }

    pub fn violations(&self) -> u64 {
        self.overlaps + u64::from(self.counter_mismatch())
    }

    pub fn json(&self) -> Json {
        let (workers_cpu, redis_cpu) = self.cpu_per_acquisition();
        json!({
            "ping": self.ping.json(),
            "ping_before": self.ping_before.json(),
            "ping_after": self.ping_after.json(),
            "acquisitions": self.acquisitions,
            "acquisitions_in_window": self.in_window,
            "reads": self.reads,
            "writes": self.writes,
            "acq_per_s": round2(self.acq_per_s),
            "acq_per_s_times_ping_p50": round(self.throughput_ratio(), 4),
            "drain_s": round(self.drain_s, 3),
            "cpu_us_per_acquisition_workers": round2(workers_cpu),
            "cpu_us_per_acquisition_redis": round2(redis_cpu),
            "commands_per_acquisition": round(self.commands_per_acquisition(), 2),
            "fifo_inversions": self.inversions,
            "fifo_inversions_with_ramp_up": self.inversions_all,
            "machine_busy": round(self.machine_busy(), 3),
            "redis_commands_per_acquisition": self.commands.json(self.in_window),
            "handoff_other": self.handoff_other.json(),
            "handoff_other_per_ping": self.handoff_other.json_per_ping(self.ping.p50),
            "handoff_same": self.handoff_same.json(),
            "same_task_share": round(self.same_share, 4),
            "wait": self.wait.json(),
            "wait_read": self.wait_read.json(),
            "wait_write": self.wait_write.json(),
            "longest_wait_us": self.wait.max,
            "longest_wait_in_window_us": self.longest_wait_in_window_us,
            "longest_wait_after_ramp_up_us": self.longest_wait_steady_us,
            "waits_over_1s": self.stalls,
            "per_task_min": self.per_task_min,
            "per_task_max": self.per_task_max,
            "overlaps": self.overlaps,
            "counter": self.counter,
            "counter_mismatch": self.counter_mismatch(),
            "unlock_errors": self.unlock_errors,
            "wakeups": self.wakeups,
            "wakeups_per_acquisition": round(self.wakeups_per_acquisition(), 3),
        })
    }
}

/// Merges the workers' records and computes every figure. Throughput counts the acquisitions
/// made inside the window; everything else uses every acquisition, including those of tasks
/// that were still waiting when the window closed (the drain).
pub fn analyze(
    pings: PingBracket,
    window: Window,
    reports: Vec<WorkerReport>,
    counter: i64,
    cpu: CpuSample,
) -> LoopResult {
    let wakeups = reports.iter().map(|r| r.wakeups).sum();
    let mut records: Vec<Record> = reports.into_iter().flat_map(|r| r.records).collect();
    records.sort_by_key(|r| (r.acquire, r.release));
    let acquisitions = records.len() as u64;
    let reads = records.iter().filter(|r| r.read).count() as u64;
    let in_window = records.iter().filter(|r| r.acquire < window.end).count() as u64;
    let window_s = window.end.saturating_sub(window.go) as f64 / 1e6;
    let last_done = records.iter().map(|r| r.done).max().unwrap_or(window.end);
    let (handoff_other, handoff_same, same) = handoffs(&records);
    let (per_task_min, per_task_max) = per_task_range(&records);
    let (mut wait, mut wait_read, mut wait_write) = (histogram(), histogram(), histogram());
    let ramp_up = ramp_up_end(&records);
    let (mut longest_in_window, mut longest_steady) = (0, 0);
    for record in &records {
        let waited = record.acquire.saturating_sub(record.start).max(1);
        wait.saturating_record(waited);
        if record.read {
            wait_read.saturating_record(waited);
        } else {
            wait_write.saturating_record(waited);
        }
        if record.acquire < window.end {
            longest_in_window = longest_in_window.max(waited);
            if record.start >= ramp_up {
                longest_steady = longest_steady.max(waited);
            }
        }
    }
    LoopResult {
        ping: pings.both,
        ping_before: pings.before,
        ping_after: pings.after,
        acquisitions,
        in_window,
        writes_in_window: records
            .iter()
            .filter(|r| r.acquire < window.end && !r.read)
            .count() as u64,
        acq_per_s: in_window as f64 / window_s,
        reads,
        writes: acquisitions - reads,
        drain_s: last_done.saturating_sub(window.end) as f64 / 1e6,
        handoff_other: Summary::of(&handoff_other, 1.0),
        handoff_same: Summary::of(&handoff_same, 1.0),
        same_share: if acquisitions > 1 {
            same as f64 / (acquisitions - 1) as f64
        } else {
            0.0
        },
        wait: Summary::of(&wait, 1.0),
        wait_read: Summary::of(&wait_read, 1.0),
        wait_write: Summary::of(&wait_write, 1.0),
        longest_wait_in_window_us: longest_in_window,
        longest_wait_steady_us: longest_steady,
        inversions: inversions(&records, ramp_up),
        inversions_all: inversions(&records, 0),
        stalls: records
            .iter()
            .filter(|r| r.acquire.saturating_sub(r.start) > STALL_US)
            .count() as u64,
        per_task_min,
        per_task_max,
        overlaps: overlaps(&records),
        counter,
        unlock_errors: records.iter().filter(|r| !r.unlock_ok).count() as u64,
        wakeups,
        cpu,
        window_s,
        commands: CommandStats::default(),
    }
}

/// Handoff gaps (next acquire − previous release, µs) to another task and to the same task,
/// and the number of same-task handoffs. `records` must be sorted by acquire time.
pub fn handoffs(records: &[Record]) -> (Histogram<u64>, Histogram<u64>, u64) {
    let (mut other, mut same_hist, mut same) = (histogram(), histogram(), 0);
    for pair in records.windows(2) {
        let gap = pair[1].acquire.saturating_sub(pair[0].release).max(1);
        if pair[0].task == pair[1].task {
            same += 1;
            same_hist.saturating_record(gap);
        } else {
            other.saturating_record(gap);
        }
    }
    (other, same_hist, same)
}

/// Acquisitions that broke the lock's rule: a write hold that began while any hold was active,
/// or a read hold that began while a write hold was active. Sweep over [acquire, release]
/// intervals; at equal times releases come first (the next holder's acquire can only follow the
/// previous release).
pub fn overlaps(records: &[Record]) -> u64 {
    // (time, 0 = release / 1 = acquire, read)
    let mut events: Vec<(u64, u8, bool)> = Vec::with_capacity(records.len() * 2);
    for r in records {
        events.push((r.acquire, 1, r.read));
        events.push((r.release, 0, r.read));
    }
    events.sort_unstable();
    let (mut readers, mut writers, mut count) = (0i64, 0i64, 0);
    for (_, what, read) in events {
        match (what, read) {
            (1, true) => {
                if writers > 0 {
                    count += 1;
                }
                readers += 1;
            }
            (1, false) => {
                if writers > 0 || readers > 0 {
                    count += 1;
                }
                writers += 1;
            }
            (_, true) => readers -= 1,
            (_, false) => writers -= 1,
        }
    }
    count
}

/// Fewest and most acquisitions of any task.
pub fn per_task_range(records: &[Record]) -> (u64, u64) {
    let mut counts = BTreeMap::new();
    for record in records {
        *counts.entry(record.task).or_insert(0u64) += 1;
    }
    let min = counts.values().copied().min().unwrap_or(0);
    let max = counts.values().copied().max().unwrap_or(0);
    (min, max)
}

/// When every task had acquired the lock once (wall-clock µs; 0 without records): the end of
/// the ramp-up. Before it, the tasks' first `lock()` calls share one instant (`GO`), and the
/// order in which they reach Redis, which is the order a fair lock serves, is the OS
/// scheduler's: with many processes on few CPUs, a call made first can reach Redis several
/// milliseconds after calls made later. After it, each task calls again when its own hold ends.
pub fn ramp_up_end(records: &[Record]) -> u64 {
    let mut first: BTreeMap<u64, u64> = BTreeMap::new();
    for record in records {
        let at = first.entry(record.task).or_insert(record.acquire);
        *at = (*at).min(record.acquire);
    }
    first.into_values().max().unwrap_or(0)
}

/// FIFO inversions: pairs (a, b) where b called `lock()` more than [`INVERSION_MARGIN_US`]
/// after a, while a was waiting, and acquired before a, among the calls made at `since` or
/// later. `records` must be sorted by acquire time. Counted with a Fenwick tree over the
/// arrival times of those acquired so far.
pub fn inversions(records: &[Record], since: u64) -> u64 {
    let records: Vec<&Record> = records.iter().filter(|r| r.start >= since).collect();
    let mut starts: Vec<u64> = records.iter().map(|r| r.start).collect();
    starts.sort_unstable();
    let mut tree = vec![0u64; starts.len() + 1];
    let mut count = 0;
    for (seen, record) in records.iter().enumerate() {
        // Earlier acquisitions that arrived more than the margin after this one did.
        let cut = starts.partition_point(|&s| s <= record.start + INVERSION_MARGIN_US);
        let (mut at, mut not_later) = (cut, 0);
        while at > 0 {
            not_later += tree[at];
            at &= at - 1;
        }
        count += seen as u64 - not_later;
        let mut at = starts.partition_point(|&s| s < record.start) + 1;
        while at < tree.len() {
            tree[at] += 1;
            at += at & at.wrapping_neg();
        }
    }
    count
}
