//! Markdown tables of S3, the fair hand-off, S4, S5, S6, S7 and the targets.

use std::time::Duration;

use fredlock::NotificationMode;

use super::targets::targets;
use crate::handoff::{HandoffResult, HANDOFF_GAPS};
use crate::measure::{ms, ratio, times_ping};
use crate::options::Args;
use crate::run::{Report, LONG_LEASE};
use crate::s3::{S3Result, S3_GAP, S3_PROCESSES, S3_WAITERS};
use crate::s4::S4Result;
use crate::s5::{S5Result, S5_CLIENTS, S5_SETTLE};
use crate::s6::{S6Result, S6_WAITERS};
use crate::s7::S7Result;

pub fn s3_table(
    args: &Args,
    results: &[(NotificationMode, S3Result)],
    peers: Option<&S3Result>,
) -> String {
    let mut out = format!(
        "#### S3 FIFO: {S3_WAITERS} waiters from {S3_PROCESSES} processes arriving {} ms apart \
         while the lock is held; {} rounds per lock\n\n",
        ms(S3_GAP),
        args.s3_rounds
    );
    out += "| mode | lock | PING p50 µs | inversions (of pairs) | worst round | acquisition \
            order, first round | drain p50 / max ms (× PING) | arrival → in Redis queue, max \
            ms | overlaps |\n|---|---|---|---|---|---|---|---|---|\n";
    let rows = results
        .iter()
        .map(|(mode, r)| (mode.as_str(), r))
        .chain(peers.map(|r| ("–", r)));
    for (mode, r) in rows {
        for lock in r.kinds() {
            let (inversions, pairs, worst) = r.inversions(lock);
            let drain = r.drain(lock);
            let first = r
                .of(lock)
                .next()
                .map(|round| format!("{:?}", round.order))
                .unwrap_or_default();
            let queue_wait = r
                .of(lock)
                .filter_map(|round| round.queue_wait_max)
                .max()
                .map_or("–".to_owned(), |d| format!("{:.1}", ms(d)));
            out += &format!(
                "| {} | {} | {:.1} | **{inversions}** of {pairs} | {worst} | {first} | \
                 {:.1} / {:.1} ({:.0}× / {:.0}×) | {queue_wait} | {} |\n",
                mode,
                lock.label(),
                r.ping.p50,
                drain.p50 / 1e3,
                drain.max / 1e3,
                ratio(drain.p50, r.ping.p50),
                ratio(drain.max, r.ping.p50),
                r.violations(lock)
            );
        }
    }
    out + "\n"
}

pub fn handoff_table(results: &[(NotificationMode, HandoffResult)]) -> String {
    let mut out = format!(
        "#### Fair hand-off with 10 vs 1000 queued waiters: release → next holder's lock() \
         returned, first {HANDOFF_GAPS} hand-offs of each batch (µs)\n\n"
    );
    out += "| mode | queued | batches | PING p50 | gap p50 | p90 | p99 | max | all gaps p50 \
            (whole drain) | time until all queued | wakeups per hand-off | p50 growth 10 → 1000 \
            |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        let growth = r
            .growth()
            .map_or("–".to_owned(), |g| format!("**{g:.2}×**"));
        for case in &r.cases {
            let x = |v: f64| times_ping(v, r.ping.p50);
            out += &format!(
                "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {:.0} ms | {:.2} | {} |\n",
                mode.as_str(),
                case.waiters,
                case.batches,
                r.ping.p50,
                x(case.gaps.p50),
                x(case.gaps.p90),
                x(case.gaps.p99),
                x(case.gaps.max),
                x(case.all_gaps.p50),
                ms(case.fill_max),
                case.wakeups_per_handoff,
                if case.waiters == r.cases.last().map_or(0, |c| c.waiters) {
                    growth.as_str()
                } else {
                    ""
                }
            );
        }
    }
    out + "\n"
}

pub fn s4_table(results: &[(NotificationMode, S4Result)]) -> String {
    let mut out = String::from(
        "#### S4 connection economy: N waiters on N distinct locks in one process, all held by \
         another LockClient\n\n",
    );
    out += "| mode | waiters | PING p50 µs | connected_clients: before → + holder client → + \
            waiting client, all waiting | waiting client's connections | RSS per waiter (incl. \
            task + future) | live heap per waiter | pending `lock()` future | whole task future \
            | all first attempts done | all acquired after the releases began |\n\
            |---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for c in &r.cases {
            out += &format!(
                "| {} | {} | {:.1} | {} → {} → {} | **{}** | **{:.0} B** | {:.0} B | {} B | {} B \
                 | {:.2} s | {:.2} s |\n",
                mode.as_str(),
                c.waiters(),
                c.num(&["ping", "p50_us"]),
                c.num(&["connections", "baseline"]),
                c.num(&["connections", "after_holder"]),
                c.num(&["connections", "while_waiting"]),
                c.waiting_client_connections(),
                c.rss_per_waiter(),
                c.num(&["heap_per_waiter_bytes"]),
                c.num(&["lock_future_bytes"]),
                c.num(&["task_future_bytes"]),
                c.num(&["first_attempts_s"]),
                c.num(&["all_acquired_after_release_s"]),
            );
        }
    }
    out + "\n"
}

pub fn s5_table(r: &S5Result) -> String {
    let mut out = format!(
        "#### S5 wakeup latency: unlock() called → first waiter's lock() returned; 1 holder + \
         {S5_CLIENTS} waiting processes (one LockClient each), {} rounds per mode, interleaved \
         (µs; × = ratio to PING p50 / to PING after {} ms idle)\n\n",
        r.rounds,
        ms(S5_SETTLE)
    );
    out += "| mode | PING p50 | PING p50 after idle | p50 | p90 | p99 | max | holder's unlock() \
            call p50 (× PING) | events per round | overlaps |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for m in &r.modes {
        let x = |v: f64| {
            format!(
                "{v:.0} ({:.2}× / {:.2}×)",
                ratio(v, m.ping_hot.p50),
                ratio(v, m.ping_idle.p50)
            )
        };
        out += &format!(
            "| {} | {:.1} | {:.1} | **{}** | {} | {} | {} | {:.0} ({:.2}×) | {:.2} | {} |\n",
            m.mode.as_str(),
            m.ping_hot.p50,
            m.ping_idle.p50,
            x(m.latency.p50),
            x(m.latency.p90),
            x(m.latency.p99),
            x(m.latency.max),
            m.unlock.p50,
            ratio(m.unlock.p50, m.ping_hot.p50),
            m.events_per_round,
            m.overlaps
        );
    }
    if let Some(ratio) = r.stream_over_pubsub() {
        out += &format!("\nStream p50 / Pub/Sub p50 = **{ratio:.2}**\n");
    }
    out + "\n"
}

pub fn s6_table(results: &[(NotificationMode, S6Result)]) -> String {
    let lease = results
        .first()
        .map_or("fixed", |(_, r)| r.holder_lease.name());
    let mut out = format!(
        "#### S6 recovery: {S6_WAITERS} waiting tasks, their client's notifier connection \
         killed, then the holder ({lease} {} s lease) releases (ms after the release)\n\n",
        LONG_LEASE.as_secs()
    );
    out += "| mode | waiting on | PING p50 µs | killed connections | notifier reading again \
            after the kill | first acquired | median | all acquired | wakeups | within 1 s + \
            reconnect |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for run in &r.runs {
            let at = |d: Option<Duration>| d.map_or("–".to_owned(), |d| format!("{:.1}", ms(d)));
            out += &format!(
                "| {} | {} | {:.1} | {} | {} ms | {} | {} | **{}** ({}/{S6_WAITERS}) | {} | {} \
                 |\n",
                mode.as_str(),
                run.variant(),
                r.ping.p50,
                run.killed,
                at(run.reconnect),
                at(run.acquired.first().copied()),
                at(run.acquired.get(run.acquired.len() / 2).copied()),
                at(run.last()),
                run.acquired.len(),
                run.wakeups,
                if run.met() { "yes" } else { "**NO**" }
            );
        }
    }
    out + "\n"
}

pub fn targets_table(args: &Args, report: &Report) -> String {
    let mut out = String::from("#### Targets\n\n| scenario | target |");
    for mode in &args.modes {
        out += &format!(" {} |", mode.as_str());
    }
    out += "\n|---|---|";
    out += &"---|".repeat(args.modes.len());
    out += "\n";
    for row in targets(report) {
        out += &format!("| {} | {} |", row.scenario, row.label);
        for mode in &args.modes {
            match row.cells.iter().find(|(m, _, _)| m == mode) {
                Some((_, value, met)) => {
                    out += &format!(" {value} {} |", if *met { "met" } else { "**MISSED**" })
                }
                None => out += " – |",
            }
        }
        out += "\n";
    }
    out
}

pub fn s7_table(r: &S7Result) -> String {
    let mut out = format!(
        "#### S7 scale: the S2 loop (GET + SET inside) at processes × tasks, {} s per run, \
         {} rounds of every row in turn, the median run shown (µs; × = ratio to the run's PING \
         p50)\n\n",
        r.seconds, r.rounds
    );
    out += "| shape | lock | PING p50 | acq/s (× PING) | acq/s of the rounds | Redis commands / acq | Redis CPU µs / \
            acq | client CPU µs / acq | wait p50 | wait p99 | longest wait: after ramp-up / in window / all | violations | FIFO \
            inversions (after ramp-up / all) | wakeups / acq |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for row in &r.rows {
        let l = &row.result;
        let (client_cpu, redis_cpu) = l.cpu_per_acquisition();
        out += &format!(
            "| {} | {} | {:.1} | **{:.0}** ({:.3}) | {} | **{:.1}** | {:.0} | {:.0} | {} | {} | \
             {:.1} / {:.1} / {:.1} ms | {} | {} / {} | {:.2} |\n",
            row.shape.label(),
            row.subject(),
            l.ping.p50,
            l.acq_per_s,
            l.throughput_ratio(),
            row.round_rates
                .iter()
                .map(|rate| format!("{rate:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            l.commands_per_acquisition(),
            redis_cpu,
            client_cpu,
            times_ping(l.wait.p50, l.ping.p50),
            times_ping(l.wait.p99, l.ping.p50),
            l.longest_wait_steady_us as f64 / 1e3,
            l.longest_wait_in_window_us as f64 / 1e3,
            l.wait.max / 1e3,
            l.violations(),
            l.inversions,
            l.inversions_all,
            l.wakeups_per_acquisition()
        );
    }
    out + "\n"
}
