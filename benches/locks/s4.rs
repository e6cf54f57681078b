//! S4, connection economy: a fresh worker process per N in `--s4-waiters` (200,10000): a
//! holder `LockClient` takes N distinct locks (`s4-<i>`, fixed 120 s lease), then N tasks of a
//! second `LockClient` each create the handle and call `lock()` on one of them. `INFO clients`
//! connected_clients before, after each client connected and while all wait (target: the
//! waiting client ≤ 3 connections); RSS (`/proc/self/statm`) before spawning the waiters and
//! once all have made their first attempt, per waiter (target ≤ 2 KiB); `size_of_val` of a
//! pending `mutex.lock()` future and of the whole spawned task's future.

use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fredlock::{Lease, LockClient, LockGuard, NotificationMode};
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;

use crate::measure::{heap_live, ping_summary, progress, round, rss_bytes, size_of};
use crate::redis::{
    command_stats, connect, connected_clients, plain_client, shutdown, wait_for_evalsha,
};
use crate::run::{HolderLease, ModeCtx};
use crate::workers::{number, say, text, ChildCtx, Worker};

/// One S4 case as reported by its worker process (see [`child`]).
pub struct S4Case(pub Json);

impl S4Case {
    pub fn num(&self, path: &[&str]) -> f64 {
        let mut value = &self.0;
        for key in path {
            value = &value[*key];
        }
        value.as_f64().unwrap_or(f64::NAN)
    }

    pub fn waiters(&self) -> f64 {
        self.num(&["waiters"])
    }

    pub fn waiting_client_connections(&self) -> f64 {
        self.num(&["connections", "waiting_client"])
    }

    pub fn rss_per_waiter(&self) -> f64 {
        self.num(&["rss_per_waiter_bytes"])
    }
}

pub struct S4Result {
    pub cases: Vec<S4Case>,
}

pub async fn run_s4(ctx: &ModeCtx<'_>) -> Result<S4Result, String> {
    let mut cases = Vec::new();
    for &n in &ctx.args.s4_waiters {
        let prefix = format!("{}-s4-{n}", ctx.prefix);
        let params = json!({
            "role": "s4",
            "mode": ctx.name(),
            "prefix": prefix,
            "waiters": n,
            "pings": ctx.args.pings,
            "holder_lease": ctx.holder_lease.name(),
        });
        let mut worker = Worker::spawn(ctx.url, 0, params)?;
        let line = worker.next_line(Duration::from_secs(600)).await?;
        worker.finish().await?;
        let value: Json =
            serde_json::from_str(&line).map_err(|err| format!("S4: bad line {line:?}: {err}"))?;
        if let Some(error) = value.get("error").and_then(Json::as_str) {
            return Err(format!("S4 with {n} waiters: {error}"));
        }
        let case = S4Case(value);
        progress(&format!(
            "s4 {}: {n} waiters: waiting client {} connections, {:.0} B RSS per waiter, lock() \
             future {} B",
            ctx.name(),
            case.waiting_client_connections(),
            case.rss_per_waiter(),
            case.num(&["lock_future_bytes"])
        ));
        cases.push(case);
    }
    Ok(S4Result { cases })
}

/// Worker side: runs one case and prints its figures (or its error) as one JSON line.
pub async fn child(worker: &ChildCtx<'_>) -> Result<(), String> {
    let waiters = number(worker.params, "waiters")? as usize;
    let pings = number(worker.params, "pings")?;
    let lease = HolderLease::parse(text(worker.params, "holder_lease")?).lease();
    let (url, mode, prefix) = (worker.url, worker.mode, worker.prefix);
    let line = match s4(url, mode, prefix, waiters, pings, lease).await {
        Ok(value) => value,
        Err(message) => json!({ "error": message }),
    };
    say(&line.to_string())
}

/// One S4 waiter: its own handle, one `lock()`, reports when it got the lock, unlocks.
async fn s4_waiter(
    locks: LockClient,
    index: usize,
    acquired: mpsc::UnboundedSender<Instant>,
) -> Result<(), String> {
    let mutex = locks
        .mutex(&format!("s4-{index}"))
        .map_err(|err| err.to_string())?;
    let guard = mutex.lock().await.map_err(|err| err.to_string())?;
    let _ = acquired.send(Instant::now());
    guard.unlock().await.map_err(|err| err.to_string())
}

async fn s4(
    url: &str,
    mode: NotificationMode,
    prefix: &str,
    n: usize,
    pings: u64,
    holder_lease: Lease,
) -> Result<Json, String> {
    let probe = plain_client(url).await?;
    let baseline = connected_clients(&probe).await?;
    let holder = connect(url, mode, prefix).await?;
    let after_holder = connected_clients(&probe).await?;

    // The holder takes every lock first (normally a fixed lease: no renewal traffic).
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..n {
        let lock = holder
            .mutex(&format!("s4-{i}"))
            .and_then(|m| m.with_lease(holder_lease))
            .map_err(|err| err.to_string())?;
        pending.spawn(async move { lock.lock().await });
        if pending.len() >= 256 || i + 1 == n {
            while let Some(taken) = pending.join_next().await {
                guards.push(
                    taken
                        .map_err(|err| err.to_string())?
                        .map_err(|err| format!("S4 holder: {err}"))?
                        .into(),
                );
            }
        }
    }
    let holder_lock_s = started.elapsed().as_secs_f64();

    let waiting = connect(url, mode, prefix).await?;
    let after_waiting = connected_clients(&probe).await?;
    let ping = ping_summary(waiting.redis(), pings).await?;
    let sizer = waiting.mutex("s4-size").map_err(|err| err.to_string())?;
    let lock_future_bytes = size_of(&sizer.lock());
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let task_future_bytes = size_of(&s4_waiter(waiting.clone(), 0, tx.clone()));
    let mut handles = Vec::with_capacity(n);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = command_stats(&probe).await?;
    let rss_before = rss_bytes().unwrap_or(0);
    let heap_before = heap_live();
    let started = Instant::now();
    for i in 0..n {
        handles.push(tokio::spawn(s4_waiter(waiting.clone(), i, tx.clone())));
    }
    drop(tx);
    wait_for_evalsha(&probe, &before, n as u64).await?;
    let first_attempts_s = started.elapsed().as_secs_f64();
    // Let replies and buffers of the burst settle before reading RSS.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_after = rss_bytes().unwrap_or(0);
    let heap_after = heap_live();
    let while_waiting = connected_clients(&probe).await?;
    let stats = waiting.stats();

    let released_at = Instant::now();
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.unlock());
        if releases.len() >= 256 {
            while let Some(done) = releases.join_next().await {
                done.map_err(|err| err.to_string())?
                    .map_err(|err| format!("S4 holder unlock: {err}"))?;
            }
        }
    }
    while let Some(done) = releases.join_next().await {
        done.map_err(|err| err.to_string())?
            .map_err(|err| format!("S4 holder unlock: {err}"))?;
    }
    let release_s = released_at.elapsed().as_secs_f64();
    let mut last = released_at;
    for _ in 0..n {
        match tokio::time::timeout(Duration::from_secs(120), rx.recv()).await {
            Ok(Some(at)) => last = last.max(at),
            _ => return Err("S4: not every waiter acquired after the release".into()),
        }
    }
    for handle in handles {
        handle.await.map_err(|err| err.to_string())??;
    }
    shutdown(&holder).await?;
    shutdown(&waiting).await?;
    let _ = probe.quit().await;
    let rss_delta = rss_after.saturating_sub(rss_before);
    Ok(json!({
        "waiters": n,
        "holder_lease": format!("{holder_lease:?}"),
        "ping": ping.json(),
        "connections": {
            "baseline": baseline,
            "after_holder": after_holder,
            "after_waiting_client": after_waiting,
            "while_waiting": while_waiting,
            "holder_client": after_holder.saturating_sub(baseline),
            "waiting_client": while_waiting.saturating_sub(after_holder),
        },
        "client_stats_while_waiting": {
            "waiting": stats.waiting,
            "waiting_locks": stats.waiting_locks,
            "held": stats.held,
            "queued_in_redis": stats.queued_in_redis,
        },
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "rss_per_waiter_bytes": round(rss_delta as f64 / n as f64, 1),
        "heap_before_bytes": heap_before,
        "heap_after_bytes": heap_after,
        "heap_per_waiter_bytes": round((heap_after - heap_before) as f64 / n as f64, 1),
        "lock_future_bytes": lock_future_bytes,
        "task_future_bytes": task_future_bytes,
        "holder_lock_s": round(holder_lock_s, 3),
        "first_attempts_s": round(first_attempts_s, 3),
        "release_s": round(release_s, 3),
        "all_acquired_after_release_s": round((last - released_at).as_secs_f64(), 3),
    }))
}
