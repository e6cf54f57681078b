//! What a run prints: one block per cell while it runs, then the tables, the exit status and
//! (with `--markdown`) the page of [`crate::markdown`].

use std::fmt::Write as _;
use std::process::{Command, ExitCode};
use std::time::Duration;

use fredlock::NotificationMode;

use crate::markdown;
use crate::options::Options;
use crate::scenario::Scenario;
use crate::stats::{KindReport, KindStats};
use crate::support::redis_server_bin;

/// The numbers of one scenario in one notification mode.
pub struct CellReport {
    pub scenario: Scenario,
    pub mode: NotificationMode,
    pub lease: Duration,
    pub faults: String,
    pub workers_started: usize,
    /// Workers killed because they did not finish in time, or that exited without reporting.
    pub hung: usize,
    pub kinds: Vec<KindReport>,
}

impl CellReport {
    /// `scenario/mode/lock` for each lock type, with its numbers.
    pub fn rows(&self) -> impl Iterator<Item = (String, &KindReport)> + '_ {
        self.kinds.iter().map(move |k| {
            let label = format!(
                "{}/{}/{}",
                self.scenario.name(),
                self.mode.as_str(),
                k.kind.name()
            );
            (label, k)
        })
    }
}

pub fn print_cell(cell: &CellReport) {
    println!("   faults: {}", cell.faults);
    for k in &cell.kinds {
        let r = &k.resource;
        let w = &k.workers;
        println!(
            "   {:<13} sections={} violations={} stale={} overlaps={} lost={} \
             max_wait={}ms waits>lease={} errors(oom/other)={}/{} unlock_failed={} {}",
            k.kind.name(),
            r.accepted,
            r.violations,
            r.stale,
            r.overlaps,
            w.lost,
            w.max_wait_ms,
            w.waits_over_lease + w.unfinished_over_lease,
            w.oom_errors,
            w.lock_errors,
            w.unlock_errors + w.unlock_not_held,
            if k.safe(cell.hung) { "ok" } else { "UNSAFE" }
        );
        if cell.scenario.data_loss() {
            println!(
                "   {:<13} late writes refused={} accepted={} holds across a loss={} \
                 (lost() fired={} survived={} vanished unreported={}) lost() after back max={}ms \
                 causes: {}",
                "",
                r.late_refused,
                r.late_accepted,
                w.across_loss,
                w.across_reported,
                w.across_survived,
                w.across_unreported,
                w.max_lost_after_back_ms,
                w.causes()
            );
        }
    }
}

/// A table with a row per cell and lock type: scenario, mode and lock, then `columns`.
fn kind_table<'a>(
    header: &str,
    cells: impl Iterator<Item = &'a CellReport>,
    columns: impl Fn(&CellReport, &KindReport) -> Vec<String>,
) -> String {
    let mut out = String::from(header);
    for cell in cells {
        for k in &cell.kinds {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                cell.scenario.name(),
                cell.mode.as_str(),
                k.kind.name(),
                columns(cell, k).join(" | ")
            );
        }
    }
    out
}

fn yes_no(ok: bool) -> String {
    (if ok { "yes" } else { "**NO**" }).to_owned()
}

pub fn results_table(reports: &[CellReport]) -> String {
    let header = "| Scenario | Mode | Lock | Sections | Violations | Stale rejected | Overlaps \
         | Lost | Longest wait (ms) | Waits > lease (+ still waiting at the end) \
         | lock() errors OOM / other \
         | unlock() failed | Safe |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    kind_table(header, reports.iter(), |cell, k| {
        let (r, w) = (&k.resource, &k.workers);
        vec![
            r.accepted.to_string(),
            (r.violations + r.duplicates).to_string(),
            r.stale.to_string(),
            r.overlaps.to_string(),
            w.lost.to_string(),
            w.max_wait_ms.to_string(),
            long_waits(w),
            format!("{} / {}", w.oom_errors, w.lock_errors),
            (w.unlock_errors + w.unlock_not_held).to_string(),
            yes_no(k.safe(cell.hung)),
        ]
    })
}

/// `n`, or `n (+m)` when `m` calls were still waiting at the end after more than a lease.
fn long_waits(w: &KindStats) -> String {
    if w.unfinished_over_lease > 0 {
        format!("{} (+{})", w.waits_over_lease, w.unfinished_over_lease)
    } else {
        w.waits_over_lease.to_string()
    }
}

/// The data-loss scenarios' own numbers; empty when none ran.
pub fn data_loss_table(reports: &[CellReport]) -> String {
    if !reports.iter().any(|c| c.scenario.data_loss()) {
        return String::new();
    }
    let header = "| Scenario | Mode | Lock | Sections | Violations / overlaps \
         | Late writes refused | Late writes accepted | Holds across a loss \
         | lost() fired / survived / vanished unreported | lost() after server back, max (ms) \
         | lost() causes (all guards) | Longest wait (ms) | Met |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n";
    let cells = reports.iter().filter(|c| c.scenario.data_loss());
    kind_table(header, cells, |cell, k| {
        let (r, w) = (&k.resource, &k.workers);
        vec![
            r.accepted.to_string(),
            format!("{} / {}", r.violations + r.duplicates, r.overlaps),
            r.late_refused.to_string(),
            r.late_accepted.to_string(),
            w.across_loss.to_string(),
            format!(
                "{} / {} / {}",
                w.across_reported, w.across_survived, w.across_unreported
            ),
            w.max_lost_after_back_ms.to_string(),
            w.causes(),
            w.max_wait_ms.to_string(),
            yes_no(k.loss_reported(cell.hung)),
        ]
    })
}

pub fn faults_table(reports: &[CellReport]) -> String {
    let mut out = String::from(
        "| Scenario | Mode | Lease | Worker processes | Faults injected |\n|---|---|---:|---:|---|\n",
    );
    for cell in reports {
        let _ = writeln!(
            out,
            "| {} | {} | {} s | {}{} | {} |",
            cell.scenario.name(),
            cell.mode.as_str(),
            cell.lease.as_secs_f32(),
            cell.workers_started,
            if cell.hung > 0 {
                format!(" ({} hung or crashed)", cell.hung)
            } else {
                String::new()
            },
            cell.faults
        );
    }
    out
}

/// Prints the tables, writes the page, and says whether every safety check held.
pub fn finish(
    reports: &[CellReport],
    options: &Options,
    machine: &str,
    elapsed: Duration,
) -> ExitCode {
    println!("\n{}\n{}", results_table(reports), faults_table(reports));
    let loss = data_loss_table(reports);
    if !loss.is_empty() {
        println!("{loss}");
    }
    if let Some(path) = &options.markdown {
        let doc = markdown::render(reports, machine, elapsed, options);
        if let Err(err) = std::fs::write(path, doc) {
            eprintln!("cannot write {path}: {err}");
            return ExitCode::FAILURE;
        }
        println!("wrote {path}");
    }
    let safe = reports
        .iter()
        .all(|cell| cell.kinds.iter().all(|k| k.safe(cell.hung)));
    println!(
        "{} in {:.0?}",
        if safe {
            "all safety checks passed"
        } else {
            "SAFETY CHECK FAILED"
        },
        elapsed
    );
    if safe {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub fn machine_description() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let redis = Command::new(redis_server_bin())
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|f| f.strip_prefix("v="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{cpus} CPUs (nproc), {model}, Redis {redis}")
}
