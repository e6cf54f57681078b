//! S6, recovery: 100 tasks of one client wait on one lock (one of them queued in Redis, the
//! others behind it in the process), or on 100 distinct locks, held by another client with a
//! fixed 120 s lease. The waiting client's notifier connection is
//! killed (Pub/Sub: `CLIENT KILL TYPE pubsub`; Stream: `CLIENT KILL ID` of its `cmd=xread`
//! connection) and the holder releases right after. Time until all 100 acquired, and when the
//! killed notifier connection(s) came back (`CLIENT LIST`). Target: all within 1 s of the
//! release plus the reconnect delay (a lease expiry would take 120 s). `--s6-reps` (5; 1 with
//! `--quick`) runs per variant.
//!
//! S4 and S6 first check that an acquisition with a fixed lease completes (see
//! [`crate::run::holder_lease`]); when it does not, their holders use a watchdog lease of the
//! same 120 s instead, and the report says so.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::ClusterHash;
use fredlock::NotificationMode;
use serde_json::{json, Value as Json};
use tokio::sync::mpsc;

use crate::measure::{ms, ping_summary, progress, round2, Summary};
use crate::redis::{
    command_stats, connect, new_notifiers, notifier_ids, plain_client, raw_command, shutdown,
    wait_for_evalsha,
};
use crate::run::{HolderLease, ModeCtx};

/// Waiting tasks, and the bound that only a lost wakeup can exceed.
pub const S6_WAITERS: usize = 100;
const S6_LIMIT: Duration = Duration::from_secs(30);

pub struct S6Run {
    pub distinct: bool,
    /// Notifier connections killed.
    pub killed: u64,
    /// Kill → the killed notifier connection(s) reading again (`CLIENT LIST`), if seen.
    pub reconnect: Option<Duration>,
    /// Kill → release call.
    pub kill_to_release: Duration,
    /// Release → each waiter's `lock()` returned, sorted.
    pub acquired: Vec<Duration>,
    pub wakeups: u64,
}

impl S6Run {
    pub fn variant(&self) -> &'static str {
        if self.distinct {
            "100 locks"
        } else {
            "one lock"
        }
    }

    pub fn all_acquired(&self) -> bool {
        self.acquired.len() == S6_WAITERS
    }

    pub fn last(&self) -> Option<Duration> {
        self.acquired.last().copied()
    }

    /// All acquired within 1 s of the release, plus the reconnect delay.
    pub fn met(&self) -> bool {
        let allowed = Duration::from_secs(1) + self.reconnect.unwrap_or(Duration::ZERO);
        self.all_acquired() && self.last().is_some_and(|last| last <= allowed)
    }

    pub fn json(&self) -> Json {
        json!({
            "variant": self.variant(),
            "killed_connections": self.killed,
            "reconnect_ms": self.reconnect.map(|d| round2(ms(d))),
            "kill_to_release_ms": round2(ms(self.kill_to_release)),
            "acquired": self.acquired.len(),
            "first_acquired_ms": self.acquired.first().map(|d| round2(ms(*d))),
            "median_acquired_ms": self.acquired.get(self.acquired.len() / 2).map(|d| round2(ms(*d))),
            "last_acquired_ms": self.last().map(|d| round2(ms(d))),
            "wakeups": self.wakeups,
            "met": self.met(),
        })
    }
}

pub struct S6Result {
    pub ping: Summary,
    pub holder_lease: HolderLease,
    pub runs: Vec<S6Run>,
}

pub async fn run_s6(ctx: &ModeCtx<'_>) -> Result<S6Result, String> {
    let prefix = format!("{}-s6", ctx.prefix);
    let probe = plain_client(ctx.url).await?;
    let reference = connect(ctx.url, ctx.mode, &prefix).await?;
    let ping = ping_summary(reference.redis(), ctx.args.pings).await?;
    shutdown(&reference).await?;
    let mut runs = Vec::new();
    for distinct in [false, true] {
        for rep in 0..ctx.args.s6_reps {
            let run = s6_run(ctx, &probe, &prefix, distinct, rep).await?;
            progress(&format!(
                "s6 {} {}: {} of {S6_WAITERS} acquired, the last {:.1} ms after the release; \
                 notifier back {} ms after the kill",
                ctx.name(),
                run.variant(),
                run.acquired.len(),
                run.last().map_or(f64::NAN, ms),
                run.reconnect
                    .map_or_else(|| "?".to_owned(), |d| format!("{:.1}", ms(d)))
            ));
            runs.push(run);
        }
    }
    let _ = probe.quit().await;
    Ok(S6Result {
        ping,
        holder_lease: ctx.holder_lease,
        runs,
    })
}

pub async fn s6_run(
    ctx: &ModeCtx<'_>,
    probe: &Client,
    prefix: &str,
    distinct: bool,
    rep: usize,
) -> Result<S6Run, String> {
    let mode = ctx.mode;
    // Each client's notifier: the notifier connection that appears when it connects.
    let existing = notifier_ids(probe, mode).await?;
    let waiting = connect(ctx.url, mode, prefix).await?;
    let notifier = new_notifiers(probe, mode, &existing).await?;
    let existing: HashSet<u64> = existing.union(&notifier).copied().collect();
    let holder = connect(ctx.url, mode, prefix).await?;
    let holder_notifier = new_notifiers(probe, mode, &existing).await?;
    let names: Vec<String> = if distinct {
        (0..S6_WAITERS).map(|i| format!("s6-{rep}-{i}")).collect()
    } else {
        vec![format!("s6-one-{rep}")]
    };
    let mut guards = Vec::new();
    for name in &names {
        let lock = holder
            .mutex(name)
            .and_then(|m| m.with_lease(ctx.holder_lease.lease()))
            .map_err(|err| err.to_string())?;
        guards.push(
            lock.lock()
                .await
                .map_err(|err| format!("S6 holder: {err}"))?,
        );
    }
    let before = command_stats(probe).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
    let mut tasks = Vec::new();
    for i in 0..S6_WAITERS {
        let lock = waiting
            .mutex(&names[i % names.len()])
            .map_err(|err| err.to_string())?;
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.map_err(|err| err.to_string())?;
            let _ = tx.send(Instant::now());
            guard.unlock().await.map_err(|err| err.to_string())
        }));
    }
    drop(tx);
    // One attempt per lock reaches Redis (the lock's envoy); the other tasks of a lock wait
    // behind it in the process.
    wait_for_evalsha(probe, &before, names.len() as u64).await?;
    let deadline = Instant::now() + S6_LIMIT;
    while waiting.stats().waiting < S6_WAITERS {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {S6_WAITERS} tasks waiting within {S6_LIMIT:?}",
                waiting.stats().waiting
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let wakeups_before = waiting.stats().wakeups;

    // Kill, then release at once. The killed connections of this run's two clients (only the
    // waiting client's in Stream mode) must come back.
    let before_kill = notifier_ids(probe, mode).await?;
    let ours = match mode {
        NotificationMode::Stream => notifier.len(),
        _ => notifier.len() + holder_notifier.len(),
    } as u64;
    let killed_at = Instant::now();
    let killed: u64 = match mode {
        NotificationMode::PubSub => {
            raw_command(
                probe,
                "CLIENT",
                ClusterHash::Random,
                vec!["KILL".into(), "TYPE".into(), "pubsub".into()],
            )
            .await?
        }
        _ => {
            let mut killed = 0;
            for id in &notifier {
                let n: u64 = raw_command(
                    probe,
                    "CLIENT",
                    ClusterHash::Random,
                    vec!["KILL".into(), "ID".into(), id.to_string()],
                )
                .await?;
                killed += n;
            }
            killed
        }
    };
    let release_at = Instant::now();
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.unlock());
    }
    let watcher = {
        let probe = probe.clone();
        tokio::spawn(async move {
            // The killed connections are back once as many new notifier connections exist.
            let deadline = killed_at + Duration::from_secs(10);
            while Instant::now() < deadline {
                let ids = notifier_ids(&probe, mode).await.unwrap_or_default();
                if ids.difference(&before_kill).count() as u64 >= ours.clamp(1, killed.max(1)) {
                    return Some(killed_at.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            None
        })
    };
    while let Some(released) = releases.join_next().await {
        released
            .map_err(|err| err.to_string())?
            .map_err(|err| format!("S6 holder unlock: {err}"))?;
    }
    let mut acquired = Vec::with_capacity(S6_WAITERS);
    let limit = release_at + S6_LIMIT;
    while acquired.len() < S6_WAITERS {
        let left = limit.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(at)) => acquired.push(at.saturating_duration_since(release_at)),
            Ok(None) | Err(_) => break,
        }
    }
    acquired.sort();
    let reconnect = watcher.await.map_err(|err| err.to_string())?;
    let wakeups = waiting.stats().wakeups - wakeups_before;
    for task in tasks {
        task.abort();
    }
    shutdown(&holder).await?;
    shutdown(&waiting).await?;
    Ok(S6Run {
        distinct,
        killed,
        reconnect,
        kill_to_release: release_at - killed_at,
        acquired,
        wakeups,
    })
}
