//! S3, FIFO: 3 worker processes; while the parent holds the lock, 12 waiters (waiter `i` in
//! process `i mod 3`) are started 20 ms apart, in the order the parent tells the workers to
//! start them (the arrival order). For the fair lock the parent also waits until waiter `i` is
//! in the Redis queue (its hash's `q` field) before starting the next; for the others it only waits the
//! 20 ms. 20 ms after the last arrival the parent releases. Inversions = pairs of waiters that
//! acquired in the opposite order of their arrival (of 66 per round; target for the fair lock:
//! 0). Drain = release → the last waiter's `unlock()` returned. `--s3-rounds` (10; 2 with
//! `--quick`) rounds per lock: `FairMutex` and `Mutex` per mode, the peers once. The fredlock
//! clients use `shards = 1`.

use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::loop_stats::overlaps;
use crate::loops::hold_once;
use crate::measure::{ms, now_us, ping_summary, progress, round2, Summary};
use crate::peers::{LockKind, Side};
use crate::redis::{counter_key, fair_hold_key, queued, HANG};
use crate::run::ModeCtx;
use crate::workers::{say, start_workers, ChildCtx, Record, Worker};

/// Waiters per round, worker processes, and the gap between two arrivals.
pub const S3_WAITERS: usize = 12;
pub const S3_PROCESSES: usize = 3;
pub const S3_GAP: Duration = Duration::from_millis(20);

/// One S3 round: 12 arrivals, one release.
pub struct S3Round {
    pub lock: LockKind,
    /// Arrival indices in the order the waiters acquired.
    pub order: Vec<usize>,
    pub inversions: u64,
    /// The parent's release → the last waiter's `unlock()` returned.
    pub drain: Duration,
    /// Fair lock: the longest time from telling a worker to start a waiter until it was in the
    /// Redis queue.
    pub queue_wait_max: Option<Duration>,
    pub overlaps: u64,
    pub unlock_errors: u64,
}

pub struct S3Result {
    pub ping: Summary,
    pub rounds: Vec<S3Round>,
}

impl S3Result {
    pub fn of(&self, lock: LockKind) -> impl Iterator<Item = &S3Round> {
        self.rounds.iter().filter(move |r| r.lock == lock)
    }

    /// (inversions, pairs compared, worst round) of one lock kind.
    pub fn inversions(&self, lock: LockKind) -> (u64, u64, u64) {
        let pairs = (S3_WAITERS * (S3_WAITERS - 1) / 2) as u64;
        let rounds: Vec<&S3Round> = self.of(lock).collect();
        (
            rounds.iter().map(|r| r.inversions).sum(),
            pairs * rounds.len() as u64,
            rounds.iter().map(|r| r.inversions).max().unwrap_or(0),
        )
    }

    pub fn drain(&self, lock: LockKind) -> Summary {
        let drains: Vec<Duration> = self.of(lock).map(|r| r.drain).collect();
        Summary::of_durations(&drains)
    }

    pub fn violations(&self, lock: LockKind) -> u64 {
        self.of(lock).map(|r| r.overlaps).sum()
    }

    /// The lock kinds that ran, in order.
    pub fn kinds(&self) -> Vec<LockKind> {
        let mut kinds: Vec<LockKind> = Vec::new();
        for round in &self.rounds {
            if !kinds.contains(&round.lock) {
                kinds.push(round.lock);
            }
        }
        kinds
    }

    pub fn json(&self) -> Json {
        let kind = |lock: LockKind| {
            let (inversions, pairs, worst) = self.inversions(lock);
            let rounds: Vec<Json> = self
                .of(lock)
                .map(|r| {
                    json!({
                        "acquisition_order": r.order,
                        "inversions": r.inversions,
                        "drain_ms": round2(ms(r.drain)),
                        "queue_wait_max_ms": r.queue_wait_max.map(|d| round2(ms(d))),
                        "overlaps": r.overlaps,
                        "unlock_errors": r.unlock_errors,
                    })
                })
                .collect();
            json!({
                "inversions": inversions,
                "pairs": pairs,
                "worst_round_inversions": worst,
                "drain": self.drain(lock).json(),
                "overlaps": self.violations(lock),
                "rounds": rounds,
            })
        };
        let mut out = json!({
            "ping": self.ping.json(),
            "waiters": S3_WAITERS,
            "processes": S3_PROCESSES,
            "arrival_gap_ms": ms(S3_GAP),
        });
        for lock in self.kinds() {
            out[lock.name()] = kind(lock);
        }
        out
    }
}

/// S3 rounds of every lock in `kinds`.
pub async fn run_s3(ctx: &ModeCtx<'_>, kinds: &[LockKind]) -> Result<S3Result, String> {
    let prefix = format!("{}-s3", ctx.prefix);
    let fredlock = kinds.iter().any(|kind| !kind.is_peer());
    let side = Side::open(ctx.url, ctx.mode, &prefix, 1, fredlock).await?;
    let ping = ping_summary(side.redis(), ctx.args.pings).await?;
    let params = |id: usize| json!({ "role": "s3", "mode": ctx.name(), "prefix": prefix, "id": id, "fredlock": fredlock });
    let mut workers = start_workers(ctx.url, S3_PROCESSES, params).await?;
    let mut rounds = Vec::new();
    for &lock in kinds {
        for round in 0..ctx.args.s3_rounds {
            let result = s3_round(&side, &prefix, &mut workers, lock, round).await?;
            progress(&format!(
                "s3 {} {}: round {round}: order {:?}, {} inversions, drain {:.1} ms",
                if lock.is_peer() { "-" } else { ctx.name() },
                lock.name(),
                result.order,
                result.inversions,
                ms(result.drain)
            ));
            rounds.push(result);
        }
    }
    for mut worker in workers {
        worker.send("QUIT").await?;
        worker.finish().await?;
    }
    side.shutdown().await?;
    Ok(S3Result { ping, rounds })
}

async fn s3_round(
    side: &Side,
    prefix: &str,
    workers: &mut [Worker],
    lock: LockKind,
    round: usize,
) -> Result<S3Round, String> {
    let name = format!("s3-{}-{round}", lock.name());
    let guard = side
        .lock(lock, &name)
        .await?
        .lock(false)
        .await
        .map_err(|err| format!("S3 holder: {err}"))?;
    let hold = fair_hold_key(prefix, &name);
    let base = Instant::now();
    let mut queue_wait_max = Duration::ZERO;
    let mut last_arrival = base;
    for i in 0..S3_WAITERS {
        tokio::time::sleep_until((base + S3_GAP * i as u32).into()).await;
        let told = Instant::now();
        last_arrival = told;
        workers[i % S3_PROCESSES]
            .send(&format!("START {} {name} {i}", lock.name()))
            .await?;
        if lock == LockKind::Fair {
            // The next waiter arrives only once this one holds its place in the Redis queue.
            while queued(side.redis(), &hold).await? < (i + 1) as u64 {
                if told.elapsed() > HANG {
                    return Err(format!("S3 waiter {i} never joined the queue of {hold}"));
                }
                tokio::task::yield_now().await;
            }
            queue_wait_max = queue_wait_max.max(told.elapsed());
        }
    }
    tokio::time::sleep_until((last_arrival + S3_GAP).into()).await;
    let release = now_us();
    guard
        .unlock()
        .await
        .map_err(|err| format!("S3 holder unlock: {err}"))?;
    let mut records: Vec<(usize, Record)> = Vec::with_capacity(S3_WAITERS);
    for worker in workers.iter_mut() {
        let expected = (0..S3_WAITERS)
            .filter(|i| i % S3_PROCESSES == worker.id)
            .count();
        for _ in 0..expected {
            let line = worker.next_line(HANG).await?;
            records.push(parse_acq(&line).ok_or_else(|| format!("S3: bad line {line:?}"))?);
        }
    }
    records.sort_by_key(|(_, r)| (r.acquire, r.release));
    let order: Vec<usize> = records.iter().map(|(i, _)| *i).collect();
    let inversions = order
        .iter()
        .enumerate()
        .map(|(k, a)| order[k + 1..].iter().filter(|b| *b < a).count() as u64)
        .sum();
    let plain: Vec<Record> = records.iter().map(|(_, r)| *r).collect();
    let last_done = plain.iter().map(|r| r.done).max().unwrap_or(release);
    Ok(S3Round {
        lock,
        order,
        inversions,
        drain: Duration::from_micros(last_done.saturating_sub(release)),
        queue_wait_max: (lock == LockKind::Fair).then_some(queue_wait_max),
        overlaps: overlaps(&plain),
        unlock_errors: plain.iter().filter(|r| !r.unlock_ok).count() as u64,
    })
}

/// `ACQ <index> <start> <acquire> <release> <done> <ok>` from an S3 worker.
pub fn parse_acq(line: &str) -> Option<(usize, Record)> {
    let mut parts = line.strip_prefix("ACQ ")?.split(' ');
    let index: usize = parts.next()?.parse().ok()?;
    let mut num = || parts.next()?.parse::<u64>().ok();
    let (start, acquire, release, done, ok) = (num()?, num()?, num()?, num()?, num()?);
    Some((
        index,
        Record {
            task: index as u64,
            start,
            acquire,
            release,
            done,
            unlock_ok: ok == 1,
            read: false,
        },
    ))
}

/// Worker side: starts a waiter for every `START <kind> <name> <index>` line until `QUIT`.
pub async fn child(worker: &ChildCtx<'_>) -> Result<(), String> {
    let fredlock = worker.params["fredlock"].as_bool().unwrap_or(true);
    let side = worker.side(1, fredlock).await?;
    side.ready().await?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = Vec::new();
    while let Some(line) = stdin
        .next_line()
        .await
        .map_err(|err| format!("stdin: {err}"))?
    {
        if line == "QUIT" {
            break;
        }
        let parts: Vec<&str> = line.split(' ').collect();
        let ["START", kind, name, index] = parts[..] else {
            return Err(format!("unexpected line {line:?}"));
        };
        let mutex = side.lock(LockKind::parse(kind)?, name).await?;
        let redis = side.redis().clone();
        let counter = counter_key(worker.prefix, name);
        let index: u64 = index
            .parse()
            .map_err(|_| format!("bad index in {line:?}"))?;
        tasks.push(tokio::spawn(async move {
            let r = hold_once(&mutex, &redis, &counter, index, false).await?;
            say(&format!(
                "ACQ {index} {} {} {} {} {}",
                r.start,
                r.acquire,
                r.release,
                r.done,
                u8::from(r.unlock_ok)
            ))
        }));
    }
    for task in tasks {
        task.await.map_err(|err| err.to_string())??;
    }
    side.shutdown().await
}
