//! The markdown report: the whole document, and the tables of S1, the contended loops and the
//! read-heavy mix (the others are in [`super::tables`]).

use fredlock::NotificationMode;

use super::tables::{
    handoff_table, s3_table, s4_table, s5_table, s6_table, s7_table, targets_table,
};
use crate::loop_stats::LoopResult;
use crate::loops::{subject, RwResult};
use crate::measure::{ratio, times_ping};
use crate::options::Args;
use crate::peers::LockKind;
use crate::run::Report;
use crate::s1::S1Result;

pub fn markdown(args: &Args, report: &Report, version: &str) -> String {
    let mut out = format!(
        "### fredlock benchmarks (Redis {version}, {} CPUs{})\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if args.quick { ", --quick" } else { "" }
    );
    if !report.s1.is_empty() {
        out += &s1_table(args, &report.s1);
    }
    let s2: Vec<(String, &LoopResult)> = per_mode(LockKind::Mutex, &report.s2)
        .into_iter()
        .chain(
            report
                .s2_peers
                .iter()
                .map(|(kind, r)| (kind.label().to_owned(), r)),
        )
        .collect();
    if !s2.is_empty() {
        out += &loop_table(
            &format!(
                "S2 contended: {} processes × {} tasks on one lock for {} s, GET + SET inside, \
                 fredlock Mutex and the peers",
                args.processes, args.tasks, args.seconds
            ),
            &s2,
        );
    }
    if !report.s2_fair.is_empty() {
        out += &loop_table(
            &format!(
                "S2 on FairMutex: {} processes × {} tasks on one fair lock for {} s, GET + SET \
                 inside",
                args.processes, args.tasks, args.seconds
            ),
            &per_mode(LockKind::Fair, &report.s2_fair),
        );
    }
    if !report.s3.is_empty() || report.s3_peers.is_some() {
        out += &s3_table(args, &report.s3, report.s3_peers.as_ref());
    }
    if !report.handoff.is_empty() {
        out += &handoff_table(&report.handoff);
    }
    if !report.rw.is_empty() {
        out += &rw_table(args, &report.rw);
    }
    if !report.s4.is_empty() {
        out += &s4_table(&report.s4);
    }
    if let Some(s5) = &report.s5 {
        out += &s5_table(s5);
    }
    if !report.s6.is_empty() {
        out += &s6_table(&report.s6);
    }
    if let Some(s7) = &report.s7 {
        out += &s7_table(s7);
    }
    out += &targets_table(args, report);
    if !report.notes.is_empty() {
        out += "\n#### Notes\n\n";
        for note in &report.notes {
            out += &format!("* {note}\n");
        }
    }
    if !report.errors.is_empty() {
        out += "\n#### Failed scenarios\n\n";
        for (scenario, mode, message) in &report.errors {
            out += &format!(
                "* {} {}: {message}\n",
                scenario.name(),
                mode.map_or("", NotificationMode::as_str)
            );
        }
    }
    out
}

pub fn s1_table(args: &Args, results: &[(NotificationMode, S1Result)]) -> String {
    let mut out = format!(
        "#### S1 uncontended: {} × lock + unlock, one task, after {} warm-up (µs)\n\n",
        args.cycles, args.warmup
    );
    out += "| mode | PING p50 | cycle p50 | cycle p99 | p50 / PING | p50 / naive p50 | peers' \
            cycle p50 (/ PING) | p99 / PING | lock p50 | unlock p50 | floor: 2 bare EVALSHA p50 \
            (/ PING) | EVALSHA per cycle (server µs per call) | CPU µs per cycle, client / \
            Redis: fredlock (naive) |\n\
            |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, s1) in results {
        let ping = s1.ping.p50;
        let (evalsha, evalsha_us) = s1.commands.per_op("evalsha", s1.cycles);
        let peers = s1
            .peers
            .iter()
            .map(|(kind, p)| format!("{}: {:.1} ({:.2})", kind.name(), p.p50, ratio(p.p50, ping)))
            .collect::<Vec<_>>()
            .join(", ");
        let naive = s1
            .over_naive()
            .map_or_else(|| "–".to_owned(), |r| format!("**{r:.2}**"));
        let naive_cpu = s1.naive_cpu.map_or_else(String::new, |cpu| {
            format!(" ({:.0} / {:.0})", cpu.client_us, cpu.redis_us)
        });
        let cpu = format!(
            "{:.0} / {:.0}{naive_cpu}",
            s1.cpu.client_us, s1.cpu.redis_us
        );
        out += &format!(
            "| {} | {:.1} | {:.1} | {:.1} | **{:.2}** | {naive} | {peers} | {:.2} | {:.1} | {:.1} \
             | {:.1} ({:.2}) | {:.2} ({:.1}) | {cpu} |\n",
            mode.as_str(),
            ping,
            s1.cycle.p50,
            s1.cycle.p99,
            ratio(s1.cycle.p50, ping),
            ratio(s1.cycle.p99, ping),
            s1.lock.p50,
            s1.unlock.p50,
            s1.floor.p50,
            ratio(s1.floor.p50, ping),
            evalsha,
            evalsha_us
        );
    }
    out + "\n"
}

/// Rows of a per-mode list, named by lock and mode.
fn per_mode(
    kind: LockKind,
    results: &[(NotificationMode, LoopResult)],
) -> Vec<(String, &LoopResult)> {
    results
        .iter()
        .map(|(mode, r)| (subject(kind, *mode), r))
        .collect()
}

pub fn loop_table(title: &str, results: &[(String, &LoopResult)]) -> String {
    let mut out = format!("#### {title} (µs; × = ratio to PING p50)\n\n");
    out += "| lock | PING p50 (before / after) | acquisitions in window (all) | acq/s | acq/s × \
            PING | handoff to another task p50 | p99 | max | handoff to same task p50 | same-task \
            share | wakeups / acq |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (label, r) in results {
        let x = |v: f64| times_ping(v, r.ping.p50);
        let same = if r.handoff_same.count == 0 {
            "–".to_owned()
        } else {
            x(r.handoff_same.p50)
        };
        out += &format!(
            "| {label} | {:.1} ({:.1} / {:.1}) | {} ({}) | {:.0} | **{:.3}** | {} | {} | {} | {} \
             | {:.1} % | {:.2} |\n",
            r.ping.p50,
            r.ping_before.p50,
            r.ping_after.p50,
            r.in_window,
            r.acquisitions,
            r.acq_per_s,
            r.throughput_ratio(),
            x(r.handoff_other.p50),
            x(r.handoff_other.p99),
            x(r.handoff_other.max),
            same,
            r.same_share * 100.0,
            r.wakeups_per_acquisition()
        );
    }
    out += "\n| lock | wait p50 | wait p99 | longest wait: after ramp-up / in window / overall | waits > 1 s \
            | acquisitions per task min–max | drain after window | CPU µs per acquisition \
            (workers / redis) | machine busy | Redis commands per acquisition (EVALSHA, server \
            µs per call) | FIFO inversions (after ramp-up / all) | overlapping holds | counter / increments | unlock \
            errors |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (label, r) in results {
        let (workers_cpu, redis_cpu) = r.cpu_per_acquisition();
        let (evalsha, evalsha_us) = r.commands.per_op("evalsha", r.in_window);
        out += &format!(
            "| {label} | {} | {} | {:.1} ms / {:.1} ms / {:.1} ms | {} | {}–{} | {:.3} s | {:.0} / {:.0} | \
             {:.0} % | {:.1} ({:.2}, {:.1}) | {} / {} | {} | {} / {} | {} |\n",
            times_ping(r.wait.p50, r.ping.p50),
            times_ping(r.wait.p99, r.ping.p50),
            r.longest_wait_steady_us as f64 / 1000.0,
            r.longest_wait_in_window_us as f64 / 1000.0,
            r.wait.max / 1000.0,
            r.stalls,
            r.per_task_min,
            r.per_task_max,
            r.drain_s,
            workers_cpu,
            redis_cpu,
            r.machine_busy() * 100.0,
            r.commands_per_acquisition(),
            evalsha,
            evalsha_us,
            r.inversions,
            r.inversions_all,
            r.overlaps,
            r.counter,
            r.writes,
            r.unlock_errors
        );
    }
    out + "\n"
}

pub fn rw_table(args: &Args, results: &[(NotificationMode, RwResult)]) -> String {
    let mut out = format!(
        "#### Read-heavy mix: {} processes × {} tasks, 90 % reads (GET) / 10 % writes (GET + \
         SET), {} s per lock (µs; × = ratio to PING p50)\n\n",
        args.processes, args.tasks, args.seconds
    );
    out += "| mode | lock | PING p50 | ops/s | ops/s × PING | reads / writes | read wait p50 \
            | read wait p99 | write wait p50 | write wait p99 | longest wait (waits > 1 s) | CPU µs \
            per op (workers / redis) | violations | counter / writes | RwLock ÷ Mutex ops/s \
            |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for (label, l) in [("RwLock", &r.rwlock), ("Mutex", &r.mutex)] {
            let (workers_cpu, redis_cpu) = l.cpu_per_acquisition();
            out += &format!(
                "| {} | {label} | {:.1} | {:.0} | {:.3} | {} / {} | {} | {} | {} | {} | {:.1} ms \
                 ({}) | {:.0} / {:.0} | {} | {} / {} | {} |\n",
                mode.as_str(),
                l.ping.p50,
                l.acq_per_s,
                l.throughput_ratio(),
                l.reads,
                l.writes,
                times_ping(l.wait_read.p50, l.ping.p50),
                times_ping(l.wait_read.p99, l.ping.p50),
                times_ping(l.wait_write.p50, l.ping.p50),
                times_ping(l.wait_write.p99, l.ping.p50),
                l.wait.max / 1e3,
                l.stalls,
                workers_cpu,
                redis_cpu,
                l.violations(),
                l.counter,
                l.writes,
                if label == "RwLock" {
                    format!("**{:.2}×**", r.speedup())
                } else {
                    String::new()
                }
            );
        }
    }
    out + "\n"
}
