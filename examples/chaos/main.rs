//! Fault injection against fredlock, checked by a resource that verifies fencing tokens.
//!
//! ```text
//! cargo run --release --example chaos -- [--scenario NAME[,NAME]|all] [--seconds N]
//!     [--modes stream,pubsub] [--workers 4] [--tasks 4] [--markdown docs/reliability.md]
//! ```
//!
//! For every scenario and notification mode the parent starts a fresh lock deployment (a
//! `redis-server` with AOF and `appendfsync always`, one without persistence, or a Sentinel
//! deployment, through the integration tests' harness `tests/support`) and `--workers` worker
//! processes (this binary re-executed with the hidden `--worker` argument). Each worker runs
//! `--tasks` tasks per lock type (`Mutex`, fair `Mutex`, `RwLock` writes) that loop: acquire,
//! critical section on the resource, release. The resource ([`resource`]) lives on a
//! *separate* `redis-server`, so faults of the lock server never touch it, and checks the
//! fencing token of every write.
//!
//! Meanwhile the parent injects the scenario's fault ([`faults`]). At the end it reads the
//! resource and the workers' statistics (the last snapshot of a killed worker counts) and
//! prints markdown tables ([`report`]); `--markdown PATH` also writes the full page
//! ([`markdown`]). Every loop is bounded in time; the parent kills every process it started
//! (servers and workers) by pid when it is done. The exit status is 1 when a safety check
//! failed.
//!
//! Modules: [`options`] (command line), [`scenario`] (scenarios and lock types), [`resource`]
//! and [`stats`] (the fencing-checked resource and the checks), [`worker`] (a worker process)
//! and [`process`] (the parent's handle on one), [`cell`] (one scenario in one mode),
//! [`faults`] (the injectors), [`report`] and [`markdown`] (the output).

mod cell;
mod faults;
mod markdown;
mod options;
mod process;
mod report;
mod resource;
mod scenario;
mod stats;
#[path = "../../tests/support/mod.rs"]
mod support;
mod worker;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, PerformanceConfig, ReconnectPolicy,
};
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::options::Command;
use crate::scenario::Scenario;

fn main() -> ExitCode {
    let command = match options::parse(std::env::args_os().skip(1)) {
        Ok(command) => command,
        Err(err) => return usage(&err),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    match command {
        Command::Worker(options) => runtime.block_on(worker::run(options)),
        Command::Parent(options) => runtime.block_on(cell::run(options)),
    }
}

fn usage(err: &str) -> ExitCode {
    eprintln!(
        "error: {err}\nusage: chaos [--scenario NAME[,NAME]|all] [--seconds N] \
         [--modes stream,pubsub] [--workers N] [--tasks N] [--markdown PATH]\nscenarios: {}",
        Scenario::ALL.map(Scenario::name).join(", ")
    );
    ExitCode::from(2)
}

/// A fred client with short timeouts and endless constant-delay reconnects.
async fn fred_client(url: &str) -> Result<Client, fred::error::Error> {
    let config = FredConfig::from_url(url)?;
    let perf = PerformanceConfig {
        default_command_timeout: Duration::from_secs(3),
        ..PerformanceConfig::default()
    };
    let connection = ConnectionConfig {
        connection_timeout: Duration::from_secs(3),
        internal_command_timeout: Duration::from_secs(3),
        max_command_attempts: 3,
        ..ConnectionConfig::default()
    };
    let client = Client::new(
        config,
        Some(perf),
        Some(connection),
        Some(ReconnectPolicy::new_constant(0, 100)),
    );
    client.init().await?;
    Ok(client)
}

/// Runs a command by name (admin commands, `XTRIM` …).
async fn command(client: &Client, name: &str, args: &[&str]) -> Result<Value, fred::error::Error> {
    let cmd = CustomCommand::new(name.to_owned(), ClusterHash::Random, false);
    let args: Vec<Value> = args.iter().map(|a| Value::from(*a)).collect();
    client.custom(cmd, args).await
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The monotonic instant of a UNIX time in ms (the past maps to now).
fn instant_of(unix: u64) -> Instant {
    Instant::now() + Duration::from_millis(unix.saturating_sub(unix_ms()))
}

/// `CLOCK_MONOTONIC` in µs: one clock for the parent and every worker process, unaffected by
/// changes of the wall clock. Marks when a loss began and ended, and when `lost()` fired.
fn mono_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given, which lives on this stack frame.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000
}
