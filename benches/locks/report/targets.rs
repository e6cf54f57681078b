//! The targets of the benchmark scenarios and of the issues, and whether this run met them.

use fredlock::NotificationMode;

use crate::measure::{ms, ratio};
use crate::peers::LockKind;
use crate::run::Report;
use crate::s4::S4Case;
use crate::s6::S6Run;
use crate::s7::{
    flatness, S7Result, S7Row, FAIR_COMMANDS, FAIR_LONGEST_WAIT_US, FAIR_THROUGHPUT_SHARE,
    MUTEX_COMMANDS, MUTEX_LONGEST_WAIT_US,
};

/// One target: its scenario, its wording, and per mode (value, met).
pub struct TargetRow {
    pub scenario: &'static str,
    pub label: String,
    pub cells: Vec<(NotificationMode, String, bool)>,
}

impl TargetRow {
    pub fn new(scenario: &'static str, label: impl Into<String>) -> TargetRow {
        TargetRow {
            scenario,
            label: label.into(),
            cells: Vec::new(),
        }
    }

    pub fn cell(mut self, mode: NotificationMode, value: String, met: bool) -> TargetRow {
        self.cells.push((mode, value, met));
        self
    }
}

/// Builds one row with a cell per mode from `f(result) -> (value, met)`.
pub fn row<T>(
    scenario: &'static str,
    label: &str,
    results: &[(NotificationMode, T)],
    f: impl Fn(&T) -> (String, bool),
) -> Option<TargetRow> {
    if results.is_empty() {
        return None;
    }
    let mut row = TargetRow::new(scenario, label);
    for (mode, result) in results {
        let (value, met) = f(result);
        row = row.cell(*mode, value, met);
    }
    Some(row)
}

/// The targets of the scenarios and of the benchmark issues.
pub fn targets(report: &Report) -> Vec<TargetRow> {
    let mut rows: Vec<Option<TargetRow>> =
        vec![row("s1", "cycle p50 ≤ 2.1 × PING", &report.s1, |s1| {
            let r = ratio(s1.cycle.p50, s1.ping.p50);
            (format!("{r:.2}"), r <= 2.1)
        })];
    if report.s1.iter().any(|(_, s1)| s1.over_naive().is_some()) {
        rows.push(row(
            "s1",
            "cycle p50 ≤ 1.05 × the naive SET NX PX cycle's p50",
            &report.s1,
            |s1| match s1.over_naive() {
                Some(r) => (format!("{r:.2}"), r <= 1.05),
                None => ("–".into(), false),
            },
        ));
    }
    rows.push(row(
        "s1",
        "unlock() p50 ≤ 1.2 × PING p50 (no waiters)",
        &report.s1,
        |s1| {
            let r = ratio(s1.unlock.p50, s1.ping.p50);
            (format!("{r:.2}"), r <= 1.2)
        },
    ));
    let best_peer = report
        .s2_peers
        .iter()
        .map(|(_, r)| r.acq_per_s)
        .reduce(f64::max);
    if let Some(best) = best_peer {
        rows.push(row(
            "s2",
            "Mutex acq/s ≥ the best peer's",
            &report.s2,
            |r| {
                (
                    format!("{:.0} vs {best:.0}", r.acq_per_s),
                    r.acq_per_s >= best,
                )
            },
        ));
    }
    for (name, list) in [("s2", &report.s2), ("s2-fair", &report.s2_fair)] {
        if name == "s2" {
            rows.push(row(name, "acq/s × PING p50 ≥ 0.30", list, |r| {
                (
                    format!("{:.3}", r.throughput_ratio()),
                    r.throughput_ratio() >= 0.30,
                )
            }));
        }
        rows.push(row(
            name,
            "handoff to another task p50 ≤ 2.5 × PING",
            list,
            |r| {
                let x = ratio(r.handoff_other.p50, r.ping.p50);
                (format!("{x:.2}"), x <= 2.5)
            },
        ));
        if name == "s2" {
            rows.push(row(
                name,
                "handoff to another task p99 ≤ 10 × PING",
                list,
                |r| {
                    let x = ratio(r.handoff_other.p99, r.ping.p50);
                    (format!("{x:.2}"), x <= 10.0)
                },
            ));
        }
        rows.push(row(
            name,
            "violations (overlaps + lost updates) = 0",
            list,
            |r| (r.violations().to_string(), r.violations() == 0),
        ));
    }
    rows.push(row(
        "s3",
        "fair lock inversions vs arrival = 0",
        &report.s3,
        |r| {
            let (inv, pairs, _) = r.inversions(LockKind::Fair);
            (format!("{inv} of {pairs}"), inv == 0)
        },
    ));
    rows.push(row("s3", "violations = 0", &report.s3, |r| {
        let v = r.violations(LockKind::Fair) + r.violations(LockKind::Mutex);
        (v.to_string(), v == 0)
    }));
    rows.push(row(
        "fair-handoff",
        "gap p50 with 1000 queued ≤ 2 × with 10 queued",
        &report.handoff,
        |r| match r.growth() {
            Some(g) => (format!("{g:.2}×"), g <= 2.0),
            None => ("n/a".into(), false),
        },
    ));
    rows.push(row(
        "rw",
        "RwLock ops/s ≥ Mutex ops/s, same mix (expected; no SPEC figure)",
        &report.rw,
        |r| (format!("{:.2}×", r.speedup()), r.speedup() >= 1.0),
    ));
    rows.push(row(
        "rw",
        "no RwLock wait > 1 s (a lost wakeup; holds last µs)",
        &report.rw,
        |r| (r.rwlock.stalls.to_string(), r.rwlock.stalls == 0),
    ));
    rows.push(row("rw", "violations = 0", &report.rw, |r| {
        let v = r.rwlock.violations() + r.mutex.violations();
        (v.to_string(), v == 0)
    }));
    rows.push(row(
        "s4",
        "waiting client ≤ 3 connections (standalone)",
        &report.s4,
        |r| {
            let worst = r
                .cases
                .iter()
                .map(S4Case::waiting_client_connections)
                .fold(0.0, f64::max);
            let text = r
                .cases
                .iter()
                .map(|c| format!("{}: {}", c.waiters(), c.waiting_client_connections()))
                .collect::<Vec<_>>()
                .join(", ");
            (text, worst <= 3.0)
        },
    ));
    rows.push(row("s4", "RSS ≤ 2 KiB per waiter", &report.s4, |r| {
        let text = r
            .cases
            .iter()
            .map(|c| format!("{}: {:.0} B", c.waiters(), c.rss_per_waiter()))
            .collect::<Vec<_>>()
            .join(", ");
        // The largest case decides: small cases are dominated by page granularity.
        let decisive = r
            .cases
            .iter()
            .max_by(|a, b| a.waiters().total_cmp(&b.waiters()))
            .map_or(f64::NAN, S4Case::rss_per_waiter);
        (text, decisive <= 2048.0)
    }));
    if let Some(s5) = &report.s5 {
        let mut row = TargetRow::new("s5", "stream p50 ≤ 1.2 × pubsub p50");
        let (value, met) = match s5.stream_over_pubsub() {
            Some(r) => (format!("{r:.2}×"), r <= 1.2),
            None => ("n/a (needs both modes)".into(), false),
        };
        for m in &s5.modes {
            row = row.cell(m.mode, value.clone(), met);
        }
        rows.push(Some(row));
        let mut row = TargetRow::new("s5", "wake-up p50 ≤ 2 × the idle PING p50");
        for m in &s5.modes {
            let r = ratio(m.latency.p50, m.ping_idle.p50);
            row = row.cell(m.mode, format!("{r:.2}×"), r <= 2.0);
        }
        rows.push(Some(row));
        let mut row = TargetRow::new(
            "s5",
            "holder's unlock() p50 ≤ 1.2 × PING p50 (waiters queued)",
        );
        for m in &s5.modes {
            let r = ratio(m.unlock.p50, m.ping_hot.p50);
            row = row.cell(m.mode, format!("{r:.2}×"), r <= 1.2);
        }
        rows.push(Some(row));
        let mut row = TargetRow::new("s5", "mutual exclusion (overlaps = 0)");
        for m in &s5.modes {
            row = row.cell(m.mode, m.overlaps.to_string(), m.overlaps == 0);
        }
        rows.push(Some(row));
    }
    for distinct in [false, true] {
        let label = if distinct {
            "100 locks: all 100 acquired ≤ 1 s after release + reconnect delay"
        } else {
            "one lock: all 100 acquired ≤ 1 s after release + reconnect delay"
        };
        rows.push(row("s6", label, &report.s6, |r| {
            let runs: Vec<&S6Run> = r.runs.iter().filter(|x| x.distinct == distinct).collect();
            let met = runs.iter().filter(|x| x.met()).count();
            let worst = runs.iter().filter_map(|x| x.last()).max();
            let text = format!(
                "{met} of {} runs; slowest: all in {}",
                runs.len(),
                worst.map_or_else(|| "–".to_owned(), |d| format!("{:.0} ms", ms(d)))
            );
            (text, !runs.is_empty() && met == runs.len())
        }));
    }
    if let Some(s7) = &report.s7 {
        rows.extend(s7_targets(s7).into_iter().map(Some));
    }
    rows.into_iter().flatten().collect()
}

/// A row's Redis CPU per acquisition against the best peer's of its shape.
fn redis_cpu_versus_best(s7: &S7Result, r: &S7Row) -> (String, bool) {
    let ours = r.result.cpu_per_acquisition().1;
    match s7.best_peer_redis_cpu(r.shape) {
        Some(best) => (format!("{ours:.0} vs {best:.0} µs"), ours <= best),
        None => (format!("{ours:.0} µs, no peer"), false),
    }
}

/// The S7 targets of issue #15, per mode; every shape must meet each.
fn s7_targets(s7: &S7Result) -> Vec<TargetRow> {
    type Check = fn(&S7Result, &S7Row) -> (String, bool);
    let checks: [(LockKind, &str, Check); 14] = [
        (
            LockKind::Mutex,
            "Mutex Redis commands / acq ≤ 8",
            |_, r| commands_at_most(r, MUTEX_COMMANDS),
        ),
        (
            LockKind::Mutex,
            "Mutex Redis CPU / acq ≤ best peer's",
            |s7, r| redis_cpu_versus_best(s7, r),
        ),
        (LockKind::Mutex, "Mutex acq/s ≥ best peer's", |s7, r| {
            versus_best(s7, r, 1.0)
        }),
        (LockKind::Mutex, "Mutex longest wait ≤ 100 ms", |_, r| {
            longest_wait(r, MUTEX_LONGEST_WAIT_US)
        }),
        (
            LockKind::Fair,
            "FairMutex Redis commands / acq ≤ 10",
            |_, r| commands_at_most(r, FAIR_COMMANDS),
        ),
        (
            LockKind::Fair,
            "FairMutex acq/s ≥ 0.8 × best peer's (FIFO floor: token ring)",
            |s7, r| {
                let (text, met) = versus_best(s7, r, FAIR_THROUGHPUT_SHARE);
                match s7.fifo_floor_throughput(r.shape) {
                    Some(floor) => (format!("{text} (floor {floor:.0})"), met),
                    None => (text, met),
                }
            },
        ),
        (
            LockKind::Fair,
            "FairMutex longest wait ≤ 20 ms (FIFO floor: token ring)",
            |s7, r| {
                let (text, met) = longest_wait(r, FAIR_LONGEST_WAIT_US);
                match s7.fifo_floor_longest_wait_us(r.shape) {
                    Some(floor) => (format!("{text} (floor {:.1} ms)", floor / 1e3), met),
                    None => (text, met),
                }
            },
        ),
        (
            LockKind::Fair,
            "FairMutex FIFO inversions = 0 (after the ramp-up)",
            |_, r| (r.result.inversions.to_string(), r.result.inversions == 0),
        ),
        (LockKind::Mutex, "Mutex violations = 0", |_, r| {
            let v = r.result.violations();
            (v.to_string(), v == 0)
        }),
        (
            LockKind::RwLock,
            "RwLock write: Redis commands / acq ≤ the Mutex budget (8)",
            |_, r| commands_at_most(r, MUTEX_COMMANDS),
        ),
        (
            LockKind::RwLock,
            "RwLock write: Redis CPU / acq ≤ best peer's (the Mutex budget)",
            |s7, r| redis_cpu_versus_best(s7, r),
        ),
        (
            LockKind::RwLock,
            "RwLock write: acq/s ≥ best peer's (the Mutex budget)",
            |s7, r| versus_best(s7, r, 1.0),
        ),
        (
            LockKind::RwLock,
            "RwLock write: longest wait ≤ 100 ms (the Mutex budget)",
            |_, r| longest_wait(r, MUTEX_LONGEST_WAIT_US),
        ),
        (LockKind::RwLock, "RwLock violations = 0", |_, r| {
            let v = r.result.violations();
            (v.to_string(), v == 0)
        }),
    ];
    let modes: Vec<NotificationMode> = {
        let mut modes: Vec<NotificationMode> = Vec::new();
        for mode in s7.rows.iter().filter_map(|r| r.mode) {
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        modes
    };
    let mut out = Vec::new();
    for (kind, label, check) in checks {
        let mut target = TargetRow::new("s7", label);
        for &mode in &modes {
            let rows = s7.rows_of(kind, mode);
            if rows.is_empty() {
                continue;
            }
            let results: Vec<(String, bool)> = rows
                .iter()
                .map(|r| {
                    let (value, met) = check(s7, r);
                    (format!("{}: {value}", r.shape.label()), met)
                })
                .collect();
            let text = results
                .iter()
                .map(|(v, _)| v.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            target = target.cell(mode, text, results.iter().all(|(_, met)| *met));
        }
        if !target.cells.is_empty() {
            out.push(target);
        }
    }
    let mut flat = TargetRow::new("s7", "Mutex flat from the fewest to the most processes");
    for &mode in &modes {
        if let Some((text, met)) = flatness(&s7.rows_of(LockKind::Mutex, mode)) {
            flat = flat.cell(mode, text, met);
        }
    }
    if !flat.cells.is_empty() {
        out.push(flat);
    }
    out
}

/// acq/s against `share` × the best peer's at the same shape.
fn versus_best(s7: &S7Result, r: &S7Row, share: f64) -> (String, bool) {
    let ours = r.result.acq_per_s;
    match s7.best_peer_throughput(r.shape) {
        Some(best) => (format!("{ours:.0} vs {best:.0}"), ours >= share * best),
        None => (format!("{ours:.0}, no peer"), false),
    }
}

fn commands_at_most(r: &S7Row, limit: f64) -> (String, bool) {
    let c = r.result.commands_per_acquisition();
    (format!("{c:.1}"), c <= limit)
}

/// The longest wait of the acquisitions made inside the window (see `crate::s7`).
fn longest_wait(r: &S7Row, limit_us: f64) -> (String, bool) {
    let max = r.result.longest_wait_in_window_us as f64;
    (format!("{:.1} ms", max / 1e3), max <= limit_us)
}
