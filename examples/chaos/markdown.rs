//! `docs/reliability.md`: the current state only (date, machine, commit, how to reproduce, the
//! tables, and what they mean), all of it derived from the run.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use crate::options::Options;
use crate::report::{data_loss_table, faults_table, results_table, CellReport};
use crate::scenario::{LockKind, Scenario};
use crate::stats::KindReport;
use crate::worker::LOSS_WINDOW;

const METRICS: &str = "\
* **Sections**: critical sections whose commit the resource accepted.
* **Violations**: accepted commits that lost an update (the counter moved between the holder's \
  `enter` and its `commit`), plus entries by two holders with the same token. The resource \
  accepts a write only with a token at least as high as every token it has seen, so this \
  must be 0; it is the column that says whether fencing kept the data correct. The final \
  counter is also checked to equal the number of accepted commits.
* **Stale rejected**: enters or commits refused because a higher token had been seen: a \
  holder whose lease had run out (paused, or cut off from Redis) tried to write late. Every \
  such holder must also learn it through `LockGuard::lost()` within three leases (checked; \
  a miss makes the row unsafe).
* **Overlaps**: hand-offs during which an older holder was still inside its critical \
  section (each abandoned section counted once). They happen only when a lease expires \
  under a live or dead holder (SIGSTOP, SIGKILL, a server that lost the hold): this is the \
  mutual exclusion a lease alone cannot give, and why the tokens matter.
* **Lost**: guards whose `lost()` had fired by the end of their critical section.
* **Longest wait**: the longest single `lock()` / `write()` call that succeeded.
* **Waits > lease**: successful `lock()` calls that took longer than the lease; in \
  parentheses, calls still waiting at the end after more than a lease. With push wakeups a \
  waiter should only wait out a lease when the holder vanished without releasing (killed, \
  paused, a release that failed) or the queue ahead of it was long.
* **lock() errors**: acquisitions that failed with `Error::OutOfMemory` / another error; \
  the workers retry after 10-40 ms. A waiting `lock()` repeats an attempt that failed for a \
  transient reason (timeout, broken connection, a restarting server) itself, with the same \
  op id, for up to `Config::transient_retry` (30 s), so killed connections and restarts \
  show up here only when that runs out; `OOM` is not retried.
* **unlock() failed**: releases that returned `NotHeld` (the hold had expired or passed to \
  another owner; where no holder dies, it can also be a release that the Redis client sent \
  again after its connection broke, when the first send had already freed the lock and \
  another owner had taken it) or an error (the lock then frees itself when its lease ends).
* **Safe**: no violation, no duplicate token, exact counter, no late write accepted, every \
  refused holder told through `lost()`, no resource error, no worker hung.";

const LOSS_METRICS: &str = "\
* **Late writes**: writes by a holder whose hold was taken before a loss of the lock \
  server's data, made after a holder that acquired since the loss had reached the resource. \
  The resource knows the order from a loss epoch that the suite increments right before each \
  loss and that each holder reads at its first `enter`, so it does not depend on the tokens. \
  **Refused** is fencing doing its job; **accepted** means the newer holder's token was not \
  higher than the old one's (the fencing counter went back with the data) and the old \
  holder's write went through: a lost update waiting to happen.
* **Holds across a loss**: guards held when the data was lost (the loss epoch moved between \
  their `enter` and `commit`). Such a holder goes on writing every 50 ms, as a holder that \
  was not told would, until `lost()` fires or {window} s after the server is back; then it \
  unlocks. **lost() fired**: reported in that time; **survived**: `lost()` did not fire and \
  `unlock()` succeeded (the hold was still there, e.g. replicated before a failover); \
  **vanished unreported**: `lost()` did not fire and `unlock()` failed.
* **lost() after server back, max**: the longest time from the server being back (restart \
  answered `PING`, `FLUSHALL` returned, the sentinels named the new master) to `lost()` \
  firing on such a hold; 0 when it fired before (e.g. renewals failed while the master was \
  gone).
* **lost() causes**: every guard of the cell whose `lost()` had fired by its unlock, by \
  `LostCause`.
* **Met**: the data-loss requirement: the row is safe (no late write accepted; no holder \
  refused by the token check without being told through `lost()`, as happens when the \
  fencing counter goes back and a new holder's token is lower than an old one's), and \
  every hold that vanished was reported by `lost()` within 1 s of the server being back.";

/// Shown when `RwLock` writers waited out a lease although no holder died.
const RW_WAKEUP_NOTE: &str = "\
* **Unexpected `RwLock` write waits (liveness, not safety)**: writers waited out a lease \
  although no holder died. A release grants the lock to the writer at the head of the Redis \
  queue (rule `grant`) or to the readers there (one `grants` event per client), so a waiter \
  should not have to sleep out its wait bound here. Treat this as a regression and \
  look at the wake events (`RUST_LOG=fredlock=debug` in the workers).
";

pub fn render(
    reports: &[CellReport],
    machine: &str,
    elapsed: Duration,
    options: &Options,
) -> String {
    let mut doc = String::new();
    let _ = writeln!(
        doc,
        "# Reliability under fault injection\n\n\
         Generated by the chaos suite (`examples/chaos/`); do not edit by hand, re-run it \
         instead.\n\n\
         * Date: {} (UTC)\n\
         * Machine: {machine}\n\
         * Commit: {}\n\
         * Run time: {:.0} s; {} s per scenario and notification mode; {} worker processes x \
         {} tasks per lock type\n",
        crate::support::utc_date(),
        commit(),
        elapsed.as_secs_f64(),
        options.seconds,
        options.workers,
        options.tasks
    );
    let _ = writeln!(
        doc,
        "## How to reproduce\n\n\
         ```text\n{}\n```\n\n\
         It needs `redis-server` (7.0 here; `FREDLOCK_REDIS_SERVER=/path/to/redis-server` picks \
         another) and starts every server on a free loopback port in a temporary directory. \
         `--scenario NAME[,NAME]` runs some scenarios only (names below), `--modes stream` one \
         notification mode, `--seconds N` shortens each cell. `CHAOS_HANDOVER_LIMIT_MS=<n>` \
         overrides `Config::handover_limit` in the workers (0 turns the barging mutex's \
         hand-overs and deferred releases off), for A/B runs; `RUST_LOG=fredlock=debug` logs the workers. The exit \
         status is 1 when a safety check failed.\n",
        options.reproduce()
    );
    doc.push_str(&for_users(reports));
    doc.push_str(
        "## Set-up\n\n\
         Each scenario runs once per notification mode against a fresh lock `redis-server` \
         (`--appendonly yes --appendfsync always`, except where a scenario says otherwise). \
         Worker processes (the example binary re-executed) each run the same number of tasks \
         on a `Mutex`, a fair `Mutex` and the write side of an `RwLock` at the same time, all \
         with a watchdog lease (1 s for `sigstop` and `mixed`, 2 s otherwise; the waiter lease, \
         which bounds a grant to a waiter that died and a read-write queue place, equals \
         it; every other setting has its default, \
         e.g. `transient_retry` 30 s). A task loops: `lock()`, critical section, `unlock()`, \
         retrying after errors.\n\n\
         The critical section works on a resource on a **separate** `redis-server`, so faults \
         of the lock server never touch it: a Lua `enter(token)` refuses tokens lower than the \
         highest it has seen and records the holder as inside; after 0-2 ms of work (5-20 ms \
         in the data-loss scenarios, so that a loss finds holders inside) a Lua \
         `commit(token, value_read)` refuses a stale token again, otherwise writes \
         `value_read + 1` and counts a violation if the value moved meanwhile.\n\n\
         ## Scenarios\n\n",
    );
    for scenario in Scenario::ALL {
        let _ = writeln!(doc, "* `{}`: {}", scenario.name(), scenario.explanation());
    }
    let _ = write!(
        doc,
        "\n## Results\n\n{}\n{METRICS}\n\n",
        results_table(reports)
    );
    let loss = data_loss_table(reports);
    if !loss.is_empty() {
        let metrics = LOSS_METRICS.replace("{window}", &LOSS_WINDOW.as_secs().to_string());
        let _ = write!(doc, "## Data loss\n\n{loss}\n{metrics}\n\n");
    }
    let _ = writeln!(doc, "## Faults injected\n\n{}", faults_table(reports));
    doc.push_str(&observations(reports));
    doc
}

/// The commit the suite was built from, and whether the tree had uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{hash} with uncommitted changes"),
            _ => hash,
        },
        None => "unknown (not a git checkout)".to_owned(),
    }
}

fn all_rows(reports: &[CellReport]) -> impl Iterator<Item = (&CellReport, String, &KindReport)> {
    reports
        .iter()
        .flat_map(|cell| cell.rows().map(move |(label, k)| (cell, label, k)))
}

/// "What this means for a user": the safety and data-loss outcomes in a few sentences.
fn for_users(reports: &[CellReport]) -> String {
    let mut out = String::from("## What this means for a user\n\n");
    let unsafe_cells = all_rows(reports)
        .filter(|(cell, _, k)| !k.safe(cell.hung))
        .count();
    let faults_without_loss = all_rows(reports)
        .filter(|(cell, _, k)| !cell.scenario.data_loss() && !k.safe(cell.hung))
        .count();
    let _ = writeln!(
        out,
        "* **Faults that keep Redis's data** (killed connections, restarts from the AOF, paused \
         or killed clients, script flushes, out of memory, trimmed streams): {}",
        if faults_without_loss == 0 {
            "a resource that checks the fencing token of each write was never corrupted, and \
             every holder that wrote late had been told through `lost()`. A lease alone does \
             not give mutual exclusion (see the overlaps): pass `fencing_token()` to what you \
             protect and check `lost()` before you write."
        } else {
            "some safety checks failed (see the tables); do not rely on these results."
        }
    );
    let loss: Vec<(&CellReport, String, &KindReport)> = all_rows(reports)
        .filter(|(cell, _, _)| cell.scenario.data_loss())
        .collect();
    if !loss.is_empty() {
        let accepted: u64 = loss.iter().map(|(_, _, k)| k.resource.late_accepted).sum();
        let refused: u64 = loss.iter().map(|(_, _, k)| k.resource.late_refused).sum();
        let unreported: u64 = loss
            .iter()
            .map(|(_, _, k)| k.workers.across_unreported)
            .sum();
        let untold: u64 = loss.iter().map(|(_, _, k)| k.workers.stale_not_lost).sum();
        let slowest = loss
            .iter()
            .map(|(_, _, k)| k.workers.max_lost_after_back_ms)
            .max()
            .unwrap_or(0);
        let met = loss.iter().all(|(cell, _, k)| k.loss_reported(cell.hung));
        let _ = writeln!(
            out,
            "* **When Redis loses its data** (restart without persistence, `FLUSHALL`, failover \
             to a replica): {accepted} late writes of old holders were accepted by the \
             token-checking resource and {refused} refused; {untold} writes of current \
             holders were refused without `lost()` telling them (their token was lower than \
             one from before the loss); {unreported} holds vanished without `lost()` firing \
             in time; the slowest `lost()` came {slowest} ms after the \
             server was back. {}",
            if met {
                "Every vanished hold was reported within a second and fencing kept refusing \
                 old holders: the guarantees hold across data loss."
            } else {
                "**The data-loss guarantees do not hold in this run**: until they do, treat a \
                 Redis that can lose data (no persistence, `FLUSHALL`, failover) as able to \
                 give a lock to two holders that a token check does not tell apart."
            }
        );
    }
    if unsafe_cells == 0 {
        out.push_str("* Every safety check of this run passed.\n");
    }
    out.push('\n');
    out
}

/// Findings derived from the numbers, so the text never contradicts the table.
fn observations(reports: &[CellReport]) -> String {
    let mut out = String::from("## What the numbers show\n\n");
    let unsafe_rows: Vec<String> = all_rows(reports)
        .filter(|(cell, _, k)| !k.safe(cell.hung))
        .map(|(_, label, _)| label)
        .collect();
    let sections: u64 = all_rows(reports).map(|(_, _, k)| k.resource.accepted).sum();
    let stale: u64 = all_rows(reports).map(|(_, _, k)| k.resource.stale).sum();
    if unsafe_rows.is_empty() {
        let _ = writeln!(
            out,
            "* **Safety held in every cell**: {sections} critical sections were committed, \
             no commit lost an update, no two holders shared a token, every final counter \
             equals its number of accepted commits, and each of the {stale} late writes was \
             refused by the token check and its holder learned about it through `lost()`."
        );
    } else {
        let _ = writeln!(
            out,
            "* **Safety checks failed in**: {}.",
            unsafe_rows.join(", ")
        );
    }
    let overlaps: Vec<String> = all_rows(reports)
        .filter(|(_, _, k)| k.resource.overlaps > 0)
        .map(|(_, label, k)| format!("{label} ({})", k.resource.overlaps))
        .collect();
    let _ = writeln!(
        out,
        "* Overlapping critical sections (a lease expired under a holder that was still \
         inside): {}.",
        list_or(overlaps, "none")
    );
    let long = |k: &KindReport| k.workers.waits_over_lease + k.workers.unfinished_over_lease;
    // The same lock type and mode in the fault-free baseline, if it ran.
    let in_baseline = |cell: &CellReport, kind: LockKind| {
        reports
            .iter()
            .filter(|c| c.scenario == Scenario::Baseline && c.mode == cell.mode)
            .flat_map(|c| c.kinds.iter())
            .any(|k| k.kind == kind && long(k) > 0)
    };
    let unexpected_waits: Vec<String> = all_rows(reports)
        .filter(|(cell, _, k)| !cell.scenario.holders_die() && long(k) > 0)
        .map(|(cell, label, k)| {
            let note = if in_baseline(cell, k.kind) && cell.scenario != Scenario::Baseline {
                ", also in the baseline"
            } else {
                ""
            };
            format!("{label} ({}{note})", long(k))
        })
        .collect();
    let _ = writeln!(
        out,
        "* Waits longer than a lease where no holder dies (baseline, client-kill, \
         script-flush, oom, stream-gap): {}.",
        list_or(
            unexpected_waits,
            "none: every waiter was woken by an event or a re-check, never by waiting out a \
             lease"
        )
    );
    let rw_stalls = all_rows(reports).any(|(cell, _, k)| {
        k.kind == LockKind::RwWrite && !cell.scenario.holders_die() && long(k) > 0
    });
    if rw_stalls {
        out.push_str(RW_WAKEUP_NOTE);
    }
    let late_accepted: Vec<String> = all_rows(reports)
        .filter(|(_, _, k)| k.resource.late_accepted > 0)
        .map(|(_, label, k)| format!("{label} ({})", k.resource.late_accepted))
        .collect();
    if reports.iter().any(|c| c.scenario.data_loss()) {
        let _ = writeln!(
            out,
            "* Late writes accepted after a data loss: {}.",
            list_or(late_accepted, "none")
        );
    }
    let _ = writeln!(out, "\n### Samples of errors and lost causes\n");
    for (_, label, k) in all_rows(reports).filter(|(_, _, k)| !k.workers.samples.is_empty()) {
        let _ = writeln!(out, "* {label}: {}", k.workers.samples.join("; "));
    }
    out
}

fn list_or(items: Vec<String>, empty: &str) -> String {
    if items.is_empty() {
        empty.to_owned()
    } else {
        items.join(", ")
    }
}
