//! S1, uncontended: one task, one lock name; `--cycles` (5000; 1000 with `--quick`) cycles of
//! `lock()` + `unlock().await` after `--warmup` (500), each followed by one cycle of every peer
//! on the same fred client (naive) or its own connection (rslock) and one PING. Cycle p50/p99
//! and its two halves, the ratio to PING p50 and to the naive cycle's p50. Then, as the floor
//! of a cycle, `--cycles` pairs of bare `EVALSHA`s of `return 1` with the key and argument
//! shapes of the fast take and release scripts (`hold_take`, `hold_free`), each pair right after one more cycle (so that
//! both see the same machine state), and `--cycles` fredlock cycles alone for the Redis
//! command count per cycle. Those cycles, and as many naive cycles alone, also give the CPU a
//! cycle costs the bench process (the client: fredlock's code and fred's) and the server
//! (`INFO cpu`): where the time of a cycle goes beyond its two round trips.

use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::LuaInterface;

use crate::measure::{
    histogram, ping_once, ping_warmup, process_cpu_us, progress, ratio, record, Summary,
};
use crate::peers::{AnyLock, LockKind, Naive, Rslock};
use crate::redis::{command_stats, connect, server_cpu_us, shutdown, CommandStats};
use crate::run::ModeCtx;

/// The lock every S1 cycle takes.
const S1_LOCK: &str = "bench-s1";

/// S1: uncontended lock + unlock cycles on one name from one task.
pub struct S1Result {
    pub ping: Summary,
    pub cycle: Summary,
    pub lock: Summary,
    pub unlock: Summary,
    /// The peers' cycles, interleaved with fredlock's.
    pub peers: Vec<(LockKind, Summary)>,
    /// The floor: two `EVALSHA`s of a script that only does `return 1`, with the keys and
    /// arguments of `hold_take` and then `hold_free` (measured after the cycles).
    pub floor: Summary,
    /// Redis command statistics of `cycles` fredlock cycles alone.
    pub commands: CommandStats,
    /// The CPU of those cycles, and of as many naive cycles alone (if the naive peer ran).
    pub cpu: CycleCpu,
    pub naive_cpu: Option<CycleCpu>,
    pub cycles: u64,
}

/// CPU µs per cycle of a run of cycles alone: the bench process's (the client) and the
/// server's.
#[derive(Clone, Copy)]
pub struct CycleCpu {
    pub client_us: f64,
    pub redis_us: f64,
}

impl CycleCpu {
    /// Measures `cycles` runs of `cycle` (the client CPU of the whole bench process: nothing
    /// else runs meanwhile).
    async fn of<F, Fut>(redis: &Client, cycles: u64, mut cycle: F) -> Result<CycleCpu, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let pid = std::process::id();
        let client_cpu = || process_cpu_us(pid).ok_or("cannot read the bench's CPU time");
        let (client_before, redis_before) = (client_cpu()?, server_cpu_us(redis).await?);
        for _ in 0..cycles {
            cycle().await?;
        }
        let (client_after, redis_after) = (client_cpu()?, server_cpu_us(redis).await?);
        let per_cycle =
            |before: u64, after: u64| after.saturating_sub(before) as f64 / cycles as f64;
        Ok(CycleCpu {
            client_us: per_cycle(client_before, client_after),
            redis_us: per_cycle(redis_before, redis_after),
        })
    }
}

impl S1Result {
    /// fredlock's cycle p50 over the naive cycle's, if the naive peer ran.
    pub fn over_naive(&self) -> Option<f64> {
        self.peers
            .iter()
            .find(|(kind, _)| *kind == LockKind::Naive)
            .map(|(_, naive)| ratio(self.cycle.p50, naive.p50))
    }
}

pub async fn run_s1(ctx: &ModeCtx<'_>) -> Result<S1Result, String> {
    let args = ctx.args;
    let locks = connect(ctx.url, ctx.mode, &ctx.prefix).await?;
    let redis = locks.redis();
    let mutex = locks.mutex(S1_LOCK).map_err(|err| err.to_string())?;
    let mut peers: Vec<(LockKind, AnyLock, _)> = Vec::new();
    let manager = rslock::LockManager::new(vec![ctx.url.to_owned()]);
    for &kind in &args.peers {
        let lock = match kind {
            LockKind::Naive => AnyLock::Naive(Naive::on(redis, &ctx.prefix, S1_LOCK).await?),
            _ => AnyLock::Rslock(Rslock::on(&manager, &ctx.prefix, S1_LOCK)),
        };
        peers.push((kind, lock, histogram()));
    }
    for _ in 0..args.warmup {
        s1_cycle(&mutex).await?;
        for (_, peer, _) in &peers {
            peer_cycle(peer).await?;
        }
    }
    ping_warmup(redis).await?;
    progress(&format!(
        "s1 {}: {} cycles (and {} peers' cycles) interleaved with {} PINGs",
        ctx.name(),
        args.cycles,
        peers.len(),
        args.pings
    ));
    let (mut cycle, mut lock, mut unlock) = (histogram(), histogram(), histogram());
    let mut ping = histogram();
    for i in 0..args.cycles.max(args.pings) {
        if i < args.cycles {
            let (locked, unlocked) = s1_cycle(&mutex).await?;
            record(&mut cycle, locked + unlocked);
            record(&mut lock, locked);
            record(&mut unlock, unlocked);
            for (_, peer, hist) in &mut peers {
                record(hist, peer_cycle(peer).await?);
            }
        }
        if i < args.pings {
            record(&mut ping, ping_once(redis).await?);
        }
    }
    // The floor: as many bare pairs, each right after a cycle, so both see the same machine.
    let bare = BarePair::load(redis).await?;
    let mut floor = histogram();
    for _ in 0..args.cycles {
        s1_cycle(&mutex).await?;
        record(&mut floor, bare.run(redis).await?);
    }
    let stats_before = command_stats(redis).await?;
    let cpu = CycleCpu::of(redis, args.cycles, || async {
        s1_cycle(&mutex).await.map(|_| ())
    })
    .await?;
    let commands = command_stats(redis).await?.since(&stats_before);
    let naive_cpu = match peers.iter().find(|(kind, _, _)| *kind == LockKind::Naive) {
        Some((_, naive, _)) => Some(
            CycleCpu::of(redis, args.cycles, || async {
                peer_cycle(naive).await.map(|_| ())
            })
            .await?,
        ),
        None => None,
    };
    shutdown(&locks).await?;
    let result = S1Result {
        ping: Summary::of(&ping, 1e-3),
        cycle: Summary::of(&cycle, 1e-3),
        lock: Summary::of(&lock, 1e-3),
        unlock: Summary::of(&unlock, 1e-3),
        peers: peers
            .into_iter()
            .map(|(kind, _, hist)| (kind, Summary::of(&hist, 1e-3)))
            .collect(),
        floor: Summary::of(&floor, 1e-3),
        commands,
        cpu,
        naive_cpu,
        cycles: args.cycles,
    };
    progress(&format!(
        "s1 {}: PING p50 {:.1} µs, cycle p50 {:.1} µs = {:.2} × PING = {} × naive",
        ctx.name(),
        result.ping.p50,
        result.cycle.p50,
        ratio(result.cycle.p50, result.ping.p50),
        result
            .over_naive()
            .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"))
    ));
    Ok(result)
}

/// One lock + unlock of a peer.
async fn peer_cycle(lock: &AnyLock) -> Result<Duration, String> {
    let started = Instant::now();
    lock.lock(false).await?.unlock().await?;
    Ok(started.elapsed())
}

/// What two script round trips cost by themselves through fred: `EVALSHA` of `return 1` with
/// the key and 6 arguments of `hold_take`, then with the key and 5 arguments of `hold_free`
/// (the fast paths an uncontended cycle takes; lengths as in fredlock's calls). A cycle can be
/// no faster than this pair. S1 times one pair after each cycle, so that both see the same
/// machine.
pub struct BarePair {
    pub sha: String,
}

impl BarePair {
    pub async fn load(client: &Client) -> Result<BarePair, String> {
        let sha: String = client
            .script_load("return 1")
            .await
            .map_err(|err| format!("SCRIPT LOAD failed: {err}"))?;
        Ok(BarePair { sha })
    }

    pub async fn run(&self, client: &Client) -> Result<Duration, String> {
        let id = "0123456789abcdef0123456789abcdef";
        let acquire_keys = vec!["{b:0}:mutex:s1"];
        let release_keys = vec!["{b:0}:mutex:s1"];
        let acquire_args = vec![id, "30000", id, "", "0", ""];
        let release_args = vec![id, "1795807619782796", id, "0", "15000"];
        let started = Instant::now();
        for (keys, args) in [(acquire_keys, acquire_args), (release_keys, release_args)] {
            let _: i64 = client
                .evalsha(self.sha.as_str(), keys, args)
                .await
                .map_err(|err| format!("EVALSHA failed: {err}"))?;
        }
        Ok(started.elapsed())
    }
}

/// One `lock()` + `unlock().await`; returns the duration of each half.
pub async fn s1_cycle(mutex: &fredlock::Mutex) -> Result<(Duration, Duration), String> {
    let started = Instant::now();
    let guard = mutex
        .lock()
        .await
        .map_err(|err| format!("S1 lock failed: {err}"))?;
    let locked = started.elapsed();
    let midway = Instant::now();
    guard
        .unlock()
        .await
        .map_err(|err| format!("S1 unlock failed: {err}"))?;
    Ok((locked, midway.elapsed()))
}
