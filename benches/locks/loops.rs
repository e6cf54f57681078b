//! The contended loop of S2, S2-fair, rw and S7: `processes` OS processes × `tasks` tasks loop
//! on ONE lock for a window, each critical section a non-atomic `GET` then `SET n+1` of a
//! counter (a read in the rw mix: `GET` only, under a read hold).
//!
//! The bench re-executes itself as the worker processes; they connect, say `READY`, and all
//! start at the wall-clock instant the parent sends with `GO`. Each acquisition records, in
//! wall-clock µs (one machine, one clock): when `lock()` was called, when it returned
//! (acquire), when `unlock()` was called (release: the end of the critical section) and when
//! it returned. [`crate::loop_stats`] turns them into throughput, hand-off gaps, waits,
//! violations and FIFO inversions.
//!
//! The parent measures PING (a plain fred client) before and after, and between the window's
//! start and end: `INFO commandstats` and `INFO cpu` deltas and the workers' CPU time.
//!
//! * **s2**: `Mutex`, `--processes` (4) × `--tasks` (4), `--seconds` (5; 2 with `--quick`);
//!   then, same settings, the peers (naive, rslock).
//! * **s2-fair**: the same on `FairMutex`.
//! * **rw**: each operation a read with probability 0.9 (else a write), drawn per operation;
//!   on an `RwLock`, then the same mix on a `Mutex`.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fredlock::NotificationMode;
use serde_json::json;

use crate::loop_stats::{analyze, CpuSample, LoopResult, Window};
use crate::measure::{
    histogram, measure_ping, now_us, processes_cpu_us, progress, ratio, sleep_until_wall,
    PingBracket, Summary,
};
use crate::peers::{AnyLock, LockKind};
use crate::redis::{command_stats, counter_key, plain_client, server_cpu_us, DEFAULT_SHARDS};
use crate::run::ModeCtx;
use crate::workers::{
    collect_all, float, number, say, start_workers, text, wait_go, ChildCtx, Record, FINISH_GRACE,
    START_DELAY_US,
};

/// What the tasks of a looping scenario do.
pub struct LoopSpec {
    pub label: String,
    pub lock: LockKind,
    /// Lock name (and counter name).
    pub name: String,
    /// Probability that an operation is a read (`GET` only; a read hold on an `RwLock`).
    pub read_share: f64,
    pub processes: usize,
    pub tasks: usize,
    pub seconds: f64,
}

impl LoopSpec {
    /// The S2-shaped loop of `ctx`'s settings on `lock`.
    pub fn s2(ctx: &ModeCtx<'_>, label: &str, lock: LockKind, read_share: f64) -> LoopSpec {
        LoopSpec {
            label: label.to_owned(),
            lock,
            name: format!("bench-{}", label.replace([' ', '(', ')'], "")),
            read_share,
            processes: ctx.args.processes,
            tasks: ctx.args.tasks,
            seconds: ctx.args.seconds,
        }
    }
}

/// Runs one loop and analyses it.
pub async fn run_loop(ctx: &ModeCtx<'_>, spec: &LoopSpec) -> Result<LoopResult, String> {
    let probe = plain_client(ctx.url).await?;
    let counter = counter_key(&ctx.prefix, &spec.name);
    let _: i64 = probe
        .del(counter.as_str())
        .await
        .map_err(|err| format!("DEL counter: {err}"))?;
    let mut ping_before = histogram();
    measure_ping(&probe, ctx.args.pings, &mut ping_before).await?;
    let who = if spec.lock.runs_once() {
        "-"
    } else {
        ctx.name()
    };
    progress(&format!(
        "{} {who}: PING p50 {:.1} µs; {} processes × {} tasks for {} s",
        spec.label,
        Summary::of(&ping_before, 1e-3).p50,
        spec.processes,
        spec.tasks,
        spec.seconds
    ));
    let params = |id: usize| {
        json!({
            "role": "loop",
            "mode": ctx.name(),
            "prefix": ctx.prefix,
            "id": id,
            "processes": spec.processes,
            "tasks": spec.tasks,
            "seconds": spec.seconds,
            "lock": spec.lock.name(),
            "name": spec.name,
            "read_share": spec.read_share,
        })
    };
    let mut workers = start_workers(ctx.url, spec.processes, params).await?;
    let pids: Vec<u32> = workers.iter().filter_map(|w| w.child.id()).collect();
    let go = now_us() + START_DELAY_US;
    let window = Window {
        go,
        end: go + (spec.seconds * 1e6) as u64,
    };
    for worker in &mut workers {
        worker.send(&format!("GO {go}")).await?;
    }
    let collecting = tokio::spawn(collect_all(workers));
    sleep_until_wall(window.go).await;
    let (stats_before, cpu_before) = (command_stats(&probe).await?, sample(&probe, &pids).await?);
    sleep_until_wall(window.end).await;
    let cpu = sample(&probe, &pids).await?.since(&cpu_before);
    let stats = command_stats(&probe).await?.since(&stats_before);
    let limit = Duration::from_secs_f64(spec.seconds) + FINISH_GRACE;
    let reports = tokio::time::timeout(limit, collecting)
        .await
        .map_err(|_| format!("workers did not finish within {limit:?}"))?
        .map_err(|err| err.to_string())??;
    let value: Option<i64> = probe
        .get(counter.as_str())
        .await
        .map_err(|err| format!("GET counter: {err}"))?;
    let mut ping_after = histogram();
    measure_ping(&probe, ctx.args.pings, &mut ping_after).await?;
    let _ = probe.quit().await;
    let pings = PingBracket::new(&ping_before, &ping_after);
    let mut result = analyze(pings, window, reports, value.unwrap_or(0), cpu);
    result.commands = stats;
    progress(&format!(
        "{} {who}: {} acquisitions, {:.0}/s = {:.3} per PING; handoff to another task p50 {:.1} \
         µs = {:.2} × PING; {:.1} commands / acq; violations {}",
        spec.label,
        result.acquisitions,
        result.acq_per_s,
        result.throughput_ratio(),
        result.handoff_other.p50,
        ratio(result.handoff_other.p50, result.ping.p50),
        result.commands_per_acquisition(),
        result.violations()
    ));
    Ok(result)
}

/// CPU used so far by the workers (`/proc`) and by the server (`INFO cpu`).
async fn sample(probe: &Client, pids: &[u32]) -> Result<CpuSample, String> {
    Ok(CpuSample {
        workers_us: processes_cpu_us(pids),
        redis_us: server_cpu_us(probe).await?,
    })
}

/// rw: the read-heavy mix on an `RwLock` and on a `Mutex`.
pub struct RwResult {
    pub rwlock: LoopResult,
    pub mutex: LoopResult,
}

impl RwResult {
    /// RwLock operations/s over Mutex operations/s.
    pub fn speedup(&self) -> f64 {
        self.rwlock.acq_per_s / self.mutex.acq_per_s.max(1e-9)
    }
}

pub async fn run_rw(ctx: &ModeCtx<'_>) -> Result<RwResult, String> {
    let rwlock = run_loop(
        ctx,
        &LoopSpec::s2(ctx, "rw (RwLock)", LockKind::RwLock, 0.9),
    )
    .await?;
    let mutex = run_loop(ctx, &LoopSpec::s2(ctx, "rw (Mutex)", LockKind::Mutex, 0.9)).await?;
    Ok(RwResult { rwlock, mutex })
}

/// Worker side of a loop: connects, says `READY`, waits for `GO`, loops, reports.
pub async fn child(worker: &ChildCtx<'_>) -> Result<(), String> {
    let (params, prefix) = (worker.params, worker.prefix);
    let (id, tasks) = (number(params, "id")?, number(params, "tasks")?);
    let seconds = float(params, "seconds")?;
    let read_share = float(params, "read_share")?;
    let name = text(params, "name")?;
    let kind = LockKind::parse(text(params, "lock")?)?;
    let side = worker.side(DEFAULT_SHARDS, !kind.runs_once()).await?;
    let lock = match kind {
        LockKind::Ring => {
            let processes = number(params, "processes")?;
            let (process, processes, tasks) = (id as usize, processes as usize, tasks as usize);
            side.ring(name, process, processes, tasks).await?
        }
        _ => side.lock(kind, name).await?,
    };
    side.ready().await?;
    let start = wait_go().await?;
    let end = start + (seconds * 1e6) as u64;
    sleep_until_wall(start).await;
    let counter = counter_key(prefix, name);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let task = id * tasks + t;
            let (lock, redis) = (lock.for_task(t as usize), side.redis().clone());
            let counter = counter.clone();
            tokio::spawn(loop_task(lock, redis, counter, task, end, read_share))
        })
        .collect();
    let mut records = Vec::new();
    for handle in handles {
        records.extend(handle.await.map_err(|err| err.to_string())??);
    }
    let wakeups = side.wakeups();
    if let AnyLock::Ring(ring) = &lock {
        ring.close().await;
    }
    side.shutdown().await?;
    let mut lines: Vec<String> = records.iter().map(|r| r.to_line()).collect();
    lines.push(json!({ "wakeups": wakeups }).to_string());
    lines.push("DONE".to_owned());
    say(&lines.join("\n"))
}

/// One task: [`hold_once`] until the common end instant.
async fn loop_task(
    lock: AnyLock,
    redis: Client,
    counter: String,
    task: u64,
    end: u64,
    read_share: f64,
) -> Result<Vec<Record>, String> {
    let mut rng = fastrand::Rng::with_seed(task + 1);
    let mut records = Vec::new();
    while now_us() < end {
        let read = read_share > 0.0 && rng.f64() < read_share;
        records.push(hold_once(&lock, &redis, &counter, task, read).await?);
    }
    Ok(records)
}

/// One timed acquisition: lock, `GET` (and `SET` + 1 for a write), unlock. An unlock error is
/// reported on stderr and in the record.
pub async fn hold_once(
    lock: &AnyLock,
    redis: &Client,
    counter: &str,
    task: u64,
    read: bool,
) -> Result<Record, String> {
    let start = now_us();
    let guard = lock
        .lock(read)
        .await
        .map_err(|err| format!("task {task}: lock failed: {err}"))?;
    let acquire = now_us();
    let value: Option<i64> = redis
        .get(counter)
        .await
        .map_err(|err| format!("task {task}: GET failed: {err}"))?;
    if !read {
        let _: () = redis
            .set(counter, value.unwrap_or(0) + 1, None, None, false)
            .await
            .map_err(|err| format!("task {task}: SET failed: {err}"))?;
    }
    let release = now_us();
    let unlocked = guard.unlock().await;
    let done = now_us();
    if let Err(err) = &unlocked {
        eprintln!("bench worker: task {task}: unlock failed: {err}");
    }
    Ok(Record {
        task,
        start,
        acquire,
        release,
        done,
        unlock_ok: unlocked.is_ok(),
        read,
    })
}

/// How the report names the mode of a result: peers have none.
pub fn subject(kind: LockKind, mode: NotificationMode) -> String {
    if kind.runs_once() {
        kind.label().to_owned()
    } else {
        format!("{} ({})", kind.label(), mode.as_str())
    }
}
