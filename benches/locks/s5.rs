//! S5, wakeup latency, Stream vs Pub/Sub: per mode one holder `LockClient` in this process
//! and 4 waiting `LockClient`s, each in a worker process of its own (the S3 workers, see
//! [`crate::s3::child`]), so that a waiter's wake-up never competes with the holder's
//! `unlock()` for a runtime. Each round the holder takes the lock, each worker starts one
//! `lock()`; once all have tried (`INFO commandstats`) and 5 ms passed, the holder calls
//! `unlock()`. Latency = `unlock()` called → the first waiter's `lock()` returned, both read
//! from the machine's wall clock (one clock for all processes on one host). Also the
//! holder's `unlock()` call itself, and a PING after the same 5 ms idle pause, each round.
//! `--s5-rounds` (500; 100 with `--quick`), modes interleaved in blocks of 10 rounds. Targets:
//! stream p50 ≤ 1.2 × pubsub p50; wake-up p50 ≤ 2 × the idle PING p50 and the holder's
//! `unlock()` p50 ≤ 1.2 × PING p50, in both modes.

use std::time::{Duration, Instant};

use fredlock::NotificationMode;
use serde_json::{json, Value as Json};

use crate::loop_stats::overlaps;
use crate::measure::{ms, now_us, ping_once, ping_summary, progress, ratio, round, Summary};
use crate::peers::{AnyLock, LockKind, Side};
use crate::redis::{command_stats, wait_for_evalsha, HANG};
use crate::run::ModeCtx;
use crate::s3::parse_acq;
use crate::workers::{start_workers, Worker};

/// Waiting processes, the idle pause before each release, rounds per interleaved block.
pub const S5_CLIENTS: usize = 4;
pub const S5_SETTLE: Duration = Duration::from_millis(5);
const S5_BLOCK: usize = 10;
/// The lock's name.
const S5_LOCK: &str = "s5";

/// One mode's holder, waiting processes and samples.
pub struct S5Side {
    pub mode: NotificationMode,
    pub holder: Side,
    pub lock: AnyLock,
    pub workers: Vec<Worker>,
    pub ping_hot: Summary,
    pub latency: Vec<Duration>,
    pub unlock: Vec<Duration>,
    pub idle_ping: Vec<Duration>,
    pub overlaps: u64,
    /// Events sent to the inboxes (`XADD`, `PUBLISH`, `SPUBLISH`), over all rounds.
    pub events: u64,
}

pub struct S5Mode {
    pub mode: NotificationMode,
    pub ping_hot: Summary,
    pub ping_idle: Summary,
    pub latency: Summary,
    pub unlock: Summary,
    pub events_per_round: f64,
    pub overlaps: u64,
}

pub struct S5Result {
    pub rounds: usize,
    pub modes: Vec<S5Mode>,
}

impl S5Result {
    pub fn mode(&self, mode: NotificationMode) -> Option<&S5Mode> {
        self.modes.iter().find(|m| m.mode == mode)
    }

    /// Stream p50 over Pub/Sub p50.
    pub fn stream_over_pubsub(&self) -> Option<f64> {
        let stream = self.mode(NotificationMode::Stream)?;
        let pubsub = self.mode(NotificationMode::PubSub)?;
        Some(stream.latency.p50 / pubsub.latency.p50.max(1e-9))
    }

    pub fn json(&self) -> Json {
        let modes: serde_json::Map<String, Json> = self
            .modes
            .iter()
            .map(|m| {
                (
                    m.mode.as_str().to_owned(),
                    json!({
                        "ping": m.ping_hot.json(),
                        "ping_after_idle": m.ping_idle.json(),
                        "latency": m.latency.json(),
                        "latency_per_ping": m.latency.json_per_ping(m.ping_hot.p50),
                        "latency_per_idle_ping": m.latency.json_per_ping(m.ping_idle.p50),
                        "unlock_call": m.unlock.json(),
                        "events_per_round": round(m.events_per_round, 3),
                        "overlaps": m.overlaps,
                    }),
                )
            })
            .collect();
        json!({
            "rounds": self.rounds,
            "waiting_processes": S5_CLIENTS,
            "settle_ms": ms(S5_SETTLE),
            "modes": modes,
            "stream_p50_over_pubsub_p50": self.stream_over_pubsub().map(|r| round(r, 3)),
        })
    }
}

pub async fn run_s5(ctxs: &[ModeCtx<'_>]) -> Result<S5Result, String> {
    let Some(first) = ctxs.first() else {
        return Err("no mode selected".into());
    };
    let args = first.args;
    let mut sides = Vec::new();
    for ctx in ctxs {
        let prefix = format!("{}-s5", ctx.prefix);
        // One shard, as the S3 workers open their clients.
        let holder = Side::open(ctx.url, ctx.mode, &prefix, 1, true).await?;
        let lock = holder.lock(LockKind::Mutex, S5_LOCK).await?;
        let params = |id: usize| json!({ "role": "s3", "mode": ctx.name(), "prefix": prefix, "id": id, "fredlock": true });
        let workers = start_workers(ctx.url, S5_CLIENTS, params).await?;
        let ping_hot = ping_summary(holder.redis(), args.pings).await?;
        sides.push(S5Side {
            mode: ctx.mode,
            holder,
            lock,
            workers,
            ping_hot,
            latency: Vec::new(),
            unlock: Vec::new(),
            idle_ping: Vec::new(),
            overlaps: 0,
            events: 0,
        });
    }
    progress(&format!(
        "s5: {} rounds per mode, 1 holder + {S5_CLIENTS} waiting processes, modes interleaved",
        args.s5_rounds
    ));
    let mut done = 0;
    while done < args.s5_rounds {
        let block = S5_BLOCK.min(args.s5_rounds - done);
        for side in &mut sides {
            for _ in 0..block {
                s5_round(side).await?;
            }
        }
        done += block;
    }
    let mut modes = Vec::new();
    for side in sides {
        let mode = S5Mode {
            mode: side.mode,
            ping_hot: side.ping_hot,
            ping_idle: Summary::of_durations(&side.idle_ping),
            latency: Summary::of_durations(&side.latency),
            unlock: Summary::of_durations(&side.unlock),
            events_per_round: side.events as f64 / side.latency.len().max(1) as f64,
            overlaps: side.overlaps,
        };
        progress(&format!(
            "s5 {}: wakeup latency p50 {:.1} µs = {:.2} × PING ({:.2} × idle PING), p99 {:.1} µs; \
             unlock() p50 {:.1} µs = {:.2} × PING",
            mode.mode.as_str(),
            mode.latency.p50,
            ratio(mode.latency.p50, mode.ping_hot.p50),
            ratio(mode.latency.p50, mode.ping_idle.p50),
            mode.latency.p99,
            mode.unlock.p50,
            ratio(mode.unlock.p50, mode.ping_hot.p50),
        ));
        modes.push(mode);
        for mut worker in side.workers {
            worker.send("QUIT").await?;
            worker.finish().await?;
        }
        side.holder.shutdown().await?;
    }
    Ok(S5Result {
        rounds: args.s5_rounds,
        modes,
    })
}

/// One S5 round: the holder takes the lock, every waiting process starts one `lock()`, and
/// once all have tried and [`S5_SETTLE`] passed, the holder releases. Each waiter holds the
/// lock for a `GET` + `SET` and releases it in turn.
pub async fn s5_round(side: &mut S5Side) -> Result<(), String> {
    let guard = side
        .lock
        .lock(false)
        .await
        .map_err(|err| format!("S5 holder: {err}"))?;
    let redis = side.holder.redis().clone();
    let before = command_stats(&redis).await?;
    for worker in side.workers.iter_mut() {
        let start = format!("START {} {S5_LOCK} {}", LockKind::Mutex.name(), worker.id);
        worker.send(&start).await?;
    }
    wait_for_evalsha(&redis, &before, side.workers.len() as u64).await?;
    tokio::time::sleep(S5_SETTLE).await;
    let released = now_us();
    let unlock_called = Instant::now();
    guard
        .unlock()
        .await
        .map_err(|err| format!("S5 holder unlock: {err}"))?;
    side.unlock.push(unlock_called.elapsed());
    let mut records = Vec::with_capacity(side.workers.len());
    for worker in side.workers.iter_mut() {
        let line = worker.next_line(HANG).await?;
        let (_, record) = parse_acq(&line).ok_or_else(|| format!("S5: bad line {line:?}"))?;
        records.push(record);
    }
    let first = records
        .iter()
        .map(|r| r.acquire)
        .min()
        .ok_or("S5: no waiter got the lock")?;
    side.latency
        .push(Duration::from_micros(first.saturating_sub(released)));
    // A waiter inside before the holder let go, or two waiters inside at once.
    side.overlaps += records.iter().filter(|r| r.acquire < released).count() as u64;
    side.overlaps += overlaps(&records);
    let sent = command_stats(&redis).await?.since(&before);
    side.events += ["xadd", "publish", "spublish"]
        .iter()
        .map(|name| sent.calls(name))
        .sum::<u64>();
    tokio::time::sleep(S5_SETTLE).await;
    side.idle_ping.push(ping_once(&redis).await?);
    Ok(())
}
