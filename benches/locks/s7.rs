//! S7, scale: the S2 loop (see [`crate::loops`]) at several shapes, processes × tasks per
//! process (`--s7-shapes`, default 4×4, 16×1, 64×1), for every lock of `--s7-locks`: fredlock
//! `Mutex`, `FairMutex` and the write side of `RwLock` in every mode, and the peers (naive,
//! rslock) once. `--s7-seconds` (3; 1.5 with `--quick`) per row.
//!
//! Rounds: the machine's speed moves by a factor of two within minutes on a shared 2-CPU
//! host, so one window per row would compare the locks of a shape at different moments. Every
//! row of a shape runs `--s7-rounds` times (3; 1 with `--quick`), the rows in turn (round 1 of
//! every lock, then round 2 ...), and the report gives each row's median run by
//! acquisitions/s, all of that run's figures together, with the spread of the rounds beside
//! it. The targets judge the median runs.
//!
//! Per row: acquisitions/s, Redis commands per acquisition (`INFO commandstats` deltas over
//! the window, calls inside scripts included, `INFO` and the critical section's `GET` + `SET`
//! excluded), Redis CPU per acquisition (`INFO cpu` used_cpu_sys + used_cpu_user delta),
//! client CPU per acquisition (the worker processes' utime + stime from `/proc/<pid>/stat`),
//! wait p50/p99, the longest wait, violations and FIFO inversions, each beside the row's PING
//! p50. The longest wait is reported twice: among the acquisitions made inside the window
//! (what the targets judge), and among all, the drain after the window included. Every
//! worker stops asking at the window's end and shuts its client down, so the waits that end
//! after it overlap the other workers' teardown (64 processes closing connections on 2 CPUs)
//! rather than the load the row measures.

use fredlock::NotificationMode;
use serde_json::{json, Value as Json};

use crate::loop_stats::LoopResult;
use crate::loops::{run_loop, subject, LoopSpec};
use crate::options::Shape;
use crate::peers::LockKind;
use crate::run::ModeCtx;

/// `Mutex` targets (issue #15): commands per acquisition, longest wait (µs).
pub const MUTEX_COMMANDS: f64 = 8.0;
pub const MUTEX_LONGEST_WAIT_US: f64 = 100_000.0;
/// `FairMutex` targets: commands per acquisition, longest wait (µs), share of the best peer's
/// acquisitions/s.
pub const FAIR_COMMANDS: f64 = 10.0;
pub const FAIR_LONGEST_WAIT_US: f64 = 20_000.0;
pub const FAIR_THROUGHPUT_SHARE: f64 = 0.8;
/// "Flat in the number of processes": acquisitions/s at the most processes at least this share
/// of those at the fewest, and commands per acquisition at most this factor of theirs.
pub const FLAT_THROUGHPUT_SHARE: f64 = 0.8;
pub const FLAT_COMMANDS_FACTOR: f64 = 1.2;

/// One S7 row.
pub struct S7Row {
    pub shape: Shape,
    pub kind: LockKind,
    /// `None` for the peers.
    pub mode: Option<NotificationMode>,
    /// The median round (by acquisitions/s).
    pub result: LoopResult,
    /// Acquisitions/s of every round, in round order.
    pub round_rates: Vec<f64>,
}

impl S7Row {
    pub fn subject(&self) -> String {
        subject(self.kind, self.mode.unwrap_or(NotificationMode::Stream))
    }

    pub fn json(&self) -> Json {
        json!({
            "shape": self.shape.label(),
            "processes": self.shape.processes,
            "tasks": self.shape.tasks,
            "lock": self.kind.name(),
            "mode": self.mode.map(NotificationMode::as_str),
            "result": self.result.json(),
            "round_acq_per_s": self.round_rates,
        })
    }
}

pub struct S7Result {
    pub seconds: f64,
    pub rounds: usize,
    pub rows: Vec<S7Row>,
}

impl S7Result {
    /// The rows of one lock in one mode, in shape order.
    pub fn rows_of(&self, kind: LockKind, mode: NotificationMode) -> Vec<&S7Row> {
        self.rows
            .iter()
            .filter(|r| r.kind == kind && (r.mode == Some(mode) || r.mode.is_none()))
            .collect()
    }

    fn peers_at(&self, shape: Shape) -> impl Iterator<Item = &LoopResult> {
        self.rows
            .iter()
            .filter(move |r| r.shape == shape && r.kind.is_peer())
            .map(|r| &r.result)
    }

    /// The best peer's acquisitions/s at `shape`.
    pub fn best_peer_throughput(&self, shape: Shape) -> Option<f64> {
        self.peers_at(shape).map(|r| r.acq_per_s).reduce(f64::max)
    }

    /// The FIFO floor's acquisitions/s at `shape` (`crate::ring`), when it ran.
    pub fn fifo_floor_throughput(&self, shape: Shape) -> Option<f64> {
        self.fifo_floor(shape).map(|r| r.result.acq_per_s)
    }

    /// The FIFO floor's longest wait in the window at `shape` (µs), if it ran.
    pub fn fifo_floor_longest_wait_us(&self, shape: Shape) -> Option<f64> {
        self.fifo_floor(shape)
            .map(|r| r.result.longest_wait_in_window_us as f64)
    }

    /// The FIFO floor's row at `shape`, if it ran.
    fn fifo_floor(&self, shape: Shape) -> Option<&S7Row> {
        self.rows
            .iter()
            .find(|r| r.shape == shape && r.kind == LockKind::Ring)
    }

    /// The best (lowest) peer Redis CPU µs per acquisition at `shape`.
    pub fn best_peer_redis_cpu(&self, shape: Shape) -> Option<f64> {
        self.peers_at(shape)
            .map(|r| r.cpu_per_acquisition().1)
            .reduce(f64::min)
    }

    pub fn json(&self) -> Json {
        json!({
            "seconds": self.seconds,
            "rounds": self.rounds,
            "rows": self.rows.iter().map(S7Row::json).collect::<Vec<_>>(),
        })
    }
}

/// Whether `rows` (one lock, one mode, in shape order) stay flat from the fewest processes to
/// the most: (text, met).
pub fn flatness(rows: &[&S7Row]) -> Option<(String, bool)> {
    let fewest = rows.iter().min_by_key(|r| r.shape.processes)?;
    let most = rows.iter().max_by_key(|r| r.shape.processes)?;
    if fewest.shape.processes == most.shape.processes {
        return None;
    }
    let throughput = most.result.acq_per_s / fewest.result.acq_per_s.max(1e-9);
    let commands =
        most.result.commands_per_acquisition() / fewest.result.commands_per_acquisition().max(1e-9);
    Some((
        format!(
            "{} → {}: acq/s {throughput:.2}×, commands/acq {commands:.2}×",
            fewest.shape.label(),
            most.shape.label()
        ),
        throughput >= FLAT_THROUGHPUT_SHARE && commands <= FLAT_COMMANDS_FACTOR,
    ))
}

pub async fn run_s7(ctxs: &[ModeCtx<'_>]) -> Result<S7Result, String> {
    let Some(first) = ctxs.first() else {
        return Err("no mode selected".into());
    };
    let args = first.args;
    let mut rows = Vec::new();
    for &shape in &args.s7_shapes {
        // (kind, ctx) of every row of the shape; the peers and the FIFO floor run once, not
        // once per mode.
        let subjects: Vec<(LockKind, &ModeCtx<'_>)> = args
            .s7_locks
            .iter()
            .flat_map(|&kind| {
                let ctxs = if kind.runs_once() {
                    std::slice::from_ref(first)
                } else {
                    ctxs
                };
                ctxs.iter().map(move |ctx| (kind, ctx))
            })
            .collect();
        let mut runs: Vec<Vec<LoopResult>> = subjects.iter().map(|_| Vec::new()).collect();
        for _round in 0..args.s7_rounds {
            for (&(kind, ctx), runs) in subjects.iter().zip(&mut runs) {
                runs.push(run_loop(ctx, &spec(shape, kind, args.s7_seconds)).await?);
            }
        }
        for ((kind, ctx), runs) in subjects.into_iter().zip(runs) {
            let round_rates = runs.iter().map(|r| r.acq_per_s).collect();
            rows.push(S7Row {
                shape,
                kind,
                mode: (!kind.runs_once()).then_some(ctx.mode),
                result: median_run(runs)?,
                round_rates,
            });
        }
    }
    Ok(S7Result {
        seconds: args.s7_seconds,
        rounds: args.s7_rounds,
        rows,
    })
}

fn spec(shape: Shape, kind: LockKind, seconds: f64) -> LoopSpec {
    LoopSpec {
        label: format!("s7 {} {}", shape.label(), kind.name()),
        lock: kind,
        name: format!(
            "bench-s7-{}-{}x{}",
            kind.name(),
            shape.processes,
            shape.tasks
        ),
        read_share: 0.0,
        processes: shape.processes,
        tasks: shape.tasks,
        seconds,
    }
}

/// The run with the median acquisitions/s (of an even count, the lower of the two middle
/// ones).
fn median_run(mut runs: Vec<LoopResult>) -> Result<LoopResult, String> {
    runs.sort_by(|a, b| a.acq_per_s.total_cmp(&b.acq_per_s));
    let middle = runs.len().saturating_sub(1) / 2;
    runs.into_iter()
        .nth(middle)
        .ok_or_else(|| "s7: a row ran no round".to_owned())
}
