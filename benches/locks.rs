//! Lock benchmarks against a real `redis-server` (SPEC §6 and the benchmark issues), for both
//! notification modes.
//!
//! ```text
//! cargo bench --bench locks -- [--quick] [--scenario all|s1,s2,...] [--mode stream|pubsub|both]
//!     [--json PATH] [--cycles N] [--warmup N] [--pings N] [--seconds S] [--processes N]
//!     [--tasks N] [--s3-rounds N] [--s4-waiters N,N] [--s5-rounds N] [--s6-reps N]
//! ```
//!
//! `cargo test --all-targets` also executes this binary (a `harness = false` bench), but
//! without `--bench` in its arguments: it then returns at once and measures nothing.
//!
//! Without `REDIS_URL` the bench starts its own `redis-server` on a free loopback port (never
//! 6379) in a temporary directory, without persistence, and kills it by pid at the end. With
//! `REDIS_URL`, note that S6 kills connections (`CLIENT KILL`), in Pub/Sub mode every
//! subscriber of the server (`TYPE pubsub`): use a server of your own.
//!
//! Every figure is reported beside the fred `PING` round trip measured on the lock client's
//! command connection in the same scenario, and as a ratio to its p50, so figures stay
//! comparable on a noisy machine. Scenarios run one after the other, both modes of one
//! scenario back to back. Each mode uses its own key prefix (deleted at the end).
//!
//! * **PING**: `--pings` (2000) sequential `PING`s after 200 warm-up ones.
//! * **s1, uncontended**: one task, one lock name; `--cycles` (5000; 1000 with `--quick`)
//!   cycles of `lock()` + `unlock().await` after `--warmup` (500), one PING interleaved after
//!   each. Cycle p50/p99 and its two halves; target: cycle p50 ≤ 2.1 × PING p50 (two script
//!   round trips). Then, as the floor of a cycle, `--cycles` pairs of bare `EVALSHA`s of
//!   `return 1` with the key and argument shapes of the acquire and release scripts, each pair
//!   right after one more cycle (so that both see the same machine state).
//! * **s2, contended** (`Mutex`): `--processes` (4) OS processes × `--tasks` (4) tasks loop on
//!   ONE lock for `--seconds` (5; 2 with `--quick`), doing a non-atomic `GET` then `SET n+1` of
//!   a counter inside the critical section. The bench re-executes itself as the worker
//!   processes; they connect, say `READY`, and all start at the wall-clock instant the parent
//!   sends with `GO`. Each acquisition records, in wall-clock µs (one machine, one clock): when
//!   `lock()` was called, when it returned (acquire), when `unlock()` was called (release: the
//!   end of the critical section) and when it returned. Merged and sorted by acquire time they
//!   give: acquisitions/s (target: × PING p50 ≥ 0.30); the handoff gap, next acquire − previous
//!   release, separately for handoffs to a *different* task (targets: p50 ≤ 2.5 × PING, p99 ≤
//!   10 × PING) and back to the *same* task; every acquisition's wait; and mutual-exclusion
//!   violations: holds that overlap, and a final counter different from the number of
//!   increments. Both must be 0.
//! * **s2-fair**: the same harness on `fair_mutex` (target: handoff to another task p50 ≤
//!   2.5 × PING; violations 0).
//! * **s3, FIFO**: 3 worker processes; while the parent holds the lock, 12 waiters (waiter `i`
//!   in process `i mod 3`) are started 20 ms apart, in the order the parent tells the workers
//!   to start them (the arrival order). For the fair lock the parent also waits until waiter
//!   `i` is in the Redis queue (`LLEN`) before starting the next; for the barging `Mutex` it
//!   only waits the 20 ms. 20 ms after the last arrival the parent releases. Inversions = pairs
//!   of waiters that acquired in the opposite order of their arrival (of 66 per round; target
//!   for the fair lock: 0). Drain = release → the last waiter's `unlock()` returned.
//!   `--s3-rounds` (10; 2 with `--quick`) rounds per lock type. The clients use `shards = 1`.
//! * **fair-handoff**: one process; a client holds a fair lock while N tasks of a second client
//!   queue on it (`LLEN` = N), then releases; each task unlocks as soon as it acquires. Gap =
//!   a task's `lock()` returned − the previous holder's `unlock()` call. N = 10 (5 batches: 50
//!   gaps) and N = 1000 (the first 50 gaps of each batch, while ≥ 950 are queued; 2 batches, 1
//!   with `--quick`). Target: p50(1000) ≤ 2 × p50(10).
//! * **rw, read-heavy mix**: the s2 harness, each operation a read with probability 0.9 (else a
//!   write), drawn per operation: a read takes a read hold and does `GET`, a write takes a
//!   write hold and does `GET` + `SET n+1`. Run on an `RwLock`, then the same mix on a `Mutex`
//!   (every operation exclusive), `--seconds` each. Operations/s of both; violations (a write
//!   overlapping any other hold) and counter = writes.
//! * **s4, connection economy**: a fresh worker process per N in `--s4-waiters` (200,10000):
//!   a holder `LockClient` takes N distinct locks (`s4-<i>`, fixed 120 s lease), then N tasks
//!   of a second `LockClient` each create the handle and call `lock()` on one of them.
//!   `INFO clients` connected_clients before, after each client connected and while all wait
//!   (target: the waiting client ≤ 3 connections); RSS (`/proc/self/statm`) before spawning
//!   the waiters and once all have made their first attempt, per waiter (target ≤ 2 KiB);
//!   `size_of_val` of a pending `mutex.lock()` future and of the whole spawned task's future.
//! * **s5, wakeup latency, Stream vs Pub/Sub**: per mode one holder `LockClient` and 4 waiter
//!   `LockClient`s in this process; each round the holder takes the lock, each waiter client
//!   starts one `lock()`; once all have tried (`INFO commandstats`) and 5 ms passed, the holder
//!   calls `unlock()`. Latency = `unlock()` called → the first waiter's `lock()` returned.
//!   `--s5-rounds` (500; 100 with `--quick`), modes interleaved in blocks of 10 rounds. Also a
//!   PING after the same 5 ms idle pause, each round. Target: stream p50 ≤ 1.2 × pubsub p50.
//! * **s6, recovery**: 100 tasks of one client wait on one lock, or on 100 distinct locks, held
//!   by another client with a fixed 120 s lease. The waiting client's notifier connection is
//!   killed (Pub/Sub: `CLIENT KILL TYPE pubsub`; Stream: `CLIENT KILL ID` of its `cmd=xread`
//!   connection) and the holder releases right after. Time until all 100 acquired, and when
//!   the killed notifier connection(s) came back (`CLIENT LIST`). Target: all within 1 s of
//!   the release plus the reconnect delay (a lease expiry would take 120 s).
//!
//! S4 and S6 first check that an acquisition with a fixed lease completes (on a thread of its
//! own, 10 s limit): when it does not (a library hang seen while this bench was written), their
//! holders use a watchdog lease of the same 120 s instead, and the report says so.
//!   `--s6-reps` (5; 1 with `--quick`) runs per variant.
//!
//! Output: markdown tables on stdout, JSON at `--json` (default `target/bench-locks.json`),
//! progress on stderr.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child as StdChild, Command as StdCommand, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::{ClusterHash, CustomCommand, InfoKind};
use fredlock::{Config, Lease, LockClient, LockGuard, NotificationMode};
use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// First argument of a re-executed worker process; the second is its JSON parameters.
const WORKER_FLAG: &str = "--bench-worker";
/// Environment variable carrying the Redis URL to the workers (kept out of `ps` output).
const WORKER_URL_ENV: &str = "FREDLOCK_BENCH_URL";
/// Overrides the `redis-server` binary (same variable as the integration tests).
const REDIS_SERVER_ENV: &str = "FREDLOCK_REDIS_SERVER";
/// The lock every S1 cycle takes.
const S1_LOCK: &str = "bench-s1";
/// Warm-up PINGs before the measured ones.
const PING_WARMUP: u64 = 200;
/// How long the parent waits for every worker to connect.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Margin between `GO` and the common start instant, so every worker sleeps until it.
const START_DELAY_US: u64 = 250_000;
/// Extra time allowed after a timed window for the workers to finish and report.
const FINISH_GRACE: Duration = Duration::from_secs(60);
/// S3: waiters per round, worker processes, and the gap between two arrivals.
const S3_WAITERS: usize = 12;
const S3_PROCESSES: usize = 3;
const S3_GAP: Duration = Duration::from_millis(20);
/// Fair hand-off: gaps measured per batch.
const HANDOFF_GAPS: usize = 50;
/// S4, S6: the holder's fixed lease (a waiter that waited for it to expire would show).
const LONG_LEASE: Duration = Duration::from_secs(120);
/// S5: waiting clients, the idle pause before each release, rounds per interleaved block.
const S5_CLIENTS: usize = 4;
const S5_SETTLE: Duration = Duration::from_millis(5);
const S5_BLOCK: usize = 10;
/// S6: waiting tasks, and the bound that only a lost wakeup can exceed.
const S6_WAITERS: usize = 100;
const S6_LIMIT: Duration = Duration::from_secs(30);
/// Anything that should take well under a second; only a hang exceeds it.
const HANG: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: cargo bench --bench locks -- [--quick] [--scenario all|LIST] \
[--mode stream|pubsub|both] [--json PATH] [--cycles N] [--warmup N] [--pings N] [--seconds S] \
[--processes N] [--tasks N] [--s3-rounds N] [--s4-waiters N,N] [--s5-rounds N] [--s6-reps N]\n\
scenarios: s1 s2 s2-fair s3 fair-handoff rw s4 s5 s6";

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some(WORKER_FLAG) {
        std::process::exit(worker::main(&raw[1..]));
    }
    // `cargo test --all-targets` runs harness-less benches without `--bench`: measure nothing.
    if !raw.iter().any(|arg| arg == "--bench") {
        eprintln!("locks bench: not run (no --bench argument); use `cargo bench --bench locks`");
        return;
    }
    let args = match Args::parse(&raw) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("locks bench: {message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let code = run_parent(args);
    std::process::exit(code);
}

/// Starts (or finds) Redis, runs every scenario and prints the report. Returns the exit code.
/// The server guard lives here, so it is killed before the process exits.
fn run_parent(args: Args) -> i32 {
    let server = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            progress(&format!("using REDIS_URL ({})", redact(&url)));
            Target::External(url)
        }
        _ => match RedisProcess::start() {
            Ok(server) => {
                progress(&format!(
                    "started redis-server pid {} on 127.0.0.1:{}",
                    server.pid(),
                    server.port
                ));
                Target::Own(server)
            }
            Err(message) => {
                eprintln!("locks bench: {message}");
                return 1;
            }
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    let url = server.url();
    let redis_pid = match &server {
        Target::Own(process) => Some(process.pid()),
        Target::External(_) => None,
    };
    let outcome = runtime.block_on(async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("install a SIGTERM handler");
        tokio::select! {
            outcome = bench(&args, &url, redis_pid) => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
            _ = terminate.recv() => Err("terminated".to_owned()),
        }
    });
    drop(runtime);
    drop(server);
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

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// One selectable scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scenario {
    S1,
    S2,
    S2Fair,
    S3,
    FairHandoff,
    Rw,
    S4,
    S5,
    S6,
}

impl Scenario {
    const ALL: [Scenario; 9] = [
        Scenario::S1,
        Scenario::S2,
        Scenario::S2Fair,
        Scenario::S3,
        Scenario::FairHandoff,
        Scenario::Rw,
        Scenario::S4,
        Scenario::S5,
        Scenario::S6,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::S1 => "s1",
            Scenario::S2 => "s2",
            Scenario::S2Fair => "s2-fair",
            Scenario::S3 => "s3",
            Scenario::FairHandoff => "fair-handoff",
            Scenario::Rw => "rw",
            Scenario::S4 => "s4",
            Scenario::S5 => "s5",
            Scenario::S6 => "s6",
        }
    }

    fn parse_list(text: &str) -> Result<Vec<Scenario>, String> {
        let mut out = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let item = item.to_ascii_lowercase();
            if item == "all" {
                out.extend(Scenario::ALL);
                continue;
            }
            let found = match item.as_str() {
                "s2fair" | "s2f" | "fair" => Some(Scenario::S2Fair),
                "handoff" | "fairhandoff" => Some(Scenario::FairHandoff),
                "rwlock" => Some(Scenario::Rw),
                other => Scenario::ALL.into_iter().find(|s| s.name() == other),
            };
            out.push(found.ok_or_else(|| format!("unknown scenario {item:?}"))?);
        }
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err("--scenario needs at least one scenario".into());
        }
        Ok(out)
    }
}

/// Command-line settings of the parent process.
#[derive(Debug, Clone)]
struct Args {
    quick: bool,
    json: PathBuf,
    scenarios: Vec<Scenario>,
    modes: Vec<NotificationMode>,
    cycles: u64,
    warmup: u64,
    pings: u64,
    seconds: f64,
    processes: usize,
    tasks: usize,
    s3_rounds: usize,
    handoff_batches_10: usize,
    handoff_batches_1000: usize,
    s4_waiters: Vec<usize>,
    s5_rounds: usize,
    s6_reps: usize,
}

impl Args {
    fn parse(raw: &[String]) -> Result<Args, String> {
        let mut quick = false;
        let mut json = PathBuf::from("target/bench-locks.json");
        let mut scenarios = Scenario::ALL.to_vec();
        let mut modes = vec![NotificationMode::Stream, NotificationMode::PubSub];
        let (mut cycles, mut seconds, mut s3_rounds, mut s5_rounds, mut s6_reps) =
            (None, None, None, None, None);
        let (mut warmup, mut pings, mut processes, mut tasks) = (500, 2000, 4, 4);
        let mut s4_waiters = vec![200, 10_000];
        let mut it = raw.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag.as_str() {
                "--bench" => {} // added by `cargo bench`
                "--quick" => quick = true,
                "--json" => json = PathBuf::from(value()?),
                "--scenario" | "--scenarios" => scenarios = Scenario::parse_list(&value()?)?,
                "--mode" => modes = parse_modes(&value()?)?,
                "--cycles" => cycles = Some(parse_num(flag, &value()?)?),
                "--warmup" => warmup = parse_num(flag, &value()?)?,
                "--pings" => pings = parse_num(flag, &value()?)?,
                "--seconds" => seconds = Some(parse_num::<f64>(flag, &value()?)?),
                "--processes" => processes = parse_num(flag, &value()?)?,
                "--tasks" => tasks = parse_num(flag, &value()?)?,
                "--s3-rounds" => s3_rounds = Some(parse_num(flag, &value()?)?),
                "--s4-waiters" => {
                    s4_waiters = value()?
                        .split(',')
                        .map(|n| parse_num(flag, n.trim()))
                        .collect::<Result<_, _>>()?
                }
                "--s5-rounds" => s5_rounds = Some(parse_num(flag, &value()?)?),
                "--s6-reps" => s6_reps = Some(parse_num(flag, &value()?)?),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        let args = Args {
            quick,
            json,
            scenarios,
            modes,
            cycles: cycles.unwrap_or(if quick { 1000 } else { 5000 }),
            warmup,
            pings,
            seconds: seconds.unwrap_or(if quick { 2.0 } else { 5.0 }),
            processes,
            tasks,
            s3_rounds: s3_rounds.unwrap_or(if quick { 2 } else { 10 }),
            handoff_batches_10: 5,
            handoff_batches_1000: if quick { 1 } else { 2 },
            s4_waiters,
            s5_rounds: s5_rounds.unwrap_or(if quick { 100 } else { 500 }),
            s6_reps: s6_reps.unwrap_or(if quick { 1 } else { 5 }),
        };
        args.check()?;
        Ok(args)
    }

    fn check(&self) -> Result<(), String> {
        if self.cycles == 0 || self.pings == 0 {
            return Err("--cycles and --pings must be at least 1".into());
        }
        if !(self.seconds > 0.0 && self.seconds <= 3600.0) {
            return Err(format!(
                "--seconds must be in (0, 3600], got {}",
                self.seconds
            ));
        }
        if self.processes == 0 || self.tasks == 0 || self.processes * self.tasks < 2 {
            return Err("S2 needs at least 2 tasks in all (--processes × --tasks)".into());
        }
        if self.s3_rounds == 0 || self.s5_rounds == 0 || self.s6_reps == 0 {
            return Err("--s3-rounds, --s5-rounds and --s6-reps must be at least 1".into());
        }
        if self.s4_waiters.iter().any(|&n| n == 0 || n > 100_000) {
            return Err("--s4-waiters must be in 1..=100000".into());
        }
        Ok(())
    }
}

fn parse_num<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag}: {text:?} is not a valid number"))
}

fn parse_modes(text: &str) -> Result<Vec<NotificationMode>, String> {
    match text {
        "both" => Ok(vec![NotificationMode::Stream, NotificationMode::PubSub]),
        one => Ok(vec![parse_mode(one)?]),
    }
}

fn parse_mode(text: &str) -> Result<NotificationMode, String> {
    match text {
        "stream" => Ok(NotificationMode::Stream),
        "pubsub" => Ok(NotificationMode::PubSub),
        other => Err(format!(
            "mode must be stream, pubsub or both, got {other:?}"
        )),
    }
}

fn mode_name(mode: NotificationMode) -> &'static str {
    mode.as_str()
}

// ---------------------------------------------------------------------------------------------
// Redis server
// ---------------------------------------------------------------------------------------------

/// Where the bench runs: a server it started, or one given by `REDIS_URL`.
enum Target {
    Own(RedisProcess),
    External(String),
}

impl Target {
    fn url(&self) -> String {
        match self {
            Target::Own(server) => format!("redis://127.0.0.1:{}", server.port),
            Target::External(url) => url.clone(),
        }
    }
}

/// A throwaway `redis-server`: loopback only, no persistence, own temporary directory.
/// Killed by pid (SIGKILL) when dropped.
struct RedisProcess {
    child: StdChild,
    port: u16,
    _dir: tempfile::TempDir,
}

impl RedisProcess {
    fn start() -> Result<RedisProcess, String> {
        let binary = std::env::var(REDIS_SERVER_ENV)
            .ok()
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        let dir = tempfile::Builder::new()
            .prefix("fredlock-bench-")
            .tempdir()
            .map_err(|err| format!("cannot create a temporary directory: {err}"))?;
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port()?;
            match spawn_redis(&binary, dir.path(), port) {
                Ok(child) => {
                    return Ok(RedisProcess {
                        child,
                        port,
                        _dir: dir,
                    })
                }
                Err(err) => failures.push(format!("port {port}: {err}")),
            }
        }
        Err(format!(
            "could not start {binary} (install it, e.g. scripts/ensure-redis, or set \
             {REDIS_SERVER_ENV} or REDIS_URL): {}",
            failures.join("; ")
        ))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of our own child, which we have not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        let _ = self.child.wait();
        progress(&format!("killed redis-server pid {pid}"));
    }
}

/// A free loopback port other than 6379.
fn free_port() -> Result<u16, String> {
    loop {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|err| format!("cannot bind 127.0.0.1:0: {err}"))?;
        let port = listener
            .local_addr()
            .map_err(|err| format!("local_addr: {err}"))?
            .port();
        if port != 6379 {
            return Ok(port);
        }
    }
}

fn spawn_redis(binary: &str, dir: &Path, port: u16) -> Result<StdChild, String> {
    let log = dir.join("redis-server.log");
    let mut child = StdCommand::new(binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| format!("spawn: {err}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("exited with {status}: {}", tail.trim()));
        }
        if answers_ping(port) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err("no PONG within 10 s".into())
}

/// Whether a server on `port` answers an inline PING.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The URL with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

fn progress(message: &str) {
    eprintln!("[locks bench] {message}");
}

/// Wall-clock microseconds since the epoch: the common clock of all processes.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("system clock before 1970")
        .as_micros() as u64
}

/// CPU time (user + system, µs) of the worker processes and of the redis-server, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
struct CpuSample {
    workers_us: u64,
    redis_us: Option<u64>,
}

impl CpuSample {
    fn take(worker_pids: &[u32], redis_pid: Option<u32>) -> CpuSample {
        CpuSample {
            workers_us: worker_pids
                .iter()
                .filter_map(|&pid| process_cpu_us(pid))
                .sum(),
            redis_us: redis_pid.and_then(process_cpu_us),
        }
    }

    fn since(&self, earlier: &CpuSample) -> CpuSample {
        CpuSample {
            workers_us: self.workers_us.saturating_sub(earlier.workers_us),
            redis_us: self
                .redis_us
                .zip(earlier.redis_us)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }
}

/// User + system CPU µs of a running process, from `/proc/<pid>/stat`.
fn process_cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000 / hz)
}

/// The system allocator, counting the bytes currently allocated (S4 reports the live heap per
/// waiter beside the RSS, which also holds freed but unreturned memory).
struct CountingAlloc;

static HEAP_LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HEAP_LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HEAP_LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.dealloc(ptr, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        HEAP_LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        std::alloc::System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        HEAP_LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        std::alloc::System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Bytes currently allocated on the heap by this process.
fn heap_live() -> i64 {
    HEAP_LIVE.load(Ordering::Relaxed) as i64
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(pages * page)
}

/// `/proc/loadavg`'s first three fields, for the record.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The machine, for the report.
fn machine_json(redis_version: &str) -> Json {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "kernel": kernel,
        "redis_version": redis_version,
        "load_average_at_end": load_average(),
    })
}

fn config(url: &str, mode: NotificationMode, prefix: &str, shards: u16) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config.shards = shards;
    config
}

/// The default shard count of the crate (the clients of S3 and fair-handoff use 1).
const DEFAULT_SHARDS: u16 = 16;

async fn connect_with(
    url: &str,
    mode: NotificationMode,
    prefix: &str,
    shards: u16,
) -> Result<LockClient, String> {
    LockClient::connect(config(url, mode, prefix, shards))
        .await
        .map_err(|err| format!("cannot connect the lock client to {}: {err}", redact(url)))
}

async fn connect(url: &str, mode: NotificationMode, prefix: &str) -> Result<LockClient, String> {
    connect_with(url, mode, prefix, DEFAULT_SHARDS).await
}

async fn shutdown(locks: &LockClient) -> Result<(), String> {
    locks
        .shutdown()
        .await
        .map_err(|err| format!("shutdown failed: {err}"))
}

/// A plain fred client (no locks), e.g. for cleanup.
async fn plain_client(url: &str) -> Result<Client, String> {
    let client = Client::new(
        fred::types::config::Config::from_url(url)
            .map_err(|err| format!("bad REDIS_URL {}: {err}", redact(url)))?,
        None,
        None,
        None,
    );
    client
        .init()
        .await
        .map_err(|err| format!("cannot connect a plain client: {err}"))?;
    Ok(client)
}

/// A counter key under the run's prefix, so that the cleanup finds it.
fn counter_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:bench}}:counter:{name}")
}

/// The Redis queue of a fair lock of a client with `shards = 1` (see `src/keys.rs`).
fn fair_queue_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:fair.queue:{name}")
}

/// A histogram of durations (any unit) with 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Percentiles of one histogram, in µs.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    count: u64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

impl Summary {
    /// `hist` holds values in units of `unit_us` microseconds.
    fn of(hist: &Histogram<u64>, unit_us: f64) -> Summary {
        if hist.is_empty() {
            return Summary::default();
        }
        Summary {
            count: hist.len(),
            p50: hist.value_at_quantile(0.50) as f64 * unit_us,
            p90: hist.value_at_quantile(0.90) as f64 * unit_us,
            p99: hist.value_at_quantile(0.99) as f64 * unit_us,
            max: hist.max() as f64 * unit_us,
            mean: hist.mean() * unit_us,
        }
    }

    /// Summary of durations.
    fn of_durations(values: &[Duration]) -> Summary {
        let mut hist = histogram();
        for value in values {
            record(&mut hist, *value);
        }
        Summary::of(&hist, 1e-3)
    }

    fn json(&self) -> Json {
        json!({
            "count": self.count,
            "p50_us": round2(self.p50),
            "p90_us": round2(self.p90),
            "p99_us": round2(self.p99),
            "max_us": round2(self.max),
            "mean_us": round2(self.mean),
        })
    }

    /// The same figures as multiples of `ping` (its p50, µs).
    fn json_per_ping(&self, ping: f64) -> Json {
        json!({
            "p50": round2(ratio(self.p50, ping)),
            "p90": round2(ratio(self.p90, ping)),
            "p99": round2(ratio(self.p99, ping)),
            "max": round2(ratio(self.max, ping)),
        })
    }
}

fn round2(x: f64) -> f64 {
    round(x, 2)
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn ratio(value: f64, ping_p50: f64) -> f64 {
    if ping_p50 > 0.0 {
        value / ping_p50
    } else {
        f64::NAN
    }
}

/// Records a duration in ns.
fn record(hist: &mut Histogram<u64>, elapsed: Duration) {
    hist.saturating_record(elapsed.as_nanos().max(1) as u64);
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// One fred PING round trip on `client`.
async fn ping_once(client: &Client) -> Result<Duration, String> {
    let started = Instant::now();
    let _: String = client
        .ping(None)
        .await
        .map_err(|err| format!("PING failed: {err}"))?;
    Ok(started.elapsed())
}

async fn ping_warmup(client: &Client) -> Result<(), String> {
    for _ in 0..PING_WARMUP {
        ping_once(client).await?;
    }
    Ok(())
}

/// Adds `count` sequential PINGs (after a warm-up) to `hist` (ns).
async fn measure_ping(
    client: &Client,
    count: u64,
    hist: &mut Histogram<u64>,
) -> Result<(), String> {
    ping_warmup(client).await?;
    for _ in 0..count {
        record(hist, ping_once(client).await?);
    }
    Ok(())
}

/// `count` PINGs after a warm-up, summarised.
async fn ping_summary(client: &Client, count: u64) -> Result<Summary, String> {
    let mut hist = histogram();
    measure_ping(client, count, &mut hist).await?;
    Ok(Summary::of(&hist, 1e-3))
}

/// Commands whose Redis-side statistics the report shows.
const TRACKED_COMMANDS: [&str; 7] = ["evalsha", "eval", "get", "set", "xread", "ping", "publish"];

/// `INFO commandstats` for the tracked commands: name → (calls, server µs).
#[derive(Debug, Clone, Default)]
struct CommandStats {
    commands: BTreeMap<String, (u64, u64)>,
}

impl CommandStats {
    fn parse(info: &str) -> CommandStats {
        let mut commands = BTreeMap::new();
        for line in info.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            if !TRACKED_COMMANDS.contains(&name) {
                continue;
            }
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            commands.insert(name.to_owned(), (field("calls"), field("usec")));
        }
        CommandStats { commands }
    }

    fn since(&self, earlier: &CommandStats) -> CommandStats {
        let commands = self
            .commands
            .iter()
            .map(|(name, &(calls, usec))| {
                let (calls0, usec0) = earlier.commands.get(name).copied().unwrap_or((0, 0));
                (
                    name.clone(),
                    (calls.saturating_sub(calls0), usec.saturating_sub(usec0)),
                )
            })
            .filter(|(_, (calls, _))| *calls > 0)
            .collect();
        CommandStats { commands }
    }

    fn calls(&self, name: &str) -> u64 {
        self.commands.get(name).map_or(0, |&(calls, _)| calls)
    }

    /// (calls per operation, server µs per call) of one command.
    fn per_op(&self, name: &str, ops: u64) -> (f64, f64) {
        let (calls, usec) = self.commands.get(name).copied().unwrap_or((0, 0));
        (
            calls as f64 / ops.max(1) as f64,
            usec as f64 / calls.max(1) as f64,
        )
    }

    fn json(&self, ops: u64) -> Json {
        let entries: serde_json::Map<String, Json> = self
            .commands
            .iter()
            .map(|(name, &(calls, usec))| {
                let (per_op, usec_per_call) = self.per_op(name, ops);
                (
                    name.clone(),
                    json!({
                        "calls": calls,
                        "usec": usec,
                        "calls_per_op": round(per_op, 3),
                        "usec_per_call": round2(usec_per_call),
                    }),
                )
            })
            .collect();
        Json::Object(entries)
    }
}

async fn command_stats(client: &Client) -> Result<CommandStats, String> {
    let info: String = client
        .info(Some(InfoKind::CommandStats))
        .await
        .map_err(|err| format!("INFO commandstats failed: {err}"))?;
    Ok(CommandStats::parse(&info))
}

/// Waits until the server counted `calls` more `EVALSHA`s than in `before`: every waiter's first
/// attempt has been executed.
async fn wait_for_evalsha(
    client: &Client,
    before: &CommandStats,
    calls: u64,
) -> Result<(), String> {
    let deadline = Instant::now() + HANG;
    loop {
        let now = command_stats(client).await?.since(before);
        if now.calls("evalsha") >= calls {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {calls} acquire attempts reached Redis within {HANG:?}",
                now.calls("evalsha")
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn redis_version(client: &Client) -> String {
    let info: String = client
        .info(Some(InfoKind::Server))
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_owned()
}

/// `connected_clients` from `INFO clients`.
async fn connected_clients(client: &Client) -> Result<u64, String> {
    let info: String = client
        .info(Some(InfoKind::Clients))
        .await
        .map_err(|err| format!("INFO clients failed: {err}"))?;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| "INFO clients has no connected_clients".to_owned())
}

/// A command fred has no typed method for (or whose interface the crate does not enable).
async fn raw_command<R: fred::types::FromValue>(
    client: &Client,
    name: &'static str,
    hash: ClusterHash,
    args: Vec<String>,
) -> Result<R, String> {
    client
        .custom(CustomCommand::new_static(name, hash, false), args)
        .await
        .map_err(|err| format!("{name} failed: {err}"))
}

async fn llen(client: &Client, key: &str) -> Result<u64, String> {
    raw_command(client, "LLEN", ClusterHash::FirstKey, vec![key.to_owned()]).await
}

/// `CLIENT LIST`, one map of fields per connection.
async fn client_list(client: &Client) -> Result<Vec<BTreeMap<String, String>>, String> {
    let text: String =
        raw_command(client, "CLIENT", ClusterHash::Random, vec!["LIST".into()]).await?;
    Ok(text
        .lines()
        .map(|line| {
            line.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect())
}

/// The notifier connection(s) that appeared since `existing` was taken (a client just
/// connected), waiting up to 5 s for them.
async fn new_notifiers(
    probe: &Client,
    mode: NotificationMode,
    existing: &HashSet<u64>,
) -> Result<HashSet<u64>, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let new: HashSet<u64> = notifier_ids(probe, mode)
            .await?
            .difference(existing)
            .copied()
            .collect();
        if !new.is_empty() {
            return Ok(new);
        }
        if Instant::now() > deadline {
            return Err("cannot find the new client's notifier connection".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ids of the connections that look like a notifier of `mode`: a blocked or last `XREAD`
/// (stream), a subscription (Pub/Sub).
async fn notifier_ids(client: &Client, mode: NotificationMode) -> Result<HashSet<u64>, String> {
    let number = |c: &BTreeMap<String, String>, key: &str| {
        c.get(key).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
    };
    Ok(client_list(client)
        .await?
        .into_iter()
        .filter(|c| match mode {
            NotificationMode::Stream => c.get("cmd").map(String::as_str) == Some("xread"),
            _ => number(c, "sub") + number(c, "psub") + number(c, "ssub") > 0,
        })
        .filter_map(|c| c.get("id").and_then(|id| id.parse().ok()))
        .collect())
}

/// Deletes every key of one bench prefix (SCAN, never KEYS).
async fn delete_prefix(client: &Client, prefix: &str) -> Result<u64, String> {
    let pattern = format!("{{{prefix}*");
    let mut cursor = "0".to_owned();
    let mut deleted = 0;
    loop {
        let (next, keys): (String, Vec<String>) = client
            .scan_page(cursor, pattern.as_str(), Some(500), None)
            .await
            .map_err(|err| format!("SCAN failed: {err}"))?;
        if !keys.is_empty() {
            let n: u64 = client
                .del(keys)
                .await
                .map_err(|err| format!("DEL failed: {err}"))?;
            deleted += n;
        }
        if next == "0" {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// A small deterministic PRNG (xorshift64*) for the read/write mix.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `value` µs with its ratio to the PING p50.
fn times_ping(value: f64, ping_p50: f64) -> String {
    format!("{value:.0} ({:.2}×)", ratio(value, ping_p50))
}

/// The size of a value (e.g. a future that was never polled).
fn size_of<T>(value: &T) -> usize {
    std::mem::size_of_val(value)
}

// ---------------------------------------------------------------------------------------------
// Parent: orchestration
// ---------------------------------------------------------------------------------------------

/// What every scenario of one notification mode needs.
struct ModeCtx<'a> {
    args: &'a Args,
    url: &'a str,
    mode: NotificationMode,
    /// Key prefix of this mode's clients (unique per run and mode); scenarios that need another
    /// layout append a suffix.
    prefix: String,
    /// The bench's own redis-server, for CPU accounting.
    redis_pid: Option<u32>,
    /// The lease of the holders in S4 and S6 (see [`holder_lease`]).
    holder_lease: HolderLease,
}

impl ModeCtx<'_> {
    fn name(&self) -> &'static str {
        mode_name(self.mode)
    }
}

/// Every result, per scenario and mode.
#[derive(Default)]
struct Report {
    s1: Vec<(NotificationMode, S1Result)>,
    s2: Vec<(NotificationMode, LoopResult)>,
    s2_fair: Vec<(NotificationMode, LoopResult)>,
    s3: Vec<(NotificationMode, S3Result)>,
    handoff: Vec<(NotificationMode, HandoffResult)>,
    rw: Vec<(NotificationMode, RwResult)>,
    s4: Vec<(NotificationMode, S4Result)>,
    s5: Option<S5Result>,
    s6: Vec<(NotificationMode, S6Result)>,
    /// (scenario, mode, message) of every scenario that failed.
    errors: Vec<(Scenario, Option<NotificationMode>, String)>,
    /// Remarks for the reader (e.g. a workaround the bench had to take).
    notes: Vec<String>,
}

/// The lease of the S4 and S6 holders: a fixed one as specified, or, if fixed leases hang the
/// client, a watchdog lease of the same length (a waiter that waited for it would also wait
/// [`LONG_LEASE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HolderLease {
    Fixed,
    Watchdog,
}

impl HolderLease {
    fn lease(self) -> Lease {
        match self {
            HolderLease::Fixed => Lease::fixed(LONG_LEASE),
            HolderLease::Watchdog => Lease::watchdog(LONG_LEASE),
        }
    }

    fn name(self) -> &'static str {
        match self {
            HolderLease::Fixed => "fixed",
            HolderLease::Watchdog => "watchdog",
        }
    }

    fn parse(text: &str) -> HolderLease {
        if text == "watchdog" {
            HolderLease::Watchdog
        } else {
            HolderLease::Fixed
        }
    }
}

/// How long the fixed-lease probe may take.
const LEASE_PROBE_LIMIT: Duration = Duration::from_secs(10);

/// Whether one acquisition with a fixed lease completes. It runs on a thread and runtime of
/// its own, so that a hang (a blocked thread) cannot take the bench with it.
async fn holder_lease(url: &str, mode: NotificationMode, prefix: &str) -> HolderLease {
    let (tx, rx) = std::sync::mpsc::channel();
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a runtime");
        let works = runtime.block_on(async {
            let locks = connect(&url, mode, &prefix).await.ok()?;
            let lock = locks.mutex("lease-probe").ok()?;
            let lock = lock.with_lease(Lease::fixed(LONG_LEASE)).ok()?;
            let guard = lock.lock().await.ok()?;
            guard.unlock().await.ok()?;
            locks.shutdown().await.ok()
        });
        let _ = tx.send(works.is_some());
    });
    let answer = tokio::task::spawn_blocking(move || rx.recv_timeout(LEASE_PROBE_LIMIT)).await;
    match answer {
        Ok(Ok(true)) => HolderLease::Fixed,
        _ => HolderLease::Watchdog,
    }
}

/// Pushes `(mode, result)` into `list`, or records the error.
macro_rules! keep {
    ($report:ident . $list:ident, $scenario:expr, $mode:expr, $outcome:expr) => {
        match $outcome {
            Ok(result) => $report.$list.push(($mode, result)),
            Err(message) => {
                progress(&format!(
                    "{} {}: FAILED: {message}",
                    $scenario.name(),
                    mode_name($mode)
                ));
                $report.errors.push(($scenario, Some($mode), message));
            }
        }
    };
}

/// Runs every selected scenario and mode, prints the markdown report and writes the JSON.
/// Returns whether every scenario completed.
async fn bench(args: &Args, url: &str, redis_pid: Option<u32>) -> Result<bool, String> {
    let run_id = format!("{}-{}", std::process::id(), now_us() / 1_000_000);
    let probe = plain_client(url).await?;
    let version = redis_version(&probe).await;
    let _ = probe.quit().await;
    let started = Instant::now();
    let mut ctxs: Vec<ModeCtx<'_>> = args
        .modes
        .iter()
        .map(|&mode| ModeCtx {
            args,
            url,
            mode,
            prefix: format!("fredlock-bench-{}-{run_id}", mode_name(mode)),
            redis_pid,
            holder_lease: HolderLease::Fixed,
        })
        .collect();
    let mut report = Report::default();
    if args.scenarios.contains(&Scenario::S4) || args.scenarios.contains(&Scenario::S6) {
        // Probe every mode at once: a hanging probe costs its full time limit.
        let probes: Vec<_> = ctxs
            .iter()
            .map(|ctx| {
                let (url, mode, prefix) = (url.to_owned(), ctx.mode, ctx.prefix.clone());
                tokio::spawn(async move { holder_lease(&url, mode, &prefix).await })
            })
            .collect();
        for (ctx, probe) in ctxs.iter_mut().zip(probes) {
            ctx.holder_lease = probe.await.unwrap_or(HolderLease::Watchdog);
            if ctx.holder_lease == HolderLease::Watchdog {
                let note = format!(
                    "{}: an acquisition with a fixed lease did not complete within {:?} (a \
                     library hang); S4 and S6 holders use a {} s watchdog lease instead",
                    ctx.name(),
                    LEASE_PROBE_LIMIT,
                    LONG_LEASE.as_secs()
                );
                progress(&note);
                report.notes.push(note);
            }
        }
    }
    for &scenario in &args.scenarios {
        progress(&format!(
            "scenario {} (load average {}, {:.0} s so far)",
            scenario.name(),
            load_average(),
            started.elapsed().as_secs_f64()
        ));
        if scenario == Scenario::S5 {
            match run_s5(&ctxs).await {
                Ok(result) => report.s5 = Some(result),
                Err(message) => {
                    progress(&format!("s5: FAILED: {message}"));
                    report.errors.push((scenario, None, message));
                }
            }
            continue;
        }
        for ctx in &ctxs {
            let mode = ctx.mode;
            match scenario {
                Scenario::S1 => keep!(report.s1, scenario, mode, run_s1(ctx).await),
                Scenario::S2 => keep!(report.s2, scenario, mode, run_loop(ctx, &S2_SPEC).await),
                Scenario::S2Fair => keep!(
                    report.s2_fair,
                    scenario,
                    mode,
                    run_loop(ctx, &S2_FAIR_SPEC).await
                ),
                Scenario::S3 => keep!(report.s3, scenario, mode, run_s3(ctx).await),
                Scenario::FairHandoff => {
                    keep!(report.handoff, scenario, mode, run_handoff(ctx).await)
                }
                Scenario::Rw => keep!(report.rw, scenario, mode, run_rw(ctx).await),
                Scenario::S4 => keep!(report.s4, scenario, mode, run_s4(ctx).await),
                Scenario::S6 => keep!(report.s6, scenario, mode, run_s6(ctx).await),
                Scenario::S5 => unreachable!("handled above"),
            }
        }
    }
    let cleaner = plain_client(url).await?;
    for ctx in &ctxs {
        let deleted = delete_prefix(&cleaner, &ctx.prefix).await?;
        progress(&format!("mode {}: deleted {deleted} keys", ctx.name()));
    }
    let _ = cleaner.quit().await;
    progress(&format!(
        "all scenarios done in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    println!("{}", markdown(args, &report, &version));
    write_json(args, &report, &version)?;
    Ok(report.errors.is_empty())
}

// --- S1 --------------------------------------------------------------------------------------

/// S1: uncontended lock + unlock cycles on one name from one task.
struct S1Result {
    ping: Summary,
    cycle: Summary,
    lock: Summary,
    unlock: Summary,
    /// The floor: two `EVALSHA`s of a script that only does `return 1`, with the keys and
    /// arguments of `mutex_acquire` and then `mutex_release` (measured after the cycles).
    floor: Summary,
    /// Redis command statistics of the measured cycles (and the interleaved PINGs).
    commands: CommandStats,
    cycles: u64,
}

async fn run_s1(ctx: &ModeCtx<'_>) -> Result<S1Result, String> {
    let args = ctx.args;
    let locks = connect(ctx.url, ctx.mode, &ctx.prefix).await?;
    let mutex = locks.mutex(S1_LOCK).map_err(|err| err.to_string())?;
    for _ in 0..args.warmup {
        s1_cycle(&mutex).await?;
    }
    ping_warmup(locks.redis()).await?;
    progress(&format!(
        "s1 {}: {} cycles interleaved with {} PINGs",
        ctx.name(),
        args.cycles,
        args.pings
    ));
    let (mut cycle, mut lock, mut unlock) = (histogram(), histogram(), histogram());
    let mut ping = histogram();
    let stats_before = command_stats(locks.redis()).await?;
    for i in 0..args.cycles.max(args.pings) {
        if i < args.cycles {
            let (locked, unlocked) = s1_cycle(&mutex).await?;
            record(&mut cycle, locked + unlocked);
            record(&mut lock, locked);
            record(&mut unlock, unlocked);
        }
        if i < args.pings {
            record(&mut ping, ping_once(locks.redis()).await?);
        }
    }
    let commands = command_stats(locks.redis()).await?.since(&stats_before);
    // The floor: as many bare pairs, each right after a cycle, so both see the same machine.
    let bare = BarePair::load(locks.redis()).await?;
    let mut floor = histogram();
    for _ in 0..args.cycles {
        s1_cycle(&mutex).await?;
        record(&mut floor, bare.run(locks.redis()).await?);
    }
    shutdown(&locks).await?;
    let result = S1Result {
        ping: Summary::of(&ping, 1e-3),
        cycle: Summary::of(&cycle, 1e-3),
        lock: Summary::of(&lock, 1e-3),
        unlock: Summary::of(&unlock, 1e-3),
        floor: Summary::of(&floor, 1e-3),
        commands,
        cycles: args.cycles,
    };
    progress(&format!(
        "s1 {}: PING p50 {:.1} µs, cycle p50 {:.1} µs = {:.2} × PING",
        ctx.name(),
        result.ping.p50,
        result.cycle.p50,
        ratio(result.cycle.p50, result.ping.p50)
    ));
    Ok(result)
}

/// What two script round trips cost by themselves through fred: `EVALSHA` of `return 1` with
/// the 3 keys and 5 arguments of `mutex_acquire`, then with the 4 keys and 8 arguments of
/// `mutex_release` (lengths as in fredlock's calls). A cycle can be no faster than this pair.
/// S1 times one pair after each cycle, so that both see the same machine.
struct BarePair {
    sha: String,
}

impl BarePair {
    async fn load(client: &Client) -> Result<BarePair, String> {
        let sha: String = client
            .script_load("return 1")
            .await
            .map_err(|err| format!("SCRIPT LOAD failed: {err}"))?;
        Ok(BarePair { sha })
    }

    async fn run(&self, client: &Client) -> Result<Duration, String> {
        let id = "0123456789abcdef0123456789abcdef";
        let acquire_keys = vec![
            "{b:0}:mutex:s1",
            "{b:0}:mutex.fence:s1",
            "{b:0}:mutex.wait:s1",
        ];
        let release_keys = vec![
            "{b:0}:mutex:s1",
            "{b:0}:mutex.wait:s1",
            "{b:events}",
            "{b:events}:seq",
        ];
        let acquire_args = vec![id, "30000", id, "100", "0"];
        let release_args = vec![id, "1", id, "0", "15000", "stream", "10000", "mutex:s1"];
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
async fn s1_cycle(mutex: &fredlock::Mutex) -> Result<(Duration, Duration), String> {
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

// --- Worker processes (parent side) ----------------------------------------------------------

/// A running worker process: its stdin, and its stdout lines as a channel.
struct Worker {
    id: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Worker {
    /// Starts `<this bench> --bench-worker <params>` with the URL in the environment.
    fn spawn(url: &str, id: usize, params: Json) -> Result<Worker, String> {
        let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
        let mut child = Command::new(exe)
            .arg(WORKER_FLAG)
            .arg(params.to_string())
            .env(WORKER_URL_ENV, url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot start worker {id}: {err}"))?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            id,
            child,
            stdin,
            lines,
        })
    }

    /// The next stdout line; an error on timeout or when the worker ended.
    async fn next_line(&mut self, limit: Duration) -> Result<String, String> {
        match tokio::time::timeout(limit, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!("worker {} ended its output early", self.id)),
            Err(_) => Err(format!("worker {} said nothing within {limit:?}", self.id)),
        }
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        match self.next_line(READY_TIMEOUT).await?.as_str() {
            "READY" => Ok(()),
            other => Err(format!(
                "worker {} said {other:?} instead of READY",
                self.id
            )),
        }
    }

    async fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("worker {}: stdin closed", self.id))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|err| format!("cannot write to worker {}: {err}", self.id))?;
        stdin.flush().await.map_err(|err| err.to_string())
    }

    /// Closes stdin and waits for a successful exit.
    async fn finish(mut self) -> Result<(), String> {
        drop(self.stdin.take());
        let status = tokio::time::timeout(FINISH_GRACE, self.child.wait())
            .await
            .map_err(|_| format!("worker {} did not exit", self.id))?
            .map_err(|err| format!("worker {}: {err}", self.id))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("worker {} failed ({status})", self.id))
        }
    }
}

/// Starts `count` workers and waits until every one has said `READY`.
async fn start_workers(
    url: &str,
    count: usize,
    params: impl Fn(usize) -> Json,
) -> Result<Vec<Worker>, String> {
    let mut workers = Vec::new();
    for id in 0..count {
        workers.push(Worker::spawn(url, id, params(id))?);
    }
    for worker in &mut workers {
        worker.wait_ready().await?;
    }
    Ok(workers)
}

// --- S2, S2-fair, rw: processes × tasks looping on one lock ----------------------------------

/// Which lock a looping task takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockKind {
    Mutex,
    Fair,
    RwLock,
}

impl LockKind {
    fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair",
            LockKind::RwLock => "rwlock",
        }
    }

    fn parse(text: &str) -> Result<LockKind, String> {
        match text {
            "mutex" => Ok(LockKind::Mutex),
            "fair" => Ok(LockKind::Fair),
            "rwlock" => Ok(LockKind::RwLock),
            other => Err(format!("unknown lock kind {other:?}")),
        }
    }
}

/// What the tasks of a looping scenario do.
struct LoopSpec {
    label: &'static str,
    lock: LockKind,
    /// Lock name (and counter name).
    name: &'static str,
    /// Probability that an operation is a read (`GET` only; a read hold on an `RwLock`).
    read_share: f64,
}

const S2_SPEC: LoopSpec = LoopSpec {
    label: "s2",
    lock: LockKind::Mutex,
    name: "bench-s2",
    read_share: 0.0,
};
const S2_FAIR_SPEC: LoopSpec = LoopSpec {
    label: "s2-fair",
    lock: LockKind::Fair,
    name: "bench-s2-fair",
    read_share: 0.0,
};
const RW_SPEC: LoopSpec = LoopSpec {
    label: "rw (RwLock)",
    lock: LockKind::RwLock,
    name: "bench-rw",
    read_share: 0.9,
};
const RW_MUTEX_SPEC: LoopSpec = LoopSpec {
    label: "rw (Mutex)",
    lock: LockKind::Mutex,
    name: "bench-rw-mutex",
    read_share: 0.9,
};

/// One acquisition, in wall-clock µs.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// `process * tasks + task`.
    task: u64,
    /// `lock()` called.
    start: u64,
    /// `lock()` returned.
    acquire: u64,
    /// `unlock()` called: the end of the critical section.
    release: u64,
    /// `unlock()` returned.
    done: u64,
    /// `unlock()` succeeded.
    unlock_ok: bool,
    /// A read (shared hold, `GET` only) rather than a write (`GET` + `SET`).
    read: bool,
}

impl Record {
    fn to_line(self) -> String {
        json!([
            self.task,
            self.start,
            self.acquire,
            self.release,
            self.done,
            u8::from(self.unlock_ok),
            u8::from(self.read)
        ])
        .to_string()
    }

    fn from_json(value: &Json) -> Option<Record> {
        let items = value.as_array()?;
        let num = |i: usize| items.get(i).and_then(Json::as_u64);
        Some(Record {
            task: num(0)?,
            start: num(1)?,
            acquire: num(2)?,
            release: num(3)?,
            done: num(4)?,
            unlock_ok: num(5)? == 1,
            read: num(6)? == 1,
        })
    }
}

/// What one worker process reported.
#[derive(Default)]
struct WorkerReport {
    records: Vec<Record>,
    wakeups: u64,
}

/// The PING round trips measured right before and right after a scenario; the reference is
/// their union.
struct PingBracket {
    before: Summary,
    after: Summary,
    both: Summary,
}

impl PingBracket {
    fn new(before: &Histogram<u64>, after: &Histogram<u64>) -> PingBracket {
        let mut both = before.clone();
        both.add(after).expect("histograms with the same bounds");
        PingBracket {
            before: Summary::of(before, 1e-3),
            after: Summary::of(after, 1e-3),
            both: Summary::of(&both, 1e-3),
        }
    }
}

/// The measurement window in wall-clock µs: tasks start `lock()` calls in [go, end).
#[derive(Debug, Clone, Copy)]
struct Window {
    go: u64,
    end: u64,
}

/// A looping scenario's figures.
struct LoopResult {
    /// Reference: PINGs before and after the scenario together.
    ping: Summary,
    ping_before: Summary,
    ping_after: Summary,
    /// Every acquisition, including the drain after the window.
    acquisitions: u64,
    /// Acquisitions inside the window.
    in_window: u64,
    /// `in_window` per second of the window.
    acq_per_s: f64,
    /// Reads and writes among all acquisitions.
    reads: u64,
    writes: u64,
    /// Time from the end of the window until the last task released.
    drain_s: f64,
    handoff_other: Summary,
    handoff_same: Summary,
    same_share: f64,
    /// Every acquisition's wait (from calling `lock()` until it returned), drain included.
    wait: Summary,
    wait_read: Summary,
    wait_write: Summary,
    /// The longest wait among the acquisitions made inside the window.
    longest_wait_in_window_us: u64,
    /// Acquisitions that waited longer than [`STALL_US`].
    stalls: u64,
    per_task_min: u64,
    per_task_max: u64,
    /// Holds that overlapped a write hold (or, for exclusive locks, any other hold).
    overlaps: u64,
    counter: i64,
    unlock_errors: u64,
    wakeups: u64,
    /// CPU used by the workers and the redis-server during the window.
    cpu: CpuSample,
    window_s: f64,
    /// Redis command statistics during the window.
    commands: CommandStats,
}

impl LoopResult {
    fn throughput_ratio(&self) -> f64 {
        self.acq_per_s * self.ping.p50 * 1e-6
    }

    /// CPU µs per acquisition in the window of (workers, redis-server).
    fn cpu_per_acquisition(&self) -> (f64, Option<f64>) {
        let n = self.in_window.max(1) as f64;
        (
            self.cpu.workers_us as f64 / n,
            self.cpu.redis_us.map(|us| us as f64 / n),
        )
    }

    /// Share of the machine's CPU capacity used by workers and redis-server in the window.
    fn machine_busy(&self) -> f64 {
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let used = (self.cpu.workers_us + self.cpu.redis_us.unwrap_or(0)) as f64;
        used / (self.window_s.max(1e-9) * 1e6 * nproc)
    }

    fn wakeups_per_acquisition(&self) -> f64 {
        if self.acquisitions == 0 {
            0.0
        } else {
            self.wakeups as f64 / self.acquisitions as f64
        }
    }

    /// The final counter differs from the number of increments (writes).
    fn counter_mismatch(&self) -> bool {
        self.counter != self.writes as i64
    }

    fn violations(&self) -> u64 {
        self.overlaps + u64::from(self.counter_mismatch())
    }

    fn json(&self) -> Json {
        let (workers_cpu, redis_cpu) = self.cpu_per_acquisition();
        json!({
            "ping": self.ping.json(),
            "ping_before": self.ping_before.json(),
            "ping_after": self.ping_after.json(),
            "acquisitions": self.acquisitions,
            "acquisitions_in_window": self.in_window,
            "reads": self.reads,
            "writes": self.writes,
            "acq_per_s": round2(self.acq_per_s),
            "acq_per_s_times_ping_p50": round(self.throughput_ratio(), 4),
            "drain_s": round(self.drain_s, 3),
            "cpu_us_per_acquisition_workers": round2(workers_cpu),
            "cpu_us_per_acquisition_redis": redis_cpu.map(round2),
            "machine_busy": round(self.machine_busy(), 3),
            "redis_commands_per_acquisition": self.commands.json(self.in_window),
            "handoff_other": self.handoff_other.json(),
            "handoff_other_per_ping": self.handoff_other.json_per_ping(self.ping.p50),
            "handoff_same": self.handoff_same.json(),
            "same_task_share": round(self.same_share, 4),
            "wait": self.wait.json(),
            "wait_read": self.wait_read.json(),
            "wait_write": self.wait_write.json(),
            "longest_wait_us": self.wait.max,
            "longest_wait_in_window_us": self.longest_wait_in_window_us,
            "waits_over_1s": self.stalls,
            "per_task_min": self.per_task_min,
            "per_task_max": self.per_task_max,
            "overlaps": self.overlaps,
            "counter": self.counter,
            "counter_mismatch": self.counter_mismatch(),
            "unlock_errors": self.unlock_errors,
            "wakeups": self.wakeups,
            "wakeups_per_acquisition": round(self.wakeups_per_acquisition(), 3),
        })
    }
}

async fn run_loop(ctx: &ModeCtx<'_>, spec: &LoopSpec) -> Result<LoopResult, String> {
    let args = ctx.args;
    let locks = connect(ctx.url, ctx.mode, &ctx.prefix).await?;
    let counter = counter_key(&ctx.prefix, spec.name);
    let _: i64 = locks
        .redis()
        .del(counter.as_str())
        .await
        .map_err(|err| format!("DEL counter: {err}"))?;
    let mut ping_before = histogram();
    measure_ping(locks.redis(), args.pings, &mut ping_before).await?;
    progress(&format!(
        "{} {}: PING p50 {:.1} µs; {} processes × {} tasks for {} s",
        spec.label,
        ctx.name(),
        Summary::of(&ping_before, 1e-3).p50,
        args.processes,
        args.tasks,
        args.seconds
    ));
    let params = |id: usize| {
        json!({
            "role": "loop",
            "mode": ctx.name(),
            "prefix": ctx.prefix,
            "id": id,
            "tasks": args.tasks,
            "seconds": args.seconds,
            "lock": spec.lock.name(),
            "name": spec.name,
            "read_share": spec.read_share,
        })
    };
    let mut workers = start_workers(ctx.url, args.processes, params).await?;
    let pids: Vec<u32> = workers.iter().filter_map(|w| w.child.id()).collect();
    let stats_before = command_stats(locks.redis()).await?;
    let go = now_us() + START_DELAY_US;
    let window = Window {
        go,
        end: go + (args.seconds * 1e6) as u64,
    };
    for worker in &mut workers {
        worker.send(&format!("GO {go}")).await?;
    }
    let collecting = tokio::spawn(collect_all(workers));
    let cpu = cpu_during(&window, &pids, ctx.redis_pid).await;
    let stats = command_stats(locks.redis()).await?.since(&stats_before);
    let limit = Duration::from_secs_f64(args.seconds) + FINISH_GRACE;
    let reports = tokio::time::timeout(limit, collecting)
        .await
        .map_err(|_| format!("workers did not finish within {limit:?}"))?
        .map_err(|err| err.to_string())??;
    let value: Option<i64> = locks
        .redis()
        .get(counter.as_str())
        .await
        .map_err(|err| format!("GET counter: {err}"))?;
    let mut ping_after = histogram();
    measure_ping(locks.redis(), args.pings, &mut ping_after).await?;
    shutdown(&locks).await?;
    let pings = PingBracket::new(&ping_before, &ping_after);
    let mut result = analyze(pings, window, reports, value.unwrap_or(0), cpu);
    result.commands = stats;
    progress(&format!(
        "{} {}: {} acquisitions, {:.0}/s = {:.3} per PING; handoff to another task p50 {:.1} \
         µs = {:.2} × PING; violations {}",
        spec.label,
        ctx.name(),
        result.acquisitions,
        result.acq_per_s,
        result.throughput_ratio(),
        result.handoff_other.p50,
        ratio(result.handoff_other.p50, result.ping.p50),
        result.violations()
    ));
    Ok(result)
}

/// CPU used by the workers and redis-server between the window's start and end.
async fn cpu_during(window: &Window, worker_pids: &[u32], redis_pid: Option<u32>) -> CpuSample {
    sleep_until_wall(window.go).await;
    let before = CpuSample::take(worker_pids, redis_pid);
    sleep_until_wall(window.end).await;
    CpuSample::take(worker_pids, redis_pid).since(&before)
}

async fn sleep_until_wall(at_us: u64) {
    let now = now_us();
    if at_us > now {
        tokio::time::sleep(Duration::from_micros(at_us - now)).await;
    }
}

async fn collect_all(workers: Vec<Worker>) -> Result<Vec<WorkerReport>, String> {
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|worker| tokio::spawn(collect(worker)))
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.map_err(|err| err.to_string())??);
    }
    Ok(reports)
}

/// Reads a worker's records until `DONE`, then waits for it to exit successfully.
async fn collect(mut worker: Worker) -> Result<WorkerReport, String> {
    let mut report = WorkerReport::default();
    let id = worker.id;
    loop {
        let line = worker
            .lines
            .recv()
            .await
            .ok_or_else(|| format!("worker {id} ended without DONE"))?;
        if line == "DONE" {
            break;
        }
        let value: Json = serde_json::from_str(&line)
            .map_err(|err| format!("worker {id}: bad line {line:?}: {err}"))?;
        if let Some(wakeups) = value.get("wakeups").and_then(Json::as_u64) {
            report.wakeups = wakeups;
        } else {
            let record = Record::from_json(&value)
                .ok_or_else(|| format!("worker {id}: bad record {line:?}"))?;
            report.records.push(record);
        }
    }
    worker.finish().await?;
    Ok(report)
}

/// A wait this long on a lock held for microseconds at a time means a lost wakeup (the waiter
/// re-checked only when the lease it had been told about ran out).
const STALL_US: u64 = 1_000_000;

/// Merges the workers' records and computes every figure. Throughput counts the acquisitions
/// made inside the window; everything else uses every acquisition, including those of tasks
/// that were still waiting when the window closed (the drain).
fn analyze(
    pings: PingBracket,
    window: Window,
    reports: Vec<WorkerReport>,
    counter: i64,
    cpu: CpuSample,
) -> LoopResult {
    let wakeups = reports.iter().map(|r| r.wakeups).sum();
    let mut records: Vec<Record> = reports.into_iter().flat_map(|r| r.records).collect();
    records.sort_by_key(|r| (r.acquire, r.release));
    let acquisitions = records.len() as u64;
    let reads = records.iter().filter(|r| r.read).count() as u64;
    let in_window = records.iter().filter(|r| r.acquire < window.end).count() as u64;
    let window_s = window.end.saturating_sub(window.go) as f64 / 1e6;
    let last_done = records.iter().map(|r| r.done).max().unwrap_or(window.end);
    let (handoff_other, handoff_same, same) = handoffs(&records);
    let (per_task_min, per_task_max) = per_task_range(&records);
    let (mut wait, mut wait_read, mut wait_write) = (histogram(), histogram(), histogram());
    let mut longest_in_window = 0;
    for record in &records {
        let waited = record.acquire.saturating_sub(record.start).max(1);
        wait.saturating_record(waited);
        if record.read {
            wait_read.saturating_record(waited);
        } else {
            wait_write.saturating_record(waited);
        }
        if record.acquire < window.end {
            longest_in_window = longest_in_window.max(waited);
        }
    }
    LoopResult {
        ping: pings.both,
        ping_before: pings.before,
        ping_after: pings.after,
        acquisitions,
        in_window,
        acq_per_s: in_window as f64 / window_s,
        reads,
        writes: acquisitions - reads,
        drain_s: last_done.saturating_sub(window.end) as f64 / 1e6,
        handoff_other: Summary::of(&handoff_other, 1.0),
        handoff_same: Summary::of(&handoff_same, 1.0),
        same_share: if acquisitions > 1 {
            same as f64 / (acquisitions - 1) as f64
        } else {
            0.0
        },
        wait: Summary::of(&wait, 1.0),
        wait_read: Summary::of(&wait_read, 1.0),
        wait_write: Summary::of(&wait_write, 1.0),
        longest_wait_in_window_us: longest_in_window,
        stalls: records
            .iter()
            .filter(|r| r.acquire.saturating_sub(r.start) > STALL_US)
            .count() as u64,
        per_task_min,
        per_task_max,
        overlaps: overlaps(&records),
        counter,
        unlock_errors: records.iter().filter(|r| !r.unlock_ok).count() as u64,
        wakeups,
        cpu,
        window_s,
        commands: CommandStats::default(),
    }
}

/// Handoff gaps (next acquire − previous release, µs) to another task and to the same task,
/// and the number of same-task handoffs. `records` must be sorted by acquire time.
fn handoffs(records: &[Record]) -> (Histogram<u64>, Histogram<u64>, u64) {
    let (mut other, mut same_hist, mut same) = (histogram(), histogram(), 0);
    for pair in records.windows(2) {
        let gap = pair[1].acquire.saturating_sub(pair[0].release).max(1);
        if pair[0].task == pair[1].task {
            same += 1;
            same_hist.saturating_record(gap);
        } else {
            other.saturating_record(gap);
        }
    }
    (other, same_hist, same)
}

/// Acquisitions that broke the lock's rule: a write hold that began while any hold was active,
/// or a read hold that began while a write hold was active. Sweep over [acquire, release]
/// intervals; at equal times releases come first (the next holder's acquire can only follow the
/// previous release).
fn overlaps(records: &[Record]) -> u64 {
    // (time, 0 = release / 1 = acquire, read)
    let mut events: Vec<(u64, u8, bool)> = Vec::with_capacity(records.len() * 2);
    for r in records {
        events.push((r.acquire, 1, r.read));
        events.push((r.release, 0, r.read));
    }
    events.sort_unstable();
    let (mut readers, mut writers, mut count) = (0i64, 0i64, 0);
    for (_, what, read) in events {
        match (what, read) {
            (1, true) => {
                if writers > 0 {
                    count += 1;
                }
                readers += 1;
            }
            (1, false) => {
                if writers > 0 || readers > 0 {
                    count += 1;
                }
                writers += 1;
            }
            (_, true) => readers -= 1,
            (_, false) => writers -= 1,
        }
    }
    count
}

/// Fewest and most acquisitions of any task.
fn per_task_range(records: &[Record]) -> (u64, u64) {
    let mut counts = BTreeMap::new();
    for record in records {
        *counts.entry(record.task).or_insert(0u64) += 1;
    }
    let min = counts.values().copied().min().unwrap_or(0);
    let max = counts.values().copied().max().unwrap_or(0);
    (min, max)
}

/// rw: the read-heavy mix on an `RwLock` and on a `Mutex`.
struct RwResult {
    rwlock: LoopResult,
    mutex: LoopResult,
}

impl RwResult {
    /// RwLock operations/s over Mutex operations/s.
    fn speedup(&self) -> f64 {
        self.rwlock.acq_per_s / self.mutex.acq_per_s.max(1e-9)
    }
}

async fn run_rw(ctx: &ModeCtx<'_>) -> Result<RwResult, String> {
    let rwlock = run_loop(ctx, &RW_SPEC).await?;
    let mutex = run_loop(ctx, &RW_MUTEX_SPEC).await?;
    Ok(RwResult { rwlock, mutex })
}

// --- S3: FIFO across processes ---------------------------------------------------------------

/// One S3 round: 12 arrivals, one release.
struct S3Round {
    lock: LockKind,
    /// Arrival indices in the order the waiters acquired.
    order: Vec<usize>,
    inversions: u64,
    /// The parent's release → the last waiter's `unlock()` returned.
    drain: Duration,
    /// Fair lock: the longest time from telling a worker to start a waiter until it was in the
    /// Redis queue.
    queue_wait_max: Option<Duration>,
    overlaps: u64,
    unlock_errors: u64,
}

struct S3Result {
    ping: Summary,
    rounds: Vec<S3Round>,
}

impl S3Result {
    fn of(&self, lock: LockKind) -> impl Iterator<Item = &S3Round> {
        self.rounds.iter().filter(move |r| r.lock == lock)
    }

    /// (inversions, pairs compared, worst round) of one lock kind.
    fn inversions(&self, lock: LockKind) -> (u64, u64, u64) {
        let pairs = (S3_WAITERS * (S3_WAITERS - 1) / 2) as u64;
        let rounds: Vec<&S3Round> = self.of(lock).collect();
        (
            rounds.iter().map(|r| r.inversions).sum(),
            pairs * rounds.len() as u64,
            rounds.iter().map(|r| r.inversions).max().unwrap_or(0),
        )
    }

    fn drain(&self, lock: LockKind) -> Summary {
        let drains: Vec<Duration> = self.of(lock).map(|r| r.drain).collect();
        Summary::of_durations(&drains)
    }

    fn violations(&self, lock: LockKind) -> u64 {
        self.of(lock).map(|r| r.overlaps).sum()
    }

    fn json(&self) -> Json {
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
        json!({
            "ping": self.ping.json(),
            "waiters": S3_WAITERS,
            "processes": S3_PROCESSES,
            "arrival_gap_ms": ms(S3_GAP),
            "fair": kind(LockKind::Fair),
            "mutex": kind(LockKind::Mutex),
        })
    }
}

async fn run_s3(ctx: &ModeCtx<'_>) -> Result<S3Result, String> {
    let prefix = format!("{}-s3", ctx.prefix);
    let locks = connect_with(ctx.url, ctx.mode, &prefix, 1).await?;
    let ping = ping_summary(locks.redis(), ctx.args.pings).await?;
    let params = |id: usize| json!({ "role": "s3", "mode": ctx.name(), "prefix": prefix, "id": id, "shards": 1 });
    let mut workers = start_workers(ctx.url, S3_PROCESSES, params).await?;
    let mut rounds = Vec::new();
    for lock in [LockKind::Fair, LockKind::Mutex] {
        for round in 0..ctx.args.s3_rounds {
            let result = s3_round(&locks, &prefix, &mut workers, lock, round).await?;
            progress(&format!(
                "s3 {} {}: round {round}: order {:?}, {} inversions, drain {:.1} ms",
                ctx.name(),
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
    shutdown(&locks).await?;
    Ok(S3Result { ping, rounds })
}

async fn s3_round(
    locks: &LockClient,
    prefix: &str,
    workers: &mut [Worker],
    lock: LockKind,
    round: usize,
) -> Result<S3Round, String> {
    let name = format!("s3-{}-{round}", lock.name());
    let handle = match lock {
        LockKind::Fair => locks.fair_mutex(&name).map(fredlock::Mutex::from),
        _ => locks.mutex(&name),
    }
    .map_err(|err| err.to_string())?;
    let guard = handle
        .lock()
        .await
        .map_err(|err| format!("S3 holder: {err}"))?;
    let queue = fair_queue_key(prefix, &name);
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
            while llen(locks.redis(), &queue).await? < (i + 1) as u64 {
                if told.elapsed() > HANG {
                    return Err(format!("S3 waiter {i} never joined the queue {queue}"));
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
fn parse_acq(line: &str) -> Option<(usize, Record)> {
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

// --- Fair hand-off with 10 vs 1000 queued waiters --------------------------------------------

/// One queue length.
struct HandoffCase {
    waiters: usize,
    batches: usize,
    /// The first `HANDOFF_GAPS` gaps of every batch.
    gaps: Summary,
    /// Every gap (the whole queue draining).
    all_gaps: Summary,
    /// Longest time until all waiters of a batch were in the Redis queue.
    fill_max: Duration,
    /// Wakeups delivered per hand-off.
    wakeups_per_handoff: f64,
}

struct HandoffResult {
    ping: Summary,
    cases: Vec<HandoffCase>,
}

impl HandoffResult {
    /// p50 with the most waiters over p50 with the fewest.
    fn growth(&self) -> Option<f64> {
        let first = self.cases.first()?;
        let last = self.cases.last()?;
        (self.cases.len() > 1).then(|| last.gaps.p50 / first.gaps.p50.max(1e-9))
    }

    fn json(&self) -> Json {
        let cases: Vec<Json> = self
            .cases
            .iter()
            .map(|c| {
                json!({
                    "waiters": c.waiters,
                    "batches": c.batches,
                    "gaps": c.gaps.json(),
                    "gaps_per_ping": c.gaps.json_per_ping(self.ping.p50),
                    "all_gaps": c.all_gaps.json(),
                    "fill_max_ms": round2(ms(c.fill_max)),
                    "wakeups_per_handoff": round(c.wakeups_per_handoff, 3),
                })
            })
            .collect();
        json!({
            "ping": self.ping.json(),
            "cases": cases,
            "p50_growth": self.growth().map(|g| round(g, 3)),
        })
    }
}

async fn run_handoff(ctx: &ModeCtx<'_>) -> Result<HandoffResult, String> {
    let args = ctx.args;
    let prefix = format!("{}-s3", ctx.prefix);
    let holder = connect_with(ctx.url, ctx.mode, &prefix, 1).await?;
    let waiting = connect_with(ctx.url, ctx.mode, &prefix, 1).await?;
    let ping = ping_summary(waiting.redis(), args.pings).await?;
    let mut cases = Vec::new();
    for (n, batches) in [
        (10, args.handoff_batches_10),
        (1000, args.handoff_batches_1000),
    ] {
        let (mut first, mut all, mut fill_max) = (Vec::new(), Vec::new(), Duration::ZERO);
        let mut wakeups = 0;
        for batch in 0..batches {
            let before = waiting.stats().wakeups;
            let outcome = handoff_batch(&holder, &waiting, &prefix, n, batch).await?;
            wakeups += waiting.stats().wakeups - before;
            first.extend(outcome.gaps.iter().take(HANDOFF_GAPS));
            all.extend(outcome.gaps);
            fill_max = fill_max.max(outcome.fill);
        }
        let case = HandoffCase {
            waiters: n,
            batches,
            gaps: Summary::of_durations(&first),
            all_gaps: Summary::of_durations(&all),
            fill_max,
            wakeups_per_handoff: wakeups as f64 / all.len().max(1) as f64,
        };
        progress(&format!(
            "fair-handoff {}: {n} queued: gap p50 {:.1} µs = {:.2} × PING, p99 {:.1} µs",
            ctx.name(),
            case.gaps.p50,
            ratio(case.gaps.p50, ping.p50),
            case.gaps.p99
        ));
        cases.push(case);
    }
    shutdown(&holder).await?;
    shutdown(&waiting).await?;
    Ok(HandoffResult { ping, cases })
}

struct BatchOutcome {
    /// In acquisition order: the gap before each acquisition.
    gaps: Vec<Duration>,
    fill: Duration,
}

async fn handoff_batch(
    holder: &LockClient,
    waiting: &LockClient,
    prefix: &str,
    n: usize,
    batch: usize,
) -> Result<BatchOutcome, String> {
    let name = format!("handoff-{n}-{batch}");
    let guard = holder
        .fair_mutex(&name)
        .map_err(|err| err.to_string())?
        .lock()
        .await
        .map_err(|err| format!("hand-off holder: {err}"))?;
    let mutex = waiting.fair_mutex(&name).map_err(|err| err.to_string())?;
    let queue = fair_queue_key(prefix, &name);
    // (acquired, unlock called)
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Instant)>();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (mutex, tx) = (mutex.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.map_err(|err| err.to_string())?;
            let acquired = Instant::now();
            let released = Instant::now();
            guard.unlock().await.map_err(|err| err.to_string())?;
            let _ = tx.send((acquired, released));
            Ok::<(), String>(())
        }));
    }
    drop(tx);
    while llen(holder.redis(), &queue).await? < n as u64 {
        if started.elapsed() > HANG {
            return Err(format!(
                "not all {n} waiters joined {queue} within {HANG:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let fill = started.elapsed();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let release = Instant::now();
    guard
        .unlock()
        .await
        .map_err(|err| format!("hand-off holder unlock: {err}"))?;
    let mut records = Vec::with_capacity(n);
    while records.len() < n {
        match tokio::time::timeout(HANG, rx.recv()).await {
            Ok(Some(record)) => records.push(record),
            Ok(None) => break,
            Err(_) => return Err(format!("hand-off {n}: a waiter hung")),
        }
    }
    for task in tasks {
        task.await.map_err(|err| err.to_string())??;
    }
    if records.len() < n {
        return Err(format!(
            "hand-off {n}: only {} waiters acquired",
            records.len()
        ));
    }
    records.sort_by_key(|&(acquired, _)| acquired);
    let mut gaps = Vec::with_capacity(n);
    let mut previous = release;
    for &(acquired, released) in &records {
        gaps.push(acquired.saturating_duration_since(previous));
        previous = released;
    }
    Ok(BatchOutcome { gaps, fill })
}

// --- S4: connection economy ------------------------------------------------------------------

/// One S4 case as reported by its worker process (see `worker::s4`).
struct S4Case(Json);

impl S4Case {
    fn num(&self, path: &[&str]) -> f64 {
        let mut value = &self.0;
        for key in path {
            value = &value[*key];
        }
        value.as_f64().unwrap_or(f64::NAN)
    }

    fn waiters(&self) -> f64 {
        self.num(&["waiters"])
    }

    fn waiting_client_connections(&self) -> f64 {
        self.num(&["connections", "waiting_client"])
    }

    fn rss_per_waiter(&self) -> f64 {
        self.num(&["rss_per_waiter_bytes"])
    }
}

struct S4Result {
    cases: Vec<S4Case>,
}

async fn run_s4(ctx: &ModeCtx<'_>) -> Result<S4Result, String> {
    let mut cases = Vec::new();
    for &n in &ctx.args.s4_waiters {
        let prefix = format!("{}-s4-{n}", ctx.prefix);
        let params = json!({
            "role": "s4",
            "mode": ctx.name(),
            "prefix": prefix,
            "waiters": n,
            "pings": ctx.args.pings,
            "holder_lease": ctx.holder_lease.name(),
        });
        let mut worker = Worker::spawn(ctx.url, 0, params)?;
        let line = worker.next_line(Duration::from_secs(600)).await?;
        worker.finish().await?;
        let value: Json =
            serde_json::from_str(&line).map_err(|err| format!("S4: bad line {line:?}: {err}"))?;
        if let Some(error) = value.get("error").and_then(Json::as_str) {
            return Err(format!("S4 with {n} waiters: {error}"));
        }
        let case = S4Case(value);
        progress(&format!(
            "s4 {}: {n} waiters: waiting client {} connections, {:.0} B RSS per waiter, lock() \
             future {} B",
            ctx.name(),
            case.waiting_client_connections(),
            case.rss_per_waiter(),
            case.num(&["lock_future_bytes"])
        ));
        cases.push(case);
    }
    Ok(S4Result { cases })
}

// --- S5: wakeup latency, Stream vs Pub/Sub ---------------------------------------------------

/// One mode's clients and samples.
struct S5Side {
    mode: NotificationMode,
    holder: LockClient,
    clients: Vec<LockClient>,
    lock: fredlock::Mutex,
    waiter_locks: Vec<fredlock::Mutex>,
    ping_hot: Summary,
    latency: Vec<Duration>,
    unlock: Vec<Duration>,
    idle_ping: Vec<Duration>,
    overlaps: u64,
    wakeups_before: u64,
}

struct S5Mode {
    mode: NotificationMode,
    ping_hot: Summary,
    ping_idle: Summary,
    latency: Summary,
    unlock: Summary,
    wakeups_per_round: f64,
    overlaps: u64,
}

struct S5Result {
    rounds: usize,
    modes: Vec<S5Mode>,
}

impl S5Result {
    fn mode(&self, mode: NotificationMode) -> Option<&S5Mode> {
        self.modes.iter().find(|m| m.mode == mode)
    }

    /// Stream p50 over Pub/Sub p50.
    fn stream_over_pubsub(&self) -> Option<f64> {
        let stream = self.mode(NotificationMode::Stream)?;
        let pubsub = self.mode(NotificationMode::PubSub)?;
        Some(stream.latency.p50 / pubsub.latency.p50.max(1e-9))
    }

    fn json(&self) -> Json {
        let modes: serde_json::Map<String, Json> = self
            .modes
            .iter()
            .map(|m| {
                (
                    mode_name(m.mode).to_owned(),
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

async fn run_s5(ctxs: &[ModeCtx<'_>]) -> Result<S5Result, String> {
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
            mode_name(mode.mode),
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
async fn s5_round(side: &mut S5Side) -> Result<(), String> {
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

// --- S6: recovery after a notifier kill ------------------------------------------------------

struct S6Run {
    distinct: bool,
    /// Notifier connections killed.
    killed: u64,
    /// Kill → the killed notifier connection(s) reading again (`CLIENT LIST`), if seen.
    reconnect: Option<Duration>,
    /// Kill → release call.
    kill_to_release: Duration,
    /// Release → each waiter's `lock()` returned, sorted.
    acquired: Vec<Duration>,
    wakeups: u64,
}

impl S6Run {
    fn variant(&self) -> &'static str {
        if self.distinct {
            "100 locks"
        } else {
            "one lock"
        }
    }

    fn all_acquired(&self) -> bool {
        self.acquired.len() == S6_WAITERS
    }

    fn last(&self) -> Option<Duration> {
        self.acquired.last().copied()
    }

    /// All acquired within 1 s of the release, plus the reconnect delay.
    fn met(&self) -> bool {
        let allowed = Duration::from_secs(1) + self.reconnect.unwrap_or(Duration::ZERO);
        self.all_acquired() && self.last().is_some_and(|last| last <= allowed)
    }

    fn json(&self) -> Json {
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

struct S6Result {
    ping: Summary,
    holder_lease: HolderLease,
    runs: Vec<S6Run>,
}

async fn run_s6(ctx: &ModeCtx<'_>) -> Result<S6Result, String> {
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

async fn s6_run(
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
    wait_for_evalsha(probe, &before, S6_WAITERS as u64).await?;
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

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

/// One target: its scenario, its wording, and per mode (value, met).
struct TargetRow {
    scenario: &'static str,
    label: String,
    cells: Vec<(NotificationMode, String, bool)>,
}

impl TargetRow {
    fn new(scenario: &'static str, label: impl Into<String>) -> TargetRow {
        TargetRow {
            scenario,
            label: label.into(),
            cells: Vec::new(),
        }
    }

    fn cell(mut self, mode: NotificationMode, value: String, met: bool) -> TargetRow {
        self.cells.push((mode, value, met));
        self
    }
}

/// Builds one row with a cell per mode from `f(result) -> (value, met)`.
fn row<T>(
    scenario: &'static str,
    label: &str,
    results: &[(NotificationMode, T)],
    f: impl Fn(&T) -> (String, bool),
) -> Option<TargetRow> {
    if results.is_empty() {
        return None;
    }
    let mut row = TargetRow::new(scenario, label);
    for (mode, result) in results {
        let (value, met) = f(result);
        row = row.cell(*mode, value, met);
    }
    Some(row)
}

/// The targets of SPEC §6 and the benchmark issues.
fn targets(report: &Report) -> Vec<TargetRow> {
    let mut rows: Vec<Option<TargetRow>> =
        vec![row("s1", "cycle p50 ≤ 2.1 × PING", &report.s1, |s1| {
            let r = ratio(s1.cycle.p50, s1.ping.p50);
            (format!("{r:.2}"), r <= 2.1)
        })];
    for (name, list) in [("s2", &report.s2), ("s2-fair", &report.s2_fair)] {
        if name == "s2" {
            rows.push(row(name, "acq/s × PING p50 ≥ 0.30", list, |r| {
                (
                    format!("{:.3}", r.throughput_ratio()),
                    r.throughput_ratio() >= 0.30,
                )
            }));
        }
        rows.push(row(
            name,
            "handoff to another task p50 ≤ 2.5 × PING",
            list,
            |r| {
                let x = ratio(r.handoff_other.p50, r.ping.p50);
                (format!("{x:.2}"), x <= 2.5)
            },
        ));
        if name == "s2" {
            rows.push(row(
                name,
                "handoff to another task p99 ≤ 10 × PING",
                list,
                |r| {
                    let x = ratio(r.handoff_other.p99, r.ping.p50);
                    (format!("{x:.2}"), x <= 10.0)
                },
            ));
        }
        rows.push(row(
            name,
            "violations (overlaps + lost updates) = 0",
            list,
            |r| (r.violations().to_string(), r.violations() == 0),
        ));
    }
    rows.push(row(
        "s3",
        "fair lock inversions vs arrival = 0",
        &report.s3,
        |r| {
            let (inv, pairs, _) = r.inversions(LockKind::Fair);
            (format!("{inv} of {pairs}"), inv == 0)
        },
    ));
    rows.push(row("s3", "violations = 0", &report.s3, |r| {
        let v = r.violations(LockKind::Fair) + r.violations(LockKind::Mutex);
        (v.to_string(), v == 0)
    }));
    rows.push(row(
        "fair-handoff",
        "gap p50 with 1000 queued ≤ 2 × with 10 queued",
        &report.handoff,
        |r| match r.growth() {
            Some(g) => (format!("{g:.2}×"), g <= 2.0),
            None => ("n/a".into(), false),
        },
    ));
    rows.push(row(
        "rw",
        "RwLock ops/s ≥ Mutex ops/s, same mix (expected; no SPEC figure)",
        &report.rw,
        |r| (format!("{:.2}×", r.speedup()), r.speedup() >= 1.0),
    ));
    rows.push(row(
        "rw",
        "no RwLock wait > 1 s (a lost wakeup; holds last µs)",
        &report.rw,
        |r| (r.rwlock.stalls.to_string(), r.rwlock.stalls == 0),
    ));
    rows.push(row("rw", "violations = 0", &report.rw, |r| {
        let v = r.rwlock.violations() + r.mutex.violations();
        (v.to_string(), v == 0)
    }));
    rows.push(row(
        "s4",
        "waiting client ≤ 3 connections (standalone)",
        &report.s4,
        |r| {
            let worst = r
                .cases
                .iter()
                .map(S4Case::waiting_client_connections)
                .fold(0.0, f64::max);
            let text = r
                .cases
                .iter()
                .map(|c| format!("{}: {}", c.waiters(), c.waiting_client_connections()))
                .collect::<Vec<_>>()
                .join(", ");
            (text, worst <= 3.0)
        },
    ));
    rows.push(row("s4", "RSS ≤ 2 KiB per waiter", &report.s4, |r| {
        let text = r
            .cases
            .iter()
            .map(|c| format!("{}: {:.0} B", c.waiters(), c.rss_per_waiter()))
            .collect::<Vec<_>>()
            .join(", ");
        // The largest case decides: small cases are dominated by page granularity.
        let decisive = r
            .cases
            .iter()
            .max_by(|a, b| a.waiters().total_cmp(&b.waiters()))
            .map_or(f64::NAN, S4Case::rss_per_waiter);
        (text, decisive <= 2048.0)
    }));
    if let Some(s5) = &report.s5 {
        let mut row = TargetRow::new("s5", "stream p50 ≤ 1.2 × pubsub p50");
        let (value, met) = match s5.stream_over_pubsub() {
            Some(r) => (format!("{r:.2}×"), r <= 1.2),
            None => ("n/a (needs both modes)".into(), false),
        };
        for m in &s5.modes {
            row = row.cell(m.mode, value.clone(), met);
        }
        rows.push(Some(row));
        let mut row = TargetRow::new("s5", "mutual exclusion (overlaps = 0)");
        for m in &s5.modes {
            row = row.cell(m.mode, m.overlaps.to_string(), m.overlaps == 0);
        }
        rows.push(Some(row));
    }
    for distinct in [false, true] {
        let label = if distinct {
            "100 locks: all 100 acquired ≤ 1 s after release + reconnect delay"
        } else {
            "one lock: all 100 acquired ≤ 1 s after release + reconnect delay"
        };
        rows.push(row("s6", label, &report.s6, |r| {
            let runs: Vec<&S6Run> = r.runs.iter().filter(|x| x.distinct == distinct).collect();
            let met = runs.iter().filter(|x| x.met()).count();
            let worst = runs.iter().filter_map(|x| x.last()).max();
            let text = format!(
                "{met} of {} runs; slowest: all in {}",
                runs.len(),
                worst.map_or_else(|| "–".to_owned(), |d| format!("{:.0} ms", ms(d)))
            );
            (text, !runs.is_empty() && met == runs.len())
        }));
    }
    rows.into_iter().flatten().collect()
}

fn markdown(args: &Args, report: &Report, version: &str) -> String {
    let mut out = format!(
        "### fredlock benchmarks (Redis {version}, {} CPUs{})\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if args.quick { ", --quick" } else { "" }
    );
    if !report.s1.is_empty() {
        out += &s1_table(args, &report.s1);
    }
    if !report.s2.is_empty() {
        out += &loop_table(
            &format!(
                "S2 contended Mutex: {} processes × {} tasks on one lock for {} s, GET + SET \
                 inside",
                args.processes, args.tasks, args.seconds
            ),
            &report.s2,
        );
    }
    if !report.s2_fair.is_empty() {
        out += &loop_table(
            &format!(
                "S2 on FairMutex: {} processes × {} tasks on one fair lock for {} s, GET + SET \
                 inside",
                args.processes, args.tasks, args.seconds
            ),
            &report.s2_fair,
        );
    }
    if !report.s3.is_empty() {
        out += &s3_table(args, &report.s3);
    }
    if !report.handoff.is_empty() {
        out += &handoff_table(&report.handoff);
    }
    if !report.rw.is_empty() {
        out += &rw_table(args, &report.rw);
    }
    if !report.s4.is_empty() {
        out += &s4_table(&report.s4);
    }
    if let Some(s5) = &report.s5 {
        out += &s5_table(s5);
    }
    if !report.s6.is_empty() {
        out += &s6_table(&report.s6);
    }
    out += &targets_table(args, report);
    if !report.notes.is_empty() {
        out += "\n#### Notes\n\n";
        for note in &report.notes {
            out += &format!("* {note}\n");
        }
    }
    if !report.errors.is_empty() {
        out += "\n#### Failed scenarios\n\n";
        for (scenario, mode, message) in &report.errors {
            out += &format!(
                "* {} {}: {message}\n",
                scenario.name(),
                mode.map_or("", mode_name)
            );
        }
    }
    out
}

fn s1_table(args: &Args, results: &[(NotificationMode, S1Result)]) -> String {
    let mut out = format!(
        "#### S1 uncontended: {} × lock + unlock, one task, after {} warm-up (µs)\n\n",
        args.cycles, args.warmup
    );
    out += "| mode | PING p50 | cycle p50 | cycle p99 | p50 / PING | p99 / PING | lock p50 \
            | unlock p50 | floor: 2 bare EVALSHA p50 (/ PING) | EVALSHA per cycle (server µs per \
            call) | PING server µs per call |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, s1) in results {
        let ping = s1.ping.p50;
        let (evalsha, evalsha_us) = s1.commands.per_op("evalsha", s1.cycles);
        let (_, ping_us) = s1.commands.per_op("ping", 1);
        out += &format!(
            "| {} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.2} | {:.1} | {:.1} | {:.1} ({:.2}) \
             | {:.2} ({:.1}) | {:.1} |\n",
            mode_name(*mode),
            ping,
            s1.cycle.p50,
            s1.cycle.p99,
            ratio(s1.cycle.p50, ping),
            ratio(s1.cycle.p99, ping),
            s1.lock.p50,
            s1.unlock.p50,
            s1.floor.p50,
            ratio(s1.floor.p50, ping),
            evalsha,
            evalsha_us,
            ping_us
        );
    }
    out + "\n"
}

fn loop_table(title: &str, results: &[(NotificationMode, LoopResult)]) -> String {
    let mut out = format!("#### {title} (µs; × = ratio to PING p50)\n\n");
    out += "| mode | PING p50 (before / after) | acquisitions in window (all) | acq/s | acq/s × \
            PING | handoff to another task p50 | p99 | max | handoff to same task p50 | same-task \
            share | wakeups / acq |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        let x = |v: f64| times_ping(v, r.ping.p50);
        let same = if r.handoff_same.count == 0 {
            "–".to_owned()
        } else {
            x(r.handoff_same.p50)
        };
        out += &format!(
            "| {} | {:.1} ({:.1} / {:.1}) | {} ({}) | {:.0} | **{:.3}** | {} | {} | {} | {} | \
             {:.1} % | {:.2} |\n",
            mode_name(*mode),
            r.ping.p50,
            r.ping_before.p50,
            r.ping_after.p50,
            r.in_window,
            r.acquisitions,
            r.acq_per_s,
            r.throughput_ratio(),
            x(r.handoff_other.p50),
            x(r.handoff_other.p99),
            x(r.handoff_other.max),
            same,
            r.same_share * 100.0,
            r.wakeups_per_acquisition()
        );
    }
    out += "\n| mode | wait p50 | wait p99 | longest wait: in window / overall | waits > 1 s \
            | acquisitions per task min–max | drain after window | CPU µs per acquisition (workers / redis) \
            | machine busy | EVALSHA per acquisition (server µs per call) | overlapping holds \
            | counter / increments | unlock errors |\n\
            |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        let (workers_cpu, redis_cpu) = r.cpu_per_acquisition();
        let redis_cpu = redis_cpu.map_or("n/a".to_owned(), |us| format!("{us:.0}"));
        let (evalsha, evalsha_us) = r.commands.per_op("evalsha", r.in_window);
        out += &format!(
            "| {} | {} | {} | {:.1} ms / {:.1} ms | {} | {}–{} | {:.3} s | {:.0} / {} | {:.0} % \
             | {:.2} ({:.1}) | {} | {} / {} | {} |\n",
            mode_name(*mode),
            times_ping(r.wait.p50, r.ping.p50),
            times_ping(r.wait.p99, r.ping.p50),
            r.longest_wait_in_window_us as f64 / 1000.0,
            r.wait.max / 1000.0,
            r.stalls,
            r.per_task_min,
            r.per_task_max,
            r.drain_s,
            workers_cpu,
            redis_cpu,
            r.machine_busy() * 100.0,
            evalsha,
            evalsha_us,
            r.overlaps,
            r.counter,
            r.writes,
            r.unlock_errors
        );
    }
    out + "\n"
}

fn s3_table(args: &Args, results: &[(NotificationMode, S3Result)]) -> String {
    let mut out = format!(
        "#### S3 FIFO: {S3_WAITERS} waiters from {S3_PROCESSES} processes arriving {} ms apart \
         while the lock is held; {} rounds per lock\n\n",
        ms(S3_GAP),
        args.s3_rounds
    );
    out += "| mode | lock | PING p50 µs | inversions (of pairs) | worst round | acquisition \
            order, first round | drain p50 / max ms (× PING) | arrival → in Redis queue, max \
            ms | overlaps |\n|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for lock in [LockKind::Fair, LockKind::Mutex] {
            let (inversions, pairs, worst) = r.inversions(lock);
            let drain = r.drain(lock);
            let first = r
                .of(lock)
                .next()
                .map(|round| format!("{:?}", round.order))
                .unwrap_or_default();
            let queue_wait = r
                .of(lock)
                .filter_map(|round| round.queue_wait_max)
                .max()
                .map_or("–".to_owned(), |d| format!("{:.1}", ms(d)));
            out += &format!(
                "| {} | {} | {:.1} | **{inversions}** of {pairs} | {worst} | {first} | \
                 {:.1} / {:.1} ({:.0}× / {:.0}×) | {queue_wait} | {} |\n",
                mode_name(*mode),
                if lock == LockKind::Fair {
                    "FairMutex"
                } else {
                    "Mutex (barging)"
                },
                r.ping.p50,
                drain.p50 / 1e3,
                drain.max / 1e3,
                ratio(drain.p50, r.ping.p50),
                ratio(drain.max, r.ping.p50),
                r.violations(lock)
            );
        }
    }
    out + "\n"
}

fn handoff_table(results: &[(NotificationMode, HandoffResult)]) -> String {
    let mut out = format!(
        "#### Fair hand-off with 10 vs 1000 queued waiters: release → next holder's lock() \
         returned, first {HANDOFF_GAPS} hand-offs of each batch (µs)\n\n"
    );
    out += "| mode | queued | batches | PING p50 | gap p50 | p90 | p99 | max | all gaps p50 \
            (whole drain) | time until all queued | wakeups per hand-off | p50 growth 10 → 1000 \
            |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        let growth = r
            .growth()
            .map_or("–".to_owned(), |g| format!("**{g:.2}×**"));
        for case in &r.cases {
            let x = |v: f64| times_ping(v, r.ping.p50);
            out += &format!(
                "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {:.0} ms | {:.2} | {} |\n",
                mode_name(*mode),
                case.waiters,
                case.batches,
                r.ping.p50,
                x(case.gaps.p50),
                x(case.gaps.p90),
                x(case.gaps.p99),
                x(case.gaps.max),
                x(case.all_gaps.p50),
                ms(case.fill_max),
                case.wakeups_per_handoff,
                if case.waiters == r.cases.last().map_or(0, |c| c.waiters) {
                    growth.as_str()
                } else {
                    ""
                }
            );
        }
    }
    out + "\n"
}

fn rw_table(args: &Args, results: &[(NotificationMode, RwResult)]) -> String {
    let mut out = format!(
        "#### Read-heavy mix: {} processes × {} tasks, 90 % reads (GET) / 10 % writes (GET + \
         SET), {} s per lock (µs; × = ratio to PING p50)\n\n",
        args.processes, args.tasks, args.seconds
    );
    out += "| mode | lock | PING p50 | ops/s | ops/s × PING | reads / writes | read wait p50 \
            | read wait p99 | write wait p50 | write wait p99 | longest wait (waits > 1 s) | CPU µs \
            per op (workers / redis) | violations | counter / writes | RwLock ÷ Mutex ops/s \
            |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for (label, l) in [("RwLock", &r.rwlock), ("Mutex", &r.mutex)] {
            let (workers_cpu, redis_cpu) = l.cpu_per_acquisition();
            out += &format!(
                "| {} | {label} | {:.1} | {:.0} | {:.3} | {} / {} | {} | {} | {} | {} | {:.1} ms \
                 ({}) | {:.0} / {} | {} | {} / {} | {} |\n",
                mode_name(*mode),
                l.ping.p50,
                l.acq_per_s,
                l.throughput_ratio(),
                l.reads,
                l.writes,
                times_ping(l.wait_read.p50, l.ping.p50),
                times_ping(l.wait_read.p99, l.ping.p50),
                times_ping(l.wait_write.p50, l.ping.p50),
                times_ping(l.wait_write.p99, l.ping.p50),
                l.wait.max / 1e3,
                l.stalls,
                workers_cpu,
                redis_cpu.map_or("n/a".to_owned(), |us| format!("{us:.0}")),
                l.violations(),
                l.counter,
                l.writes,
                if label == "RwLock" {
                    format!("**{:.2}×**", r.speedup())
                } else {
                    String::new()
                }
            );
        }
    }
    out + "\n"
}

fn s4_table(results: &[(NotificationMode, S4Result)]) -> String {
    let mut out = String::from(
        "#### S4 connection economy: N waiters on N distinct locks in one process, all held by \
         another LockClient\n\n",
    );
    out += "| mode | waiters | PING p50 µs | connected_clients: before → + holder client → + \
            waiting client, all waiting | waiting client's connections | RSS per waiter (incl. \
            task + future) | live heap per waiter | pending `lock()` future | whole task future \
            | all first attempts done | all acquired after the releases began |\n\
            |---|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for c in &r.cases {
            out += &format!(
                "| {} | {} | {:.1} | {} → {} → {} | **{}** | **{:.0} B** | {:.0} B | {} B | {} B \
                 | {:.2} s | {:.2} s |\n",
                mode_name(*mode),
                c.waiters(),
                c.num(&["ping", "p50_us"]),
                c.num(&["connections", "baseline"]),
                c.num(&["connections", "after_holder"]),
                c.num(&["connections", "while_waiting"]),
                c.waiting_client_connections(),
                c.rss_per_waiter(),
                c.num(&["heap_per_waiter_bytes"]),
                c.num(&["lock_future_bytes"]),
                c.num(&["task_future_bytes"]),
                c.num(&["first_attempts_s"]),
                c.num(&["all_acquired_after_release_s"]),
            );
        }
    }
    out + "\n"
}

fn s5_table(r: &S5Result) -> String {
    let mut out = format!(
        "#### S5 wakeup latency: unlock() called → first waiter's lock() returned; 1 holder + \
         {S5_CLIENTS} waiting LockClients, {} rounds per mode, interleaved (µs; × = ratio to \
         PING p50 / to PING after {} ms idle)\n\n",
        r.rounds,
        ms(S5_SETTLE)
    );
    out += "| mode | PING p50 | PING p50 after idle | p50 | p90 | p99 | max | holder's unlock() \
            call p50 | wakeups per round | overlaps |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for m in &r.modes {
        let x = |v: f64| {
            format!(
                "{v:.0} ({:.2}× / {:.2}×)",
                ratio(v, m.ping_hot.p50),
                ratio(v, m.ping_idle.p50)
            )
        };
        out += &format!(
            "| {} | {:.1} | {:.1} | **{}** | {} | {} | {} | {:.0} | {:.2} | {} |\n",
            mode_name(m.mode),
            m.ping_hot.p50,
            m.ping_idle.p50,
            x(m.latency.p50),
            x(m.latency.p90),
            x(m.latency.p99),
            x(m.latency.max),
            m.unlock.p50,
            m.wakeups_per_round,
            m.overlaps
        );
    }
    if let Some(ratio) = r.stream_over_pubsub() {
        out += &format!("\nStream p50 / Pub/Sub p50 = **{ratio:.2}**\n");
    }
    out + "\n"
}

fn s6_table(results: &[(NotificationMode, S6Result)]) -> String {
    let lease = results
        .first()
        .map_or("fixed", |(_, r)| r.holder_lease.name());
    let mut out = format!(
        "#### S6 recovery: {S6_WAITERS} waiting tasks, their client's notifier connection \
         killed, then the holder ({lease} {} s lease) releases (ms after the release)\n\n",
        LONG_LEASE.as_secs()
    );
    out += "| mode | waiting on | PING p50 µs | killed connections | notifier reading again \
            after the kill | first acquired | median | all acquired | wakeups | within 1 s + \
            reconnect |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for (mode, r) in results {
        for run in &r.runs {
            let at = |d: Option<Duration>| d.map_or("–".to_owned(), |d| format!("{:.1}", ms(d)));
            out += &format!(
                "| {} | {} | {:.1} | {} | {} ms | {} | {} | **{}** ({}/{S6_WAITERS}) | {} | {} \
                 |\n",
                mode_name(*mode),
                run.variant(),
                r.ping.p50,
                run.killed,
                at(run.reconnect),
                at(run.acquired.first().copied()),
                at(run.acquired.get(run.acquired.len() / 2).copied()),
                at(run.last()),
                run.acquired.len(),
                run.wakeups,
                if run.met() { "yes" } else { "**NO**" }
            );
        }
    }
    out + "\n"
}

fn targets_table(args: &Args, report: &Report) -> String {
    let mut out = String::from("#### Targets\n\n| scenario | target |");
    for mode in &args.modes {
        out += &format!(" {} |", mode_name(*mode));
    }
    out += "\n|---|---|";
    out += &"---|".repeat(args.modes.len());
    out += "\n";
    for row in targets(report) {
        out += &format!("| {} | {} |", row.scenario, row.label);
        for mode in &args.modes {
            match row.cells.iter().find(|(m, _, _)| m == mode) {
                Some((_, value, met)) => {
                    out += &format!(" {value} {} |", if *met { "met" } else { "**MISSED**" })
                }
                None => out += " – |",
            }
        }
        out += "\n";
    }
    out
}

fn write_json(args: &Args, report: &Report, version: &str) -> Result<(), String> {
    fn per_mode<T>(list: &[(NotificationMode, T)], f: impl Fn(&T) -> Json) -> Json {
        Json::Object(
            list.iter()
                .map(|(mode, r)| (mode_name(*mode).to_owned(), f(r)))
                .collect(),
        )
    }
    let mut scenarios = serde_json::Map::new();
    if !report.s1.is_empty() {
        scenarios.insert("s1".into(), per_mode(&report.s1, s1_json));
    }
    if !report.s2.is_empty() {
        scenarios.insert("s2".into(), per_mode(&report.s2, LoopResult::json));
    }
    if !report.s2_fair.is_empty() {
        scenarios.insert(
            "s2-fair".into(),
            per_mode(&report.s2_fair, LoopResult::json),
        );
    }
    if !report.s3.is_empty() {
        scenarios.insert("s3".into(), per_mode(&report.s3, S3Result::json));
    }
    if !report.handoff.is_empty() {
        scenarios.insert(
            "fair-handoff".into(),
            per_mode(&report.handoff, HandoffResult::json),
        );
    }
    if !report.rw.is_empty() {
        scenarios.insert(
            "rw".into(),
            per_mode(&report.rw, |r| {
                json!({
                    "rwlock": r.rwlock.json(),
                    "mutex": r.mutex.json(),
                    "rwlock_over_mutex_ops": round(r.speedup(), 3),
                })
            }),
        );
    }
    if !report.s4.is_empty() {
        scenarios.insert(
            "s4".into(),
            per_mode(&report.s4, |r| {
                Json::Array(r.cases.iter().map(|c| c.0.clone()).collect())
            }),
        );
    }
    if let Some(s5) = &report.s5 {
        scenarios.insert("s5".into(), s5.json());
    }
    if !report.s6.is_empty() {
        scenarios.insert(
            "s6".into(),
            per_mode(&report.s6, |r| {
                json!({
                    "ping": r.ping.json(),
                    "holder_lease": format!("{:?}", r.holder_lease.lease()),
                    "runs": r.runs.iter().map(S6Run::json).collect::<Vec<_>>(),
                })
            }),
        );
    }
    let targets: Vec<Json> = targets(report)
        .into_iter()
        .flat_map(|row| {
            row.cells.into_iter().map(move |(mode, value, met)| {
                json!({
                    "scenario": row.scenario,
                    "target": row.label,
                    "mode": mode_name(mode),
                    "value": value,
                    "met": met,
                })
            })
        })
        .collect();
    let errors: Vec<Json> = report
        .errors
        .iter()
        .map(|(scenario, mode, message)| {
            json!({ "scenario": scenario.name(), "mode": mode.map(mode_name), "error": message })
        })
        .collect();
    let doc = json!({
        "machine": machine_json(version),
        "quick": args.quick,
        "settings": {
            "scenarios": args.scenarios.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "modes": args.modes.iter().map(|m| mode_name(*m)).collect::<Vec<_>>(),
            "cycles": args.cycles,
            "warmup": args.warmup,
            "pings": args.pings,
            "seconds": args.seconds,
            "processes": args.processes,
            "tasks": args.tasks,
            "s3_rounds": args.s3_rounds,
            "handoff_batches": [args.handoff_batches_10, args.handoff_batches_1000],
            "s4_waiters": args.s4_waiters,
            "s5_rounds": args.s5_rounds,
            "s6_reps": args.s6_reps,
        },
        "scenarios": scenarios,
        "targets": targets,
        "errors": errors,
        "notes": report.notes,
    });
    if let Some(dir) = args.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc).expect("JSON serialization");
    std::fs::write(&args.json, text + "\n")
        .map_err(|err| format!("cannot write {}: {err}", args.json.display()))?;
    progress(&format!("wrote {}", args.json.display()));
    Ok(())
}

fn s1_json(s1: &S1Result) -> Json {
    json!({
        "ping": s1.ping.json(),
        "cycle": s1.cycle.json(),
        "lock": s1.lock.json(),
        "unlock": s1.unlock.json(),
        "cycle_p50_per_ping": round(ratio(s1.cycle.p50, s1.ping.p50), 3),
        "floor_two_bare_evalsha": s1.floor.json(),
        "floor_p50_per_ping": round(ratio(s1.floor.p50, s1.ping.p50), 3),
        "cycle_p99_per_ping": round(ratio(s1.cycle.p99, s1.ping.p50), 3),
        "redis_commands_per_cycle": s1.commands.json(s1.cycles),
    })
}

// ---------------------------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------------------------

/// The re-executed bench: `--bench-worker <JSON parameters>`, URL in `FREDLOCK_BENCH_URL`.
///
/// * `loop` (s2, s2-fair, rw): prints `READY`, waits for `GO <start µs>` on stdin, runs its tasks
///   until start + seconds, then prints one JSON array per acquisition (see [`Record`]), a
///   `{"wakeups": n}` object and `DONE`.
/// * `s3`: prints `READY`; for each `START <mutex|fair> <name> <index>` line starts a task that
///   takes the lock, does `GET` + `SET` of a counter, unlocks and prints
///   `ACQ <index> <start> <acquire> <release> <done> <ok>` (wall-clock µs); ends on `QUIT`.
/// * `s4`: runs S4 for one number of waiters and prints one JSON object.
mod worker {
    use super::*;

    pub(super) fn main(raw: &[String]) -> i32 {
        let params = match raw {
            [params] => match serde_json::from_str::<Json>(params) {
                Ok(params) => params,
                Err(err) => {
                    eprintln!("bench worker: bad parameters: {err}");
                    return 2;
                }
            },
            _ => {
                eprintln!("bench worker: expected one JSON argument, got {raw:?}");
                return 2;
            }
        };
        let Ok(url) = std::env::var(WORKER_URL_ENV) else {
            eprintln!("bench worker: {WORKER_URL_ENV} unset");
            return 2;
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("build the tokio runtime");
        match runtime.block_on(run(&params, &url)) {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("bench worker ({}): {message}", params["role"]);
                1
            }
        }
    }

    fn text<'a>(params: &'a Json, key: &str) -> Result<&'a str, String> {
        params[key]
            .as_str()
            .ok_or_else(|| format!("parameter {key} missing"))
    }

    fn number(params: &Json, key: &str) -> Result<u64, String> {
        params[key]
            .as_u64()
            .ok_or_else(|| format!("parameter {key} missing"))
    }

    fn float(params: &Json, key: &str) -> Result<f64, String> {
        params[key]
            .as_f64()
            .ok_or_else(|| format!("parameter {key} missing"))
    }

    async fn run(params: &Json, url: &str) -> Result<(), String> {
        let mode = parse_mode(text(params, "mode")?)?;
        let prefix = text(params, "prefix")?;
        match text(params, "role")? {
            "loop" => run_loop(params, url, mode, prefix).await,
            "s3" => run_s3(url, mode, prefix).await,
            "s4" => {
                let waiters = number(params, "waiters")? as usize;
                let pings = number(params, "pings")?;
                let lease = HolderLease::parse(text(params, "holder_lease")?).lease();
                let line = match s4(url, mode, prefix, waiters, pings, lease).await {
                    Ok(value) => value,
                    Err(message) => json!({ "error": message }),
                };
                say(&line.to_string())
            }
            other => Err(format!("unknown role {other:?}")),
        }
    }

    fn say(line: &str) -> Result<(), String> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{line}")
            .and_then(|_| stdout.flush())
            .map_err(|err| format!("stdout: {err}"))
    }

    /// The lock one looping task takes.
    #[derive(Clone)]
    enum TaskLock {
        Exclusive(fredlock::Mutex),
        Rw(fredlock::RwLock),
    }

    async fn run_loop(
        params: &Json,
        url: &str,
        mode: NotificationMode,
        prefix: &str,
    ) -> Result<(), String> {
        let (id, tasks) = (number(params, "id")?, number(params, "tasks")?);
        let seconds = float(params, "seconds")?;
        let read_share = float(params, "read_share")?;
        let name = text(params, "name")?;
        let locks = connect(url, mode, prefix).await?;
        let lock = match LockKind::parse(text(params, "lock")?)? {
            LockKind::Mutex => locks.mutex(name).map(TaskLock::Exclusive),
            LockKind::Fair => locks
                .fair_mutex(name)
                .map(|fair| TaskLock::Exclusive(fair.into())),
            LockKind::RwLock => locks.rwlock(name).map(TaskLock::Rw),
        }
        .map_err(|err| err.to_string())?;
        let _: String = locks
            .redis()
            .ping(None)
            .await
            .map_err(|err| format!("PING failed: {err}"))?;
        say("READY")?;
        let mut stdin = BufReader::new(tokio::io::stdin()).lines();
        let line = stdin
            .next_line()
            .await
            .map_err(|err| format!("stdin: {err}"))?
            .unwrap_or_default();
        let start: u64 = line
            .trim()
            .strip_prefix("GO ")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| format!("expected GO <µs>, got {line:?}"))?;
        let end = start + (seconds * 1e6) as u64;
        sleep_until_wall(start).await;
        let counter = counter_key(prefix, name);
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let task = id * tasks + t;
                let (lock, redis) = (lock.clone(), locks.redis().clone());
                let counter = counter.clone();
                tokio::spawn(loop_task(lock, redis, counter, task, end, read_share))
            })
            .collect();
        let mut records = Vec::new();
        for handle in handles {
            records.extend(handle.await.map_err(|err| err.to_string())??);
        }
        let wakeups = locks.stats().wakeups;
        shutdown(&locks).await?;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for record in &records {
            writeln!(out, "{}", record.to_line()).map_err(|err| format!("stdout: {err}"))?;
        }
        writeln!(out, "{}", json!({ "wakeups": wakeups }))
            .and_then(|_| writeln!(out, "DONE"))
            .and_then(|_| out.flush())
            .map_err(|err| format!("stdout: {err}"))
    }

    /// One task: lock, GET (and SET + 1 for a write), unlock, until the common end instant.
    async fn loop_task(
        lock: TaskLock,
        redis: Client,
        counter: String,
        task: u64,
        end: u64,
        read_share: f64,
    ) -> Result<Vec<Record>, String> {
        let mut rng = Rng::new(task + 1);
        let mut records = Vec::new();
        while now_us() < end {
            let read = read_share > 0.0 && rng.next_f64() < read_share;
            let start = now_us();
            let acquired = match (&lock, read) {
                (TaskLock::Exclusive(mutex), _) => mutex.lock().await.map(LockGuard::from),
                (TaskLock::Rw(rw), true) => rw.read().await.map(LockGuard::from),
                (TaskLock::Rw(rw), false) => rw.write().await.map(LockGuard::from),
            };
            let guard = acquired.map_err(|err| format!("task {task}: lock failed: {err}"))?;
            let acquire = now_us();
            let value: Option<i64> = redis
                .get(counter.as_str())
                .await
                .map_err(|err| format!("task {task}: GET failed: {err}"))?;
            if !read {
                let _: () = redis
                    .set(counter.as_str(), value.unwrap_or(0) + 1, None, None, false)
                    .await
                    .map_err(|err| format!("task {task}: SET failed: {err}"))?;
            }
            let release = now_us();
            let unlocked = guard.unlock().await;
            let done = now_us();
            if let Err(err) = &unlocked {
                eprintln!("bench worker: task {task}: unlock failed: {err}");
            }
            records.push(Record {
                task,
                start,
                acquire,
                release,
                done,
                unlock_ok: unlocked.is_ok(),
                read,
            });
        }
        Ok(records)
    }

    async fn run_s3(url: &str, mode: NotificationMode, prefix: &str) -> Result<(), String> {
        let locks = connect_with(url, mode, prefix, 1).await?;
        let _: String = locks
            .redis()
            .ping(None)
            .await
            .map_err(|err| format!("PING failed: {err}"))?;
        say("READY")?;
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
            let mutex = match LockKind::parse(kind)? {
                LockKind::Fair => locks.fair_mutex(name).map(fredlock::Mutex::from),
                _ => locks.mutex(name),
            }
            .map_err(|err| err.to_string())?;
            let redis = locks.redis().clone();
            let counter = counter_key(prefix, name);
            let index = index.to_owned();
            tasks.push(tokio::spawn(async move {
                let start = now_us();
                let guard = mutex.lock().await.map_err(|err| err.to_string())?;
                let acquire = now_us();
                let value: Option<i64> = redis
                    .get(counter.as_str())
                    .await
                    .map_err(|err| format!("GET failed: {err}"))?;
                let _: () = redis
                    .set(counter.as_str(), value.unwrap_or(0) + 1, None, None, false)
                    .await
                    .map_err(|err| format!("SET failed: {err}"))?;
                let release = now_us();
                let unlocked = guard.unlock().await;
                let done = now_us();
                say(&format!(
                    "ACQ {index} {start} {acquire} {release} {done} {}",
                    u8::from(unlocked.is_ok())
                ))
            }));
        }
        for task in tasks {
            task.await.map_err(|err| err.to_string())??;
        }
        shutdown(&locks).await
    }

    /// One S4 waiter: its own handle, one `lock()`, reports when it got the lock, unlocks.
    async fn s4_waiter(
        locks: LockClient,
        index: usize,
        acquired: mpsc::UnboundedSender<Instant>,
    ) -> Result<(), String> {
        let mutex = locks
            .mutex(&format!("s4-{index}"))
            .map_err(|err| err.to_string())?;
        let guard = mutex.lock().await.map_err(|err| err.to_string())?;
        let _ = acquired.send(Instant::now());
        guard.unlock().await.map_err(|err| err.to_string())
    }

    async fn s4(
        url: &str,
        mode: NotificationMode,
        prefix: &str,
        n: usize,
        pings: u64,
        holder_lease: Lease,
    ) -> Result<Json, String> {
        let probe = plain_client(url).await?;
        let baseline = connected_clients(&probe).await?;
        let holder = connect(url, mode, prefix).await?;
        let after_holder = connected_clients(&probe).await?;

        // The holder takes every lock first (normally a fixed lease: no renewal traffic).
        let started = Instant::now();
        let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
        let mut pending = tokio::task::JoinSet::new();
        for i in 0..n {
            let lock = holder
                .mutex(&format!("s4-{i}"))
                .and_then(|m| m.with_lease(holder_lease))
                .map_err(|err| err.to_string())?;
            pending.spawn(async move { lock.lock().await });
            if pending.len() >= 256 || i + 1 == n {
                while let Some(taken) = pending.join_next().await {
                    guards.push(
                        taken
                            .map_err(|err| err.to_string())?
                            .map_err(|err| format!("S4 holder: {err}"))?
                            .into(),
                    );
                }
            }
        }
        let holder_lock_s = started.elapsed().as_secs_f64();

        let waiting = connect(url, mode, prefix).await?;
        let after_waiting = connected_clients(&probe).await?;
        let ping = ping_summary(waiting.redis(), pings).await?;
        let sizer = waiting.mutex("s4-size").map_err(|err| err.to_string())?;
        let lock_future_bytes = size_of(&sizer.lock());
        let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
        let task_future_bytes = size_of(&s4_waiter(waiting.clone(), 0, tx.clone()));
        let mut handles = Vec::with_capacity(n);
        tokio::time::sleep(Duration::from_millis(200)).await;

        let before = command_stats(&probe).await?;
        let rss_before = rss_bytes().unwrap_or(0);
        let heap_before = heap_live();
        let started = Instant::now();
        for i in 0..n {
            handles.push(tokio::spawn(s4_waiter(waiting.clone(), i, tx.clone())));
        }
        drop(tx);
        wait_for_evalsha(&probe, &before, n as u64).await?;
        let first_attempts_s = started.elapsed().as_secs_f64();
        // Let replies and buffers of the burst settle before reading RSS.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_after = rss_bytes().unwrap_or(0);
        let heap_after = heap_live();
        let while_waiting = connected_clients(&probe).await?;
        let stats = waiting.stats();

        let released_at = Instant::now();
        let mut releases = tokio::task::JoinSet::new();
        for guard in guards {
            releases.spawn(guard.unlock());
            if releases.len() >= 256 {
                while let Some(done) = releases.join_next().await {
                    done.map_err(|err| err.to_string())?
                        .map_err(|err| format!("S4 holder unlock: {err}"))?;
                }
            }
        }
        while let Some(done) = releases.join_next().await {
            done.map_err(|err| err.to_string())?
                .map_err(|err| format!("S4 holder unlock: {err}"))?;
        }
        let release_s = released_at.elapsed().as_secs_f64();
        let mut last = released_at;
        for _ in 0..n {
            match tokio::time::timeout(Duration::from_secs(120), rx.recv()).await {
                Ok(Some(at)) => last = last.max(at),
                _ => return Err("S4: not every waiter acquired after the release".into()),
            }
        }
        for handle in handles {
            handle.await.map_err(|err| err.to_string())??;
        }
        shutdown(&holder).await?;
        shutdown(&waiting).await?;
        let _ = probe.quit().await;
        let rss_delta = rss_after.saturating_sub(rss_before);
        Ok(json!({
            "waiters": n,
            "holder_lease": format!("{holder_lease:?}"),
            "ping": ping.json(),
            "connections": {
                "baseline": baseline,
                "after_holder": after_holder,
                "after_waiting_client": after_waiting,
                "while_waiting": while_waiting,
                "holder_client": after_holder.saturating_sub(baseline),
                "waiting_client": while_waiting.saturating_sub(after_holder),
            },
            "client_stats_while_waiting": {
                "waiting": stats.waiting,
                "waiting_locks": stats.waiting_locks,
                "held": stats.held,
                "queued_in_redis": stats.queued_in_redis,
            },
            "rss_before_bytes": rss_before,
            "rss_after_bytes": rss_after,
            "rss_per_waiter_bytes": round(rss_delta as f64 / n as f64, 1),
            "heap_before_bytes": heap_before,
            "heap_after_bytes": heap_after,
            "heap_per_waiter_bytes": round((heap_after - heap_before) as f64 / n as f64, 1),
            "lock_future_bytes": lock_future_bytes,
            "task_future_bytes": task_future_bytes,
            "holder_lock_s": round(holder_lock_s, 3),
            "first_attempts_s": round(first_attempts_s, 3),
            "release_s": round(release_s, 3),
            "all_acquired_after_release_s": round((last - released_at).as_secs_f64(), 3),
        }))
    }
}
