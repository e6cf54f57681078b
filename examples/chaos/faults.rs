//! The fault injectors, run by the parent while the workers work.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::cell::{blocking, Cell, LockServer};
use crate::command;
use crate::options::WorkerOptions;
use crate::process::{signal, Worker};
use crate::scenario::Scenario;
use crate::support::sentinel::SentinelSetup;
use crate::{mono_us, unix_ms};

/// Fault counters of one cell.
#[derive(Default)]
pub struct Faults {
    client_kills: AtomicU64,
    restarts: AtomicU64,
    stops: AtomicU64,
    sigkills: AtomicU64,
    flushes: AtomicU64,
    oom_windows: AtomicU64,
    trimmed_entries: AtomicU64,
    flushalls: AtomicU64,
    failovers: AtomicU64,
    /// Longest time from a data loss to the server being back, µs.
    longest_outage: AtomicU64,
    pub admin_errors: AtomicU64,
    pub admin_samples: StdMutex<Vec<String>>,
}

impl Faults {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn outage(&self, us: u64) {
        self.longest_outage.fetch_max(us, Ordering::Relaxed);
    }

    pub fn summary(&self) -> String {
        let items = [
            ("connections killed", &self.client_kills),
            ("restarts", &self.restarts),
            ("SIGSTOPs", &self.stops),
            ("SIGKILLs", &self.sigkills),
            ("script flushes", &self.flushes),
            ("OOM windows", &self.oom_windows),
            ("stream entries trimmed", &self.trimmed_entries),
            ("FLUSHALLs", &self.flushalls),
            ("failovers", &self.failovers),
        ];
        let parts: Vec<String> = items
            .iter()
            .map(|(name, n)| (name, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{n} {name}"))
            .collect();
        let mut summary = if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(", ")
        };
        let outage = self.longest_outage.load(Ordering::Relaxed);
        if outage > 0 {
            let _ = write!(
                summary,
                " (server back within {} ms)",
                outage.div_ceil(1000)
            );
        }
        let failed = self.admin_errors.load(Ordering::Relaxed);
        if failed > 0 {
            let samples = self.admin_samples.lock().unwrap_or_else(|p| p.into_inner());
            let _ = write!(
                summary,
                " ({failed} fault commands failed, e.g. {})",
                samples.first().map_or("?", String::as_str)
            );
        }
        summary
    }
}

/// Runs the scenario's injector(s) until the end of the cell.
pub async fn inject(cell: &Arc<Cell>) {
    match cell.scenario {
        Scenario::Baseline => {
            let _ = cell.pause(u64::MAX / 4).await;
        }
        Scenario::ClientKill => client_kill(cell, 100, 300).await,
        Scenario::Restart => restart(cell, 4000).await,
        Scenario::RestartNoPersistence => restart(cell, 5000).await,
        Scenario::SigStop => sigstop(cell, 3000).await,
        Scenario::SigKill => sigkill(cell, 3000).await,
        Scenario::ScriptFlush => script_flush(cell, 200).await,
        Scenario::Oom => oom(cell, 2000, 1500).await,
        Scenario::StreamGap => stream_gap(cell, 50).await,
        Scenario::Mixed => {
            tokio::join!(
                client_kill(cell, 300, 900),
                restart(cell, 7000),
                sigstop(cell, 6000),
                sigkill(cell, 6000),
                script_flush(cell, 500),
                oom(cell, 5000, 1000),
                stream_gap(cell, 200),
            );
        }
        Scenario::FlushAll => flushall(cell, 5000).await,
        Scenario::Failover | Scenario::FailoverAcks => failover(cell, 5000).await,
    }
}

/// Kills one random connection of the lock server (never the admin's own) per period.
async fn client_kill(cell: &Cell, min_ms: u64, max_ms: u64) {
    while cell.pause(cell.random(min_ms, max_ms)).await {
        let own = command(&cell.lock_admin, "CLIENT", &["ID"]).await;
        let list = command(&cell.lock_admin, "CLIENT", &["LIST"]).await;
        let (own, list) = match (own, list) {
            (Ok(own), Ok(list)) => (own, list),
            (Err(err), _) | (_, Err(err)) => {
                cell.admin_error("CLIENT ID/LIST", &err);
                continue;
            }
        };
        let own = own.as_i64().unwrap_or(-1).to_string();
        let ids: Vec<String> = list
            .as_string()
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_whitespace().find_map(|f| f.strip_prefix("id=")))
            .filter(|id| *id != own)
            .map(str::to_owned)
            .collect();
        if ids.is_empty() {
            continue;
        }
        let victim = &ids[cell.random(0, ids.len() as u64 - 1) as usize];
        match command(&cell.lock_admin, "CLIENT", &["KILL", "ID", victim]).await {
            Ok(_) => Faults::add(&cell.faults.client_kills, 1),
            Err(err) => cell.admin_error("CLIENT KILL", &err),
        }
    }
}

/// SIGKILLs the lock server and restarts it on the same port and directory, once per period:
/// from its AOF (`restart`), or empty (`restart-no-persistence`).
async fn restart(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let server = cell.lock_server.clone();
        let down = cell.loss_begins().await;
        let restarted = blocking(move || {
            if let LockServer::Single(server) =
                &mut *server.lock().unwrap_or_else(|p| p.into_inner())
            {
                server.restart();
            }
        })
        .await;
        match restarted {
            Ok(()) => {
                cell.loss_ends(down, mono_us()).await;
                Faults::add(&cell.faults.restarts, 1);
            }
            Err(err) => cell.admin_error("restart", &err),
        }
    }
}

/// Pids of live workers that are inside a critical section now (by the resource's record).
async fn holders(cell: &Cell) -> Vec<u32> {
    let mut pids = Vec::new();
    for (_, resource) in &cell.resources {
        pids.extend(resource.inside().await);
    }
    let workers = cell.workers();
    pids.retain(|pid| workers.iter().any(|w| w.pid == *pid && w.is_live()));
    pids
}

/// A live worker that holds a lock, polled for at most one second.
async fn pick_holder(cell: &Cell) -> Option<u32> {
    for _ in 0..100 {
        let pids = holders(cell).await;
        if !pids.is_empty() {
            return Some(pids[cell.random(0, pids.len() as u64 - 1) as usize]);
        }
        if !cell.pause(10).await {
            return None;
        }
    }
    None
}

/// Freezes a holder process for 2.5 leases, then resumes it.
async fn sigstop(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let Some(pid) = pick_holder(cell).await else {
            continue;
        };
        if !signal(pid, libc::SIGSTOP) {
            continue;
        }
        Faults::add(&cell.faults.stops, 1);
        // Not cut short by the end of the run: the pause must outlive the lease.
        tokio::time::sleep(cell.lease * 5 / 2).await;
        signal(pid, libc::SIGCONT);
    }
}

/// Kills a holder process and starts a replacement.
async fn sigkill(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let Some(pid) = pick_holder(cell).await else {
            continue;
        };
        let mut workers = cell.workers();
        if let Some(victim) = workers.iter_mut().find(|w| w.pid == pid && w.is_live()) {
            victim.kill();
            Faults::add(&cell.faults.sigkills, 1);
        }
        let options = WorkerOptions {
            start_ms: unix_ms(),
            ..cell.worker_options.clone()
        };
        match Worker::spawn(&options) {
            Ok(worker) => workers.push(worker),
            Err(err) => eprintln!("respawn failed: {err}"),
        }
    }
}

async fn script_flush(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        match command(&cell.lock_admin, "SCRIPT", &["FLUSH"]).await {
            Ok(_) => Faults::add(&cell.faults.flushes, 1),
            Err(err) => cell.admin_error("SCRIPT FLUSH", &err),
        }
    }
}

/// Caps memory just above its use for `window_ms`, once per period.
async fn oom(cell: &Cell, period_ms: u64, window_ms: u64) {
    while cell.pause(period_ms).await {
        let info = match command(&cell.lock_admin, "INFO", &["memory"]).await {
            Ok(info) => info,
            Err(err) => {
                cell.admin_error("INFO", &err);
                continue;
            }
        };
        let used: Option<u64> = info.as_string().and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
        });
        let Some(used) = used else { continue };
        let limit = (used + 32 * 1024).to_string();
        if let Err(err) = command(&cell.lock_admin, "CONFIG", &["SET", "maxmemory", &limit]).await {
            cell.admin_error("CONFIG SET", &err);
            continue;
        }
        Faults::add(&cell.faults.oom_windows, 1);
        tokio::time::sleep(Duration::from_millis(window_ms)).await;
        if let Err(err) = command(&cell.lock_admin, "CONFIG", &["SET", "maxmemory", "0"]).await {
            cell.admin_error("CONFIG SET", &err);
        }
    }
}

/// Empties every event stream of the cell's prefix, once per period.
async fn stream_gap(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let streams = match event_streams(cell).await {
            Ok(streams) => streams,
            Err(err) => {
                cell.admin_error("SCAN", &err);
                continue;
            }
        };
        for key in streams {
            match command(&cell.lock_admin, "XTRIM", &[&key, "MAXLEN", "0"]).await {
                Ok(trimmed) => {
                    let n = trimmed.as_i64().unwrap_or(0).max(0) as u64;
                    Faults::add(&cell.faults.trimmed_entries, n);
                }
                Err(err) => cell.admin_error("XTRIM", &err),
            }
        }
    }
}

/// The stream keys under the prefix (the event streams; their names depend on the layout).
async fn event_streams(cell: &Cell) -> Result<Vec<String>, fred::error::Error> {
    let pattern = format!("{{{}:*", cell.prefix);
    let mut cursor = "0".to_owned();
    let mut keys = Vec::new();
    // Bounded: a handful of keys per prefix, SCAN finishes in a few rounds.
    for _ in 0..1000 {
        let reply = command(
            &cell.lock_admin,
            "SCAN",
            &[
                &cursor, "MATCH", &pattern, "TYPE", "stream", "COUNT", "1000",
            ],
        )
        .await?;
        let mut parts = reply.into_array().into_iter();
        cursor = parts.next().and_then(|c| c.as_string()).unwrap_or_default();
        if let Some(batch) = parts.next() {
            keys.extend(batch.into_array().into_iter().filter_map(|k| k.as_string()));
        }
        if cursor == "0" || cursor.is_empty() {
            break;
        }
    }
    Ok(keys)
}

/// `FLUSHALL` on the lock server, once per period.
async fn flushall(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let down = cell.loss_begins().await;
        match command(&cell.lock_admin, "FLUSHALL", &[]).await {
            Ok(_) => {
                cell.loss_ends(down, mono_us()).await;
                Faults::add(&cell.faults.flushalls, 1);
            }
            Err(err) => cell.admin_error("FLUSHALL", &err),
        }
    }
}

/// How long the sentinels may take to promote the replica.
const PROMOTION_BOUND: Duration = Duration::from_secs(30);

/// SIGKILLs the master once per period; when the sentinels name the promoted replica, the
/// server is back. The old master is then restarted (empty) and the next period begins once
/// it has rejoined as an in-sync replica.
async fn failover(cell: &Cell, period_ms: u64) {
    while cell.pause(period_ms).await {
        let down = cell.loss_begins().await;
        let server = cell.lock_server.clone();
        let promoted = blocking(move || {
            let mut deployment = server.lock().unwrap_or_else(|p| p.into_inner());
            let LockServer::Sentinel(setup) = &mut *deployment else {
                return None;
            };
            let old = setup.master_port()?;
            let index = setup.server_on(old);
            setup.servers[index].kill();
            let promoted = wait_promotion(setup, old);
            // Restarted empty (no persistence), on the same port: the sentinels make it a
            // replica of the new master.
            setup.servers[index].restart();
            promoted
        });
        match promoted.await {
            Ok(Some(back)) => {
                cell.loss_ends(down, back).await;
                Faults::add(&cell.faults.failovers, 1);
            }
            Ok(None) => cell.admin_error("failover", &"no new master"),
            Err(err) => cell.admin_error("failover", &err),
        }
        let server = cell.lock_server.clone();
        let ready = blocking(move || {
            if let LockServer::Sentinel(setup) = &*server.lock().unwrap_or_else(|p| p.into_inner())
            {
                setup.wait_ready();
            }
        });
        if let Err(err) = ready.await {
            cell.admin_error("sentinel ready", &err);
        }
    }
}

/// Polls the sentinels until they name a master other than `old` (bounded); returns when, in
/// [`mono_us`].
fn wait_promotion(setup: &SentinelSetup, old: u16) -> Option<u64> {
    let deadline = Instant::now() + PROMOTION_BOUND;
    while Instant::now() < deadline {
        if setup.master_port().is_some_and(|port| port != old) {
            return Some(mono_us());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
