//! The parent: one cell per scenario and notification mode (fresh lock deployment, workers,
//! the scenario's faults), then the report.

use std::process::ExitCode;
use std::sync::{Arc, Mutex as StdMutex, MutexGuard};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fredlock::NotificationMode;

use crate::faults::{self, Faults};
use crate::options::{Options, WorkerOptions};
use crate::process::{signal, Worker};
use crate::report::{self, CellReport};
use crate::resource::{self, Resource};
use crate::scenario::{LockKind, Scenario};
use crate::stats::{KindReport, KindStats, WorkerStats, MAX_SAMPLES};
use crate::support::sentinel::SentinelSetup;
use crate::support::RedisServer;
use crate::{command, fred_client, instant_of, mono_us, unix_ms};

/// The lock server(s) of a cell.
pub enum LockServer {
    Single(RedisServer),
    Sentinel(SentinelSetup),
}

impl LockServer {
    /// Starts the deployment the scenario needs (blocking: Sentinel takes a few seconds).
    async fn start(scenario: Scenario) -> Result<LockServer, String> {
        blocking(move || {
            if scenario.sentinel() {
                LockServer::Sentinel(SentinelSetup::start())
            } else {
                LockServer::Single(RedisServer::start_with(scenario.lock_server_args()))
            }
        })
        .await
    }

    fn url(&self) -> String {
        match self {
            LockServer::Single(server) => server.url(),
            LockServer::Sentinel(setup) => setup.url(),
        }
    }
}

/// Runs blocking harness work (which panics on failure) off the runtime; a panic becomes an
/// error.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| err.to_string())
}

/// Everything the fault injectors of one cell share.
pub struct Cell {
    pub scenario: Scenario,
    pub mode: NotificationMode,
    pub prefix: String,
    pub lease: Duration,
    pub lock_server: Arc<StdMutex<LockServer>>,
    pub lock_admin: Client,
    pub resource_admin: Client,
    pub resources: Vec<(LockKind, Resource)>,
    pub workers: Arc<StdMutex<Vec<Worker>>>,
    pub worker_options: WorkerOptions,
    pub faults: Faults,
    pub until: Instant,
}

impl Cell {
    pub fn random(&self, lo: u64, hi: u64) -> u64 {
        fastrand::u64(lo..=hi)
    }

    pub fn workers(&self) -> MutexGuard<'_, Vec<Worker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps `ms`, or less when the run ends first. False when the run is over.
    pub async fn pause(&self, ms: u64) -> bool {
        let wake = (Instant::now() + Duration::from_millis(ms)).min(self.until);
        tokio::time::sleep_until(wake.into()).await;
        Instant::now() < self.until
    }

    /// Counts a failed admin command (expected while the server restarts) and keeps samples.
    pub fn admin_error(&self, what: &str, err: &dyn std::fmt::Display) {
        Faults::add(&self.faults.admin_errors, 1);
        let mut samples = self
            .faults
            .admin_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if samples.len() < MAX_SAMPLES {
            samples.push(format!("{what}: {err}"));
        }
    }

    /// Data-loss scenarios: the lock server is about to lose its data (a new loss epoch).
    /// Returns when, in [`mono_us`].
    pub async fn loss_begins(&self) -> u64 {
        let at = mono_us();
        if self.scenario.data_loss() {
            if let Err(err) = resource::mark_down(&self.resource_admin, &self.prefix, at).await {
                self.admin_error("loss marker", &err);
            }
        }
        at
    }

    /// The lock server was back at `at` ([`mono_us`]) after the loss that began at `down`.
    pub async fn loss_ends(&self, down: u64, at: u64) {
        self.faults.outage(at.saturating_sub(down));
        if self.scenario.data_loss() {
            if let Err(err) = resource::mark_back(&self.resource_admin, &self.prefix, at).await {
                self.admin_error("loss marker", &err);
            }
        }
    }
}

pub async fn run(options: Options) -> ExitCode {
    let machine = report::machine_description();
    println!("chaos: {machine}");
    let resource = match blocking(|| RedisServer::start_with(&["--appendonly", "no"])).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("cannot start the resource redis-server: {err}");
            return ExitCode::FAILURE;
        }
    };
    let resource_admin = fred_client(&resource.url())
        .await
        .expect("connect to the resource server");
    let started = Instant::now();
    let mut reports = Vec::new();
    for scenario in &options.scenarios {
        for mode in &options.modes {
            println!(
                "== {} / {} ({} s)",
                scenario.name(),
                mode.as_str(),
                options.seconds
            );
            match run_cell(*scenario, *mode, &options, &resource, &resource_admin).await {
                Ok(cell) => {
                    report::print_cell(&cell);
                    reports.push(cell);
                }
                Err(err) => {
                    eprintln!("cell {} / {} failed: {err}", scenario.name(), mode.as_str());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let _ = resource_admin.quit().await;
    drop(resource);
    report::finish(&reports, &options, &machine, elapsed)
}

async fn run_cell(
    scenario: Scenario,
    mode: NotificationMode,
    options: &Options,
    resource: &RedisServer,
    resource_admin: &Client,
) -> Result<CellReport, String> {
    let lock_server = LockServer::start(scenario)
        .await
        .map_err(|err| format!("lock redis-server: {err}"))?;
    let lock_url = lock_server.url();
    let lock_admin = fred_client(&lock_url)
        .await
        .map_err(|err| format!("admin connection: {err}"))?;
    println!("   lock server {lock_url}");
    let prefix = format!("chaos-{}-{}-{}", scenario.name(), mode.as_str(), unix_ms());
    let lease = scenario.lease();
    // Workers connect during the first 1.5 s, then all start together.
    let start_ms = unix_ms() + 1500;
    let worker_options = WorkerOptions {
        lock_url,
        resource_url: resource.url(),
        prefix: prefix.clone(),
        mode,
        lease,
        tasks: options.tasks,
        start_ms,
        until_ms: start_ms + options.seconds * 1000,
        replica_acks: scenario.replica_acks(),
        data_loss: scenario.data_loss(),
    };
    let mut workers = Vec::new();
    for _ in 0..options.workers {
        workers.push(Worker::spawn(&worker_options).map_err(|e| format!("worker: {e}"))?);
    }
    let resources = LockKind::ALL
        .map(|kind| (kind, Resource::new(resource_admin.clone(), &prefix, kind)))
        .to_vec();
    let cell = Arc::new(Cell {
        scenario,
        mode,
        prefix,
        lease,
        lock_server: Arc::new(StdMutex::new(lock_server)),
        lock_admin,
        resource_admin: resource_admin.clone(),
        resources,
        workers: Arc::new(StdMutex::new(workers)),
        until: instant_of(worker_options.until_ms),
        worker_options,
        faults: Faults::default(),
    });
    tokio::time::sleep_until(instant_of(start_ms).into()).await;
    faults::inject(&cell).await;
    recover(&cell).await;
    let hung = wait_for_workers(&cell).await;
    let report = collect(&cell, hung).await;
    let _ = cell.lock_admin.quit().await;
    let server = cell.lock_server.clone();
    drop(cell);
    // Stops the servers (Sentinel: five processes) off the runtime.
    let _ = blocking(move || drop(server)).await;
    Ok(report)
}

/// Undoes lasting faults so the workers can finish: SIGCONT everyone, no memory limit.
async fn recover(cell: &Cell) {
    for worker in cell.workers().iter().filter(|w| w.is_live()) {
        signal(worker.pid, libc::SIGCONT);
    }
    let running = matches!(
        &*cell.lock_server.lock().unwrap_or_else(|p| p.into_inner()),
        LockServer::Single(server) if server.is_running()
    );
    if running {
        let _ = command(&cell.lock_admin, "CONFIG", &["SET", "maxmemory", "0"]).await;
    }
}

/// Waits (bounded) for every live worker; returns how many had to be killed.
async fn wait_for_workers(cell: &Arc<Cell>) -> usize {
    let workers = cell.workers.clone();
    let deadline = cell.until + Duration::from_secs(30);
    tokio::task::spawn_blocking(move || {
        let mut workers = workers.lock().unwrap_or_else(|p| p.into_inner());
        let mut hung = 0;
        for worker in workers.iter_mut().filter(|w| w.is_live()) {
            if !worker.wait_until(deadline) {
                hung += 1;
            }
        }
        hung
    })
    .await
    .expect("wait for workers")
}

async fn collect(cell: &Cell, hung: usize) -> CellReport {
    let snapshots: Vec<Option<WorkerStats>> =
        cell.workers().iter().map(Worker::last_stats).collect();
    let crashed = cell.workers().iter().filter(|w| w.crashed()).count();
    let mut kinds = Vec::new();
    for (kind, resource) in &cell.resources {
        let mut workers = KindStats::default();
        for stats in snapshots.iter().flatten() {
            if let Some(kind_stats) = stats.get(kind.id()) {
                workers.merge(kind_stats);
            }
        }
        kinds.push(KindReport {
            kind: *kind,
            resource: resource.counts().await,
            workers,
        });
    }
    CellReport {
        scenario: cell.scenario,
        mode: cell.mode,
        lease: cell.lease,
        faults: cell.faults.summary(),
        workers_started: snapshots.len(),
        hung: hung + crashed,
        kinds,
    }
}
