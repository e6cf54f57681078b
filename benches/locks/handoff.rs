//! Fair hand-off with 10 vs 1000 queued waiters: one process; a client holds a fair lock while
//! N tasks of a second client queue on it (N queued in its hash), then releases; each task unlocks as
//! soon as it acquires. Gap = a task's `lock()` returned − the previous holder's `unlock()`
//! call. N = 10 (5 batches: 50 gaps) and N = 1000 (the first 50 gaps of each batch, while ≥ 950
//! are queued; 2 batches, 1 with `--quick`). Target: p50(1000) ≤ 2 × p50(10).

use std::time::{Duration, Instant};

use fredlock::LockClient;
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;

use crate::measure::{ms, ping_summary, progress, ratio, round, round2, Summary};
use crate::redis::{connect_with, fair_hold_key, queued, shutdown, HANG};
use crate::run::ModeCtx;

/// Gaps measured per batch.
pub const HANDOFF_GAPS: usize = 50;

/// One queue length.
pub struct HandoffCase {
    pub waiters: usize,
    pub batches: usize,
    /// The first `HANDOFF_GAPS` gaps of every batch.
    pub gaps: Summary,
    /// Every gap (the whole queue draining).
    pub all_gaps: Summary,
    /// Longest time until all waiters of a batch were in the Redis queue.
    pub fill_max: Duration,
    /// Wakeups delivered per hand-off.
    pub wakeups_per_handoff: f64,
}

pub struct HandoffResult {
    pub ping: Summary,
    pub cases: Vec<HandoffCase>,
}

impl HandoffResult {
    /// p50 with the most waiters over p50 with the fewest.
    pub fn growth(&self) -> Option<f64> {
        let first = self.cases.first()?;
        let last = self.cases.last()?;
        (self.cases.len() > 1).then(|| last.gaps.p50 / first.gaps.p50.max(1e-9))
    }

    pub fn json(&self) -> Json {
        let cases: Vec<Json> = self
            .cases
            .iter()
            .map(|c| {
                json!({
                    "waiters": c.waiters,
                    "batches": c.batches,
                    "gaps": c.gaps.json(),
                    "gaps_per_ping": c.gaps.json_per_ping(self.ping.p50),
                    "all_gaps": c.all_gaps.json(),
                    "fill_max_ms": round2(ms(c.fill_max)),
                    "wakeups_per_handoff": round(c.wakeups_per_handoff, 3),
                })
            })
            .collect();
        json!({
            "ping": self.ping.json(),
            "cases": cases,
            "p50_growth": self.growth().map(|g| round(g, 3)),
        })
    }
}

pub async fn run_handoff(ctx: &ModeCtx<'_>) -> Result<HandoffResult, String> {
    let args = ctx.args;
    let prefix = format!("{}-s3", ctx.prefix);
    let holder = connect_with(ctx.url, ctx.mode, &prefix, 1).await?;
    let waiting = connect_with(ctx.url, ctx.mode, &prefix, 1).await?;
    let ping = ping_summary(waiting.redis(), args.pings).await?;
    let mut cases = Vec::new();
    for (n, batches) in [
        (10, args.handoff_batches_10),
        (1000, args.handoff_batches_1000),
    ] {
        let (mut first, mut all, mut fill_max) = (Vec::new(), Vec::new(), Duration::ZERO);
        let mut wakeups = 0;
        for batch in 0..batches {
            let before = waiting.stats().wakeups;
            let outcome = handoff_batch(&holder, &waiting, &prefix, n, batch).await?;
            wakeups += waiting.stats().wakeups - before;
            first.extend(outcome.gaps.iter().take(HANDOFF_GAPS));
            all.extend(outcome.gaps);
            fill_max = fill_max.max(outcome.fill);
        }
        let case = HandoffCase {
            waiters: n,
            batches,
            gaps: Summary::of_durations(&first),
            all_gaps: Summary::of_durations(&all),
            fill_max,
            wakeups_per_handoff: wakeups as f64 / all.len().max(1) as f64,
        };
        progress(&format!(
            "fair-handoff {}: {n} queued: gap p50 {:.1} µs = {:.2} × PING, p99 {:.1} µs",
            ctx.name(),
            case.gaps.p50,
            ratio(case.gaps.p50, ping.p50),
            case.gaps.p99
        ));
        cases.push(case);
    }
    shutdown(&holder).await?;
    shutdown(&waiting).await?;
    Ok(HandoffResult { ping, cases })
}

pub struct BatchOutcome {
    /// In acquisition order: the gap before each acquisition.
    pub gaps: Vec<Duration>,
    pub fill: Duration,
}

pub async fn handoff_batch(
    holder: &LockClient,
    waiting: &LockClient,
    prefix: &str,
    n: usize,
    batch: usize,
) -> Result<BatchOutcome, String> {
    let name = format!("handoff-{n}-{batch}");
    let guard = holder
        .fair_mutex(&name)
        .map_err(|err| err.to_string())?
        .lock()
        .await
        .map_err(|err| format!("hand-off holder: {err}"))?;
    let mutex = waiting.fair_mutex(&name).map_err(|err| err.to_string())?;
    let hold = fair_hold_key(prefix, &name);
    // (acquired, unlock called)
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Instant)>();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (mutex, tx) = (mutex.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.map_err(|err| err.to_string())?;
            let acquired = Instant::now();
            let released = Instant::now();
            guard.unlock().await.map_err(|err| err.to_string())?;
            let _ = tx.send((acquired, released));
            Ok::<(), String>(())
        }));
    }
    drop(tx);
    while queued(holder.redis(), &hold).await? < n as u64 {
        if started.elapsed() > HANG {
            return Err(format!("not all {n} waiters joined {hold} within {HANG:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let fill = started.elapsed();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let release = Instant::now();
    guard
        .unlock()
        .await
        .map_err(|err| format!("hand-off holder unlock: {err}"))?;
    let mut records = Vec::with_capacity(n);
    while records.len() < n {
        match tokio::time::timeout(HANG, rx.recv()).await {
            Ok(Some(record)) => records.push(record),
            Ok(None) => break,
            Err(_) => return Err(format!("hand-off {n}: a waiter hung")),
        }
    }
    for task in tasks {
        task.await.map_err(|err| err.to_string())??;
    }
    if records.len() < n {
        return Err(format!(
            "hand-off {n}: only {} waiters acquired",
            records.len()
        ));
    }
    records.sort_by_key(|&(acquired, _)| acquired);
    let mut gaps = Vec::with_capacity(n);
    let mut previous = release;
    for &(acquired, released) in &records {
        gaps.push(acquired.saturating_duration_since(previous));
        previous = released;
    }
    Ok(BatchOutcome { gaps, fill })
}
