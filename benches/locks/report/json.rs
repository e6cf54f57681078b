//! The JSON report: every figure, with per-round details.

use fredlock::NotificationMode;
use serde_json::{json, Value as Json};

use super::targets::targets;
use crate::handoff::HandoffResult;
use crate::loop_stats::LoopResult;
use crate::measure::{machine_json, progress, ratio, round};
use crate::options::Args;
use crate::run::Report;
use crate::s1::{CycleCpu, S1Result};
use crate::s3::S3Result;
use crate::s6::S6Run;

pub fn write_json(args: &Args, report: &Report, version: &str) -> Result<(), String> {
    fn per_mode<T>(list: &[(NotificationMode, T)], f: impl Fn(&T) -> Json) -> Json {
        Json::Object(
            list.iter()
                .map(|(mode, r)| (mode.as_str().to_owned(), f(r)))
                .collect(),
        )
    }
    let mut scenarios = serde_json::Map::new();
    if !report.s1.is_empty() {
        scenarios.insert("s1".into(), per_mode(&report.s1, s1_json));
    }
    if !report.s2.is_empty() {
        scenarios.insert("s2".into(), per_mode(&report.s2, LoopResult::json));
    }
    if !report.s2_peers.is_empty() {
        let peers = report
            .s2_peers
            .iter()
            .map(|(kind, r)| (kind.name().to_owned(), r.json()))
            .collect();
        scenarios.insert("s2-peers".into(), Json::Object(peers));
    }
    if !report.s2_fair.is_empty() {
        scenarios.insert(
            "s2-fair".into(),
            per_mode(&report.s2_fair, LoopResult::json),
        );
    }
    if !report.s3.is_empty() {
        scenarios.insert("s3".into(), per_mode(&report.s3, S3Result::json));
    }
    if let Some(peers) = &report.s3_peers {
        scenarios.insert("s3-peers".into(), peers.json());
    }
    if !report.handoff.is_empty() {
        scenarios.insert(
            "fair-handoff".into(),
            per_mode(&report.handoff, HandoffResult::json),
        );
    }
    if !report.rw.is_empty() {
        scenarios.insert(
            "rw".into(),
            per_mode(&report.rw, |r| {
                json!({
                    "rwlock": r.rwlock.json(),
                    "mutex": r.mutex.json(),
                    "rwlock_over_mutex_ops": round(r.speedup(), 3),
                })
            }),
        );
    }
    if !report.s4.is_empty() {
        scenarios.insert(
            "s4".into(),
            per_mode(&report.s4, |r| {
                Json::Array(r.cases.iter().map(|c| c.0.clone()).collect())
            }),
        );
    }
    if let Some(s5) = &report.s5 {
        scenarios.insert("s5".into(), s5.json());
    }
    if !report.s6.is_empty() {
        scenarios.insert(
            "s6".into(),
            per_mode(&report.s6, |r| {
                json!({
                    "ping": r.ping.json(),
                    "holder_lease": format!("{:?}", r.holder_lease.lease()),
                    "runs": r.runs.iter().map(S6Run::json).collect::<Vec<_>>(),
                })
            }),
        );
    }
    if let Some(s7) = &report.s7 {
        scenarios.insert("s7".into(), s7.json());
    }
    let targets: Vec<Json> = targets(report)
        .into_iter()
        .flat_map(|row| {
            row.cells.into_iter().map(move |(mode, value, met)| {
                json!({
                    "scenario": row.scenario,
                    "target": row.label,
                    "mode": mode.as_str(),
                    "value": value,
                    "met": met,
                })
            })
        })
        .collect();
    let errors: Vec<Json> = report
        .errors
        .iter()
        .map(|(scenario, mode, message)| {
            json!({ "scenario": scenario.name(), "mode": mode.map(NotificationMode::as_str), "error": message })
        })
        .collect();
    let doc = json!({
        "machine": machine_json(version),
        "quick": args.quick,
        "settings": {
            "scenarios": args.scenarios.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "modes": args.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "cycles": args.cycles,
            "warmup": args.warmup,
            "pings": args.pings,
            "seconds": args.seconds,
            "processes": args.processes,
            "tasks": args.tasks,
            "s3_rounds": args.s3_rounds,
            "handoff_batches": [args.handoff_batches_10, args.handoff_batches_1000],
            "s4_waiters": args.s4_waiters,
            "s5_rounds": args.s5_rounds,
            "s6_reps": args.s6_reps,
            "peers": args.peers.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "s7_shapes": args.s7_shapes.iter().map(|s| s.label()).collect::<Vec<_>>(),
            "s7_locks": args.s7_locks.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "s7_seconds": args.s7_seconds,
            "s7_rounds": args.s7_rounds,
        },
        "scenarios": scenarios,
        "targets": targets,
        "errors": errors,
        "notes": report.notes,
    });
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc).expect("JSON serialization");
    std::fs::write(&args.json, text + "\n")
        .map_err(|err| format!("cannot write {}: {err}", args.json.display()))?;
    progress(&format!("wrote {}", args.json.display()));
    Ok(())
}

pub fn s1_json(s1: &S1Result) -> Json {
    json!({
        "ping": s1.ping.json(),
        "cycle": s1.cycle.json(),
        "lock": s1.lock.json(),
        "unlock": s1.unlock.json(),
        "cycle_p50_per_ping": round(ratio(s1.cycle.p50, s1.ping.p50), 3),
        "floor_two_bare_evalsha": s1.floor.json(),
        "floor_p50_per_ping": round(ratio(s1.floor.p50, s1.ping.p50), 3),
        "cycle_p99_per_ping": round(ratio(s1.cycle.p99, s1.ping.p50), 3),
        "redis_commands_per_cycle": s1.commands.json(s1.cycles),
        "peers": s1
            .peers
            .iter()
            .map(|(kind, p)| (kind.name().to_owned(), p.json()))
            .collect::<serde_json::Map<_, _>>(),
        "cycle_p50_per_naive_p50": s1.over_naive().map(|r| round(r, 3)),
        "cpu_us_per_cycle": cycle_cpu_json(&s1.cpu),
        "naive_cpu_us_per_cycle": s1.naive_cpu.as_ref().map(cycle_cpu_json),
    })
}

fn cycle_cpu_json(cpu: &CycleCpu) -> Json {
    json!({ "client": round(cpu.client_us, 1), "redis": round(cpu.redis_us, 1) })
}
