//! A worker process (this binary re-executed with `--worker`): `--tasks` tasks per lock type
//! loop acquire, critical section on the resource, release, and report cumulative statistics
//! on stdout (`STATS <json>` every 250 ms, `DONE <json>` at the end).
//!
//! In data-loss scenarios the work inside a critical section takes 5-20 ms (0-2 ms otherwise),
//! so that a loss finds holders inside, and a holder whose hold was taken before a loss of the lock server's
//! data (the loss epoch moved between its `enter` and its `commit`) goes on as a holder that
//! was not told: it keeps writing every 50 ms until `lost()` fires, or until
//! [`LOSS_WINDOW`] after the server was back. Its late writes must be refused by the resource;
//! when `lost()` fires is measured against the time the server was back.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use fred::interfaces::ClientLike;
use fredlock::{Config, Error, LockClient, LockGuard, LostCause};

use crate::options::WorkerOptions;
use crate::resource::{Entered, Resource};
use crate::scenario::LockKind;
use crate::stats::{KindStats, WorkerStats};
use crate::{fred_client, instant_of, mono_us};

/// How long after the server is back a hold taken before a loss waits for `lost()`.
pub const LOSS_WINDOW: Duration = Duration::from_secs(3);
/// How often such a holder writes meanwhile.
const LATE_WRITE_PERIOD: Duration = Duration::from_millis(50);
/// Bound on waiting for the server to be back (a failover takes a few seconds).
const BACK_BOUND: Duration = Duration::from_secs(30);

/// One lock handle of the kinds under test.
#[derive(Clone)]
enum Handle {
    Mutex(fredlock::Mutex),
    Rw(fredlock::RwLock),
}

impl Handle {
    fn new(locks: &LockClient, kind: LockKind) -> fredlock::Result<Handle> {
        let name = format!("chaos-{}", kind.id());
        Ok(match kind {
            LockKind::Mutex => Handle::Mutex(locks.mutex(&name)?),
            LockKind::Fair => Handle::Mutex(locks.fair_mutex(&name)?.into()),
            LockKind::RwWrite => Handle::Rw(locks.rwlock(&name)?),
        })
    }

    async fn acquire(&self) -> fredlock::Result<LockGuard> {
        match self {
            Handle::Mutex(mutex) => mutex.lock().await.map(LockGuard::from),
            Handle::Rw(rw) => rw.write().await.map(LockGuard::from),
        }
    }
}

/// What one task needs.
#[derive(Clone)]
struct Task {
    kind: LockKind,
    handle: Handle,
    resource: Resource,
    stats: Arc<StdMutex<WorkerStats>>,
    lease: Duration,
    until: Instant,
    data_loss: bool,
}

impl Task {
    fn record(&self, update: impl FnOnce(&mut KindStats)) {
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        update(stats.entry(self.kind.id().to_owned()).or_default());
    }
}

pub async fn run(options: WorkerOptions) -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let until = instant_of(options.until_ms);
    let Some(locks) = connect_locks(&options, until).await else {
        eprintln!(
            "worker {}: no lock client before the end",
            std::process::id()
        );
        return ExitCode::FAILURE;
    };
    let resource = match fred_client(&options.resource_url).await {
        Ok(client) => client,
        Err(err) => {
            eprintln!("worker: resource server: {err}");
            return ExitCode::FAILURE;
        }
    };
    tokio::time::sleep_until(instant_of(options.start_ms).into()).await;

    let stats = Arc::new(StdMutex::new(WorkerStats::new()));
    let reporter = tokio::spawn(report_periodically(stats.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    for kind in LockKind::ALL {
        let handle = Handle::new(&locks, kind).expect("valid lock name");
        let task = Task {
            kind,
            handle,
            resource: Resource::new(resource.clone(), &options.prefix, kind),
            stats: stats.clone(),
            lease: options.lease,
            until,
            data_loss: options.data_loss,
        };
        for _ in 0..options.tasks {
            tasks.spawn(task_loop(task.clone()));
        }
    }
    while tasks.join_next().await.is_some() {}
    reporter.abort();
    emit("DONE", &stats);
    let _ = tokio::time::timeout(Duration::from_secs(5), locks.shutdown()).await;
    let _ = resource.quit().await;
    ExitCode::SUCCESS
}

/// Connects, retrying (a respawned worker may start while the lock server restarts).
async fn connect_locks(options: &WorkerOptions, until: Instant) -> Option<LockClient> {
    let mut config = Config::new(options.lock_url.clone());
    config.key_prefix = options.prefix.clone();
    config.notification = options.mode;
    config.watchdog_lease = options.lease;
    config.replica_acks = options.replica_acks;
    // A release passes over the queued waiters of a killed worker once its client is gone (at
    // once in Pub/Sub mode, when its inbox expires in Stream mode); a grant that reaches one
    // before that blocks the lock for at most one lease, like a dead holder. The read-write
    // lock's queue drops a dead waiter's place within one lease too.
    config.waiter_lease = options.lease;
    // Experiments: CHAOS_HANDOVER_LIMIT_MS overrides Config::handover_limit (0 turns the
    // barging mutex's hand-overs and deferred releases off).
    if let Some(ms) = std::env::var("CHAOS_HANDOVER_LIMIT_MS")
        .ok()
        .and_then(|value| value.parse().ok())
    {
        config.handover_limit = Duration::from_millis(ms);
    }
    loop {
        match LockClient::connect(config.clone()).await {
            Ok(locks) => return Some(locks),
            Err(err) if Instant::now() < until => {
                eprintln!(
                    "worker {}: connect failed ({err}), retrying",
                    std::process::id()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => return None,
        }
    }
}

fn emit(tag: &str, stats: &Arc<StdMutex<WorkerStats>>) {
    let snapshot = stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let json = serde_json::to_string(&snapshot).expect("stats serialize");
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{tag} {json}");
    let _ = out.flush();
}

/// Cumulative snapshots, so the parent keeps the numbers of a worker it kills.
async fn report_periodically(stats: Arc<StdMutex<WorkerStats>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        emit("STATS", &stats);
    }
}

async fn task_loop(task: Task) {
    while Instant::now() < task.until {
        let asked = Instant::now();
        let acquired = tokio::time::timeout_at(task.until.into(), task.handle.acquire()).await;
        let guard = match acquired {
            Err(_) => {
                // Still waiting when the run ended.
                if asked.elapsed() > task.lease {
                    task.record(|s| s.unfinished_over_lease += 1);
                }
                break;
            }
            Ok(Err(err)) => {
                task.record(|s| {
                    match err {
                        Error::OutOfMemory(_) => s.oom_errors += 1,
                        _ => s.lock_errors += 1,
                    }
                    s.sample(format!("lock(): {err}"));
                });
                // Retry soon, as a service would.
                tokio::time::sleep(Duration::from_millis(fastrand::u64(10..=40))).await;
                continue;
            }
            Ok(Ok(guard)) => guard,
        };
        let waited = asked.elapsed();
        task.record(|s| {
            s.acquisitions += 1;
            s.max_wait_ms = s.max_wait_ms.max(waited.as_millis() as u64);
            if waited > task.lease {
                s.waits_over_lease += 1;
            }
        });
        let across = match critical_section(&task, &guard, None).await {
            Section::Committed { epoch, now } if task.data_loss && now > epoch => {
                Some(ride_out_loss(&task, &guard, epoch).await)
            }
            _ => None,
        };
        finish(&task, guard, across).await;
    }
}

/// How a critical section ended.
enum Section {
    /// The commit was accepted: the holder's loss epoch, and the one current at the commit.
    Committed {
        epoch: i64,
        now: i64,
    },
    /// Refused as stale (`lost()` fired then, at this [`mono_us`], or not in time) or failed.
    Refused(Option<u64>),
    Failed,
}

/// Enter, "work", commit; the resource checks the token at both ends. `epoch`: the holder's
/// loss epoch after its first section.
async fn critical_section(task: &Task, guard: &LockGuard, epoch: Option<i64>) -> Section {
    let token = guard.fencing_token();
    let (read, epoch) = match task.resource.enter(token, epoch).await {
        Ok(Entered::Yes { counter, epoch }) => (counter, epoch),
        Ok(Entered::Refused) => return Section::Refused(stale(task, guard).await),
        Err(err) => return resource_error(task, &err),
    };
    // Data-loss scenarios: longer work, so that a loss finds holders inside.
    let work = if task.data_loss {
        fastrand::u64(5_000..=20_000)
    } else {
        fastrand::u64(0..=2_000)
    };
    tokio::time::sleep(Duration::from_micros(work)).await;
    match task.resource.commit(token, read, epoch).await {
        Ok(committed) if committed.accepted => {
            task.record(|s| s.sections += 1);
            Section::Committed {
                epoch,
                now: committed.epoch,
            }
        }
        Ok(_) => Section::Refused(stale(task, guard).await),
        Err(err) => resource_error(task, &err),
    }
}

/// The resource refused this holder's token: the guard must know it lost the lock. Returns
/// when `lost()` fired, if it did within three leases.
async fn stale(task: &Task, guard: &LockGuard) -> Option<u64> {
    let learned = tokio::time::timeout(task.lease * 3, guard.lost()).await;
    let at = mono_us();
    task.record(|s| {
        s.stale += 1;
        match &learned {
            Ok(cause) => s.sample(format!("stale write refused, guard lost: {cause:?}")),
            Err(_) => s.stale_not_lost += 1,
        }
    });
    learned.ok().map(|_| at)
}

fn resource_error(task: &Task, err: &fred::error::Error) -> Section {
    task.record(|s| {
        s.resource_errors += 1;
        s.sample(format!("resource: {err}"));
    });
    Section::Failed
}

/// A hold taken before a loss of the lock server's data: keep writing as a holder that was
/// not told, until `lost()` fires or [`LOSS_WINDOW`] after the server was back. Returns when
/// `lost()` fired (a [`mono_us`]), if it did.
async fn ride_out_loss(task: &Task, guard: &LockGuard, epoch: i64) -> Option<u64> {
    let lost = guard.lost();
    tokio::pin!(lost);
    let bound = Instant::now() + BACK_BOUND + LOSS_WINDOW;
    let window = LOSS_WINDOW.as_micros() as u64;
    let fired = loop {
        tokio::select! {
            _ = &mut lost => break Some(mono_us()),
            () = tokio::time::sleep(LATE_WRITE_PERIOD) => {}
        }
        let over = match task.resource.loss_marker().await {
            Ok(marker) => marker.is_back() && mono_us() > marker.back + window,
            Err(_) => true,
        };
        if over || Instant::now() > bound {
            break None;
        }
        match critical_section(task, guard, Some(epoch)).await {
            Section::Committed { .. } => {}
            Section::Refused(fired) => break fired,
            Section::Failed => break None,
        }
    };
    let fired = fired?;
    let back = server_back(task, bound).await;
    let after_ms = fired.saturating_sub(back) / 1000;
    task.record(|s| s.max_lost_after_back_ms = s.max_lost_after_back_ms.max(after_ms));
    Some(fired)
}

/// When the lock server was back after the latest loss (waits for it, bounded).
async fn server_back(task: &Task, bound: Instant) -> u64 {
    loop {
        match task.resource.loss_marker().await {
            Ok(marker) if marker.is_back() => return marker.back,
            _ if Instant::now() > bound => return mono_us(),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// `across`: for a hold taken before a loss, whether `lost()` fired (see [`ride_out_loss`]).
async fn finish(task: &Task, guard: LockGuard, across: Option<Option<u64>>) {
    if let Some(cause) = guard.lost_cause() {
        task.record(|s| {
            s.lost += 1;
            *s.lost_causes.entry(cause_name(&cause)).or_default() += 1;
            s.sample(format!("lost: {cause:?}"));
        });
    }
    let unlocked = guard.unlock().await;
    if let Some(fired) = across {
        task.record(|s| {
            s.across_loss += 1;
            match (fired, &unlocked) {
                (Some(_), _) => s.across_reported += 1,
                (None, Ok(())) => s.across_survived += 1,
                (None, Err(_)) => s.across_unreported += 1,
            }
        });
    }
    match unlocked {
        Ok(()) => {}
        Err(Error::NotHeld { reason, .. }) => task.record(|s| {
            s.unlock_not_held += 1;
            s.sample(format!("unlock(): not held ({reason:?})"));
        }),
        Err(err) => task.record(|s| {
            s.unlock_errors += 1;
            s.sample(format!("unlock(): {err}"));
        }),
    }
}

/// The variant of a cause, without its details.
fn cause_name(cause: &LostCause) -> String {
    let text = format!("{cause:?}");
    text.split('(').next().unwrap_or_default().to_owned()
}
