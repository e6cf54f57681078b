//! S5, wakeup latency, Stream vs Pub/Sub: per mode one holder `LockClient` and 4 waiter
//! `LockClient`s in this process; each round the holder takes the lock, each waiter client
//! starts one `lock()`; once all have tried (`INFO commandstats`) and 5 ms passed, the holder
//! calls `unlock()`. Latency = `unlock()` called → the first waiter's `lock()` returned.
//! `--s5-rounds` (500; 100 with `--quick`), modes interleaved in blocks of 10 rounds. Also a
//! PING after the same 5 ms idle pause, each round. Target: stream p50 ≤ 1.2 × pubsub p50.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fredlock::{LockClient, NotificationMode};
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;

use crate::measure::{ms, ping_once, ping_summary, progress, ratio, round, Summary};
use crate::redis::{command_stats, connect, shutdown, wait_for_evalsha, HANG};
use crate::run::ModeCtx;

/// Waiting clients, the idle pause before each release, rounds per interleaved block.
pub const S5_CLIENTS: usize = 4;
pub const S5_SETTLE: Duration = Duration::from_millis(5);
const S5_BLOCK: usize = 10;

/// One mode's clients and samples.
pub struct S5Side {
    pub mode: NotificationMode,
    pub holder: LockClient,
    pub clients: Vec<LockClient>,
    pub lock: fredlock::Mutex,
    pub waiter_locks: Vec<fredlock::Mutex>,
    pub ping_hot: Summary,
    pub latency: Vec<Duration>,
    pub unlock: Vec<Duration>,
    pub idle_ping: Vec<Duration>,
    pub overlaps: u64,
    pub wakeups_before: u64,
}

pub struct S5Mode {
    pub mode: NotificationMode,
    pub ping_hot: Summary,
    pub ping_idle: Summary,
    pub latency: Summary,
    pub unlock: Summary,
    pub wakeups_per_round: f64,
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
                        "wakeups_per_round": round(m.wakeups_per_round, 3),
                        "overlaps": m.overlaps,
                    }),
                )
            })
            .collect();
        json!({
            "rounds": self.rounds,
            "waiting_clients": S5_CLIENTS,
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
        let holder = connect(ctx.url, ctx.mode, &prefix).await?;
        let mut clients = Vec::new();
        for _ in 0..S5_CLIENTS {
            clients.push(connect(ctx.url, ctx.mode, &prefix).await?);
        }
        let lock = holder.mutex("s5").map_err(|err| err.to_string())?;
        let waiter_locks = clients
            .iter()
            .map(|c| c.mutex("s5"))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| err.to_string())?;
        let ping_hot = ping_summary(holder.redis(), args.pings).await?;
        let wakeups_before = clients.iter().map(|c| c.stats().wakeups).sum();
        sides.push(S5Side {
            mode: ctx.mode,
            holder,
            clients,
            lock,
            waiter_locks,
            ping_hot,
            latency: Vec::new(),
            unlock: Vec::new(),
            idle_ping: Vec::new(),
            overlaps: 0,
            wakeups_before,
        });
    }
    progress(&format!(
        "s5: {} rounds per mode, 1 holder + {S5_CLIENTS} waiting clients, modes interleaved",
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
        let wakeups: u64 = side.clients.iter().map(|c| c.stats().wakeups).sum();
        let mode = S5Mode {
            mode: side.mode,
            ping_hot: side.ping_hot,
            ping_idle: Summary::of_durations(&side.idle_ping),
            latency: Summary::of_durations(&side.latency),
            unlock: Summary::of_durations(&side.unlock),
            wakeups_per_round: (wakeups - side.wakeups_before) as f64
                / side.latency.len().max(1) as f64,
            overlaps: side.overlaps,
        };
        progress(&format!(
            "s5 {}: wakeup latency p50 {:.1} µs = {:.2} × PING ({:.2} × idle PING), p99 {:.1} µs",
            mode.mode.as_str(),
            mode.latency.p50,
            ratio(mode.latency.p50, mode.ping_hot.p50),
            ratio(mode.latency.p50, mode.ping_idle.p50),
            mode.latency.p99
        ));
        modes.push(mode);
        shutdown(&side.holder).await?;
        for client in &side.clients {
            shutdown(client).await?;
        }
    }
    Ok(S5Result {
        rounds: args.s5_rounds,
        modes,
    })
}

/// One S5 round: the holder takes the lock, every waiting client starts one `lock()`, and once
/// all have tried and [`S5_SETTLE`] passed, the holder releases.
pub async fn s5_round(side: &mut S5Side) -> Result<(), String> {
    let guard = side
        .lock
        .lock()
        .await
        .map_err(|err| format!("S5 holder: {err}"))?;
    let inside = Arc::new(AtomicUsize::new(1));
    let before = command_stats(side.holder.redis()).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let mut tasks = Vec::new();
    for lock in &side.waiter_locks {
        let (lock, tx, inside) = (lock.clone(), tx.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.map_err(|err| err.to_string())?;
            let at = Instant::now();
            let overlap = inside.fetch_add(1, Ordering::SeqCst) != 0;
            let _ = tx.send(at);
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.unlock().await.map_err(|err| err.to_string())?;
            Ok::<bool, String>(overlap)
        }));
    }
    drop(tx);
    wait_for_evalsha(side.holder.redis(), &before, side.waiter_locks.len() as u64).await?;
    tokio::time::sleep(S5_SETTLE).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    let unlock_called = Instant::now();
    guard
        .unlock()
        .await
        .map_err(|err| format!("S5 holder unlock: {err}"))?;
    side.unlock.push(unlock_called.elapsed());
    let mut earliest: Option<Instant> = None;
    while let Some(at) = tokio::time::timeout(HANG, rx.recv())
        .await
        .map_err(|_| "S5: a waiter did not get the lock".to_owned())?
    {
        earliest = Some(earliest.map_or(at, |e| e.min(at)));
    }
    for task in tasks {
        if task.await.map_err(|err| err.to_string())?? {
            side.overlaps += 1;
        }
    }
    let earliest = earliest.ok_or("S5: no waiter got the lock")?;
    side.latency
        .push(earliest.saturating_duration_since(unlock_called));
    tokio::time::sleep(S5_SETTLE).await;
    side.idle_ping.push(ping_once(side.holder.redis()).await?);
    Ok(())
}
