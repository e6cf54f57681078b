//! Lock benchmarks against a real `redis-server`, for both notification modes, with the locks a
//! fred user would otherwise use measured in the same run on the same server.
//!
//! ```text
//! cargo bench --bench locks -- --help
//! cargo bench --bench locks -- --scenario s7 --s7-shapes 4x4 --s7-locks mutex,naive
//! ```
//!
//! `cargo test --all-targets` also executes this binary (a `harness = false` bench), but
//! without `--bench` in its arguments: it then returns at once and measures nothing.
//!
//! Without `REDIS_URL` the bench starts its own `redis-server` through the integration tests'
//! harness (`tests/support`: a free loopback port, never 6379, a temporary directory, no
//! persistence, killed by pid at the end). With `REDIS_URL`, note that S6 kills connections
//! (`CLIENT KILL`), in Pub/Sub mode every subscriber of the server: use a server of your own.
//!
//! Every figure is reported beside the fred `PING` round trip measured on the lock client's
//! command connection in the same scenario, and as a ratio to its p50, so figures stay
//! comparable on a noisy machine. Scenarios run one after the other, both modes of one
//! scenario back to back. Each mode uses its own key prefix (deleted at the end).
//!
//! The peers (see [`peers`]): "naive", the loop a fred user writes by hand (`SET NX PX`
//! retried every 10 ms, release by a compare-and-delete script through `EVALSHA`), and
//! `rslock` with its defaults. S1, S2, S3 and S7 run them beside fredlock.
//!
//! Modules: [`options`] (command line), [`measure`] (clocks, CPU, memory, histograms, PING),
//! [`redis`] (clients, `INFO`, `CLIENT LIST`), [`workers`] (the worker-process protocol),
//! [`run`] (orchestration), one module per scenario ([`s1`], [`loops`] with [`loop_stats`] for
//! S2, S2-fair and rw, [`s3`], [`handoff`], [`s4`], [`s5`], [`s6`], [`s7`]) and [`report`]
//! (markdown, JSON, targets, `docs/benchmarks.md`).

mod handoff;
mod loop_stats;
mod loops;
mod measure;
mod options;
mod peers;
mod redis;
mod report;
mod ring;
mod run;
mod s1;
mod s3;
mod s4;
mod s5;
mod s6;
mod s7;
#[path = "../../tests/support/mod.rs"]
mod support;
mod workers;

use options::Args;

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some(workers::WORKER_FLAG) {
        std::process::exit(workers::child_main(&raw[1..]));
    }
    // `cargo test --all-targets` runs harness-less benches without `--bench`: measure nothing.
    if !raw
        .iter()
        .any(|arg| arg == "--bench" || arg == "--help" || arg == "-h")
    {
        eprintln!("locks bench: not run (no --bench argument); use `cargo bench --bench locks`");
        return;
    }
    let args = match Args::parse(raw) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{}", options::HELP);
            return;
        }
        Err(message) => {
            eprintln!("locks bench: {message}\n\n{}", options::HELP);
            std::process::exit(2);
        }
    };
    std::process::exit(run_parent(args));
}

/// Where the bench runs: a server it started, or one given by `REDIS_URL`.
enum Target {
    Own(support::RedisServer),
    External(String),
}

/// Starts (or finds) Redis, runs every scenario and prints the report. Returns the exit code.
/// The server guard lives here, so it is killed before the process exits.
fn run_parent(args: Args) -> i32 {
    let server = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            measure::progress(&format!("using REDIS_URL ({})", redis::redact(&url)));
            Target::External(url)
        }
        // The harness panics with installation hints when no server can be started.
        _ => match std::panic::catch_unwind(support::RedisServer::start) {
            Ok(server) => {
                measure::progress(&format!(
                    "started redis-server pid {} on 127.0.0.1:{}",
                    server.pid(),
                    server.port()
                ));
                Target::Own(server)
            }
            Err(_) => {
                eprintln!("locks bench: could not start redis-server (see above)");
                return 1;
            }
        },
    };
    let url = match &server {
        Target::Own(server) => server.url(),
        Target::External(url) => url.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    let outcome = runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("install a SIGTERM handler");
        tokio::select! {
            outcome = run::bench(&args, &url) => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
            _ = terminate.recv() => Err("terminated".to_owned()),
        }
    });
    drop(runtime);
    if let Target::Own(server) = server {
        let pid = server.pid();
        drop(server);
        measure::progress(&format!("killed redis-server pid {pid}"));
    }
    match outcome {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("locks bench: some scenarios failed (see above)");
            1
        }
        Err(message) => {
            eprintln!("locks bench: {message}");
            1
        }
    }
}
