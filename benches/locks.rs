//! Lock benchmarks against a real `redis-server` (SPEC §6), for both notification modes.
//!
//! ```text
//! cargo bench --bench locks -- [--quick] [--json PATH] [--mode stream|pubsub|both]
//!     [--cycles N] [--warmup N] [--pings N] [--seconds S] [--processes N] [--tasks N]
//! ```
//!
//! Without `REDIS_URL` the bench starts its own `redis-server` on a free loopback port (never
//! 6379) in a temporary directory, without persistence, and kills it by pid at the end.
//!
//! Every scenario is reported beside the fred `PING` round trip measured on the same kind of
//! client (the lock client's command connection) right before it, and as ratios to its p50,
//! so figures stay comparable on a noisy machine.
//!
//! * **PING**: `--pings` (2000) sequential `PING`s after 200 warm-up ones.
//! * **S1, uncontended**: one task, one lock name; `--cycles` (5000; 1000 with `--quick`)
//!   cycles of `lock()` + `unlock().await` after `--warmup` (500). Reports the cycle's
//!   p50/p99 (and its two halves); target: cycle p50 ≤ 2.1 × PING p50 (two script round
//!   trips).
//! * **S2, contended**: `--processes` (4) OS processes × `--tasks` (4) tasks loop on ONE lock
//!   for `--seconds` (5; 2 with `--quick`), doing a non-atomic `GET` then `SET n+1` of a counter
//!   inside the critical section. The bench re-executes itself as the worker processes; they
//!   connect, say `READY`, and all start at the wall-clock instant the parent sends with `GO`.
//!   Each acquisition records, in wall-clock µs (one machine, one clock): when `lock()` was
//!   called, when it returned (acquire), when `unlock()` was called (release: the end of the
//!   critical section) and when it returned. Merged and sorted by acquire time they give:
//!   acquisitions/s (target: × PING p50 ≥ 0.30); the handoff gap, next acquire − previous
//!   release, separately for handoffs to a *different* task (targets: p50 ≤ 2.5 × PING,
//!   p99 ≤ 10 × PING) and back to the *same* task, and the share of the latter; the wait of
//!   every acquisition (longest one reported); and mutual-exclusion violations: intervals
//!   [acquire, release] that overlap, and a final counter different from the number of
//!   acquisitions. Both must be 0.
//!
//! Output: a markdown table on stdout, JSON at `--json` (default `target/bench-locks.json`),
//! progress on stderr.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child as StdChild, Command as StdCommand, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::InfoKind;
use fredlock::{Config, LockClient, NotificationMode};
use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// First argument of a re-executed S2 worker process.
const WORKER_FLAG: &str = "--s2-worker";
/// Environment variable carrying the Redis URL to the workers (kept out of `ps` output).
const WORKER_URL_ENV: &str = "FREDLOCK_BENCH_URL";
/// Overrides the `redis-server` binary (same variable as the integration tests).
const REDIS_SERVER_ENV: &str = "FREDLOCK_REDIS_SERVER";
/// The lock every S1 cycle takes.
const S1_LOCK: &str = "bench-s1";
/// The lock all S2 tasks contend on.
const S2_LOCK: &str = "bench-s2";
/// Warm-up PINGs before the measured ones.
const PING_WARMUP: u64 = 200;
/// How long the parent waits for every worker to connect.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Margin between `GO` and the common start instant, so every worker sleeps until it.
const START_DELAY_US: u64 = 250_000;
/// Extra time allowed after the S2 window for the workers to finish and report.
const FINISH_GRACE: Duration = Duration::from_secs(60);

const USAGE: &str = "usage: cargo bench --bench locks -- [--quick] [--json PATH] \
[--mode stream|pubsub|both] [--cycles N] [--warmup N] [--pings N] [--seconds S] \
[--processes N] [--tasks N]";

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some(WORKER_FLAG) {
        std::process::exit(worker::main(&raw[1..]));
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

/// Starts (or finds) Redis, runs every mode and prints the report. Returns the exit code.
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
        tokio::select! {
            outcome = bench(&args, &url, redis_pid) => outcome,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
        }
    });
    drop(runtime);
    drop(server);
    match outcome {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("locks bench: {message}");
            1
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// Command-line settings of the parent process.
#[derive(Debug, Clone)]
struct Args {
    quick: bool,
    json: PathBuf,
    modes: Vec<NotificationMode>,
    cycles: u64,
    warmup: u64,
    pings: u64,
    seconds: f64,
    processes: usize,
    tasks: usize,
}

impl Args {
    fn parse(raw: &[String]) -> Result<Args, String> {
        let mut quick = false;
        let mut json = PathBuf::from("target/bench-locks.json");
        let mut modes = vec![NotificationMode::Stream, NotificationMode::PubSub];
        let (mut cycles, mut seconds) = (None, None);
        let (mut warmup, mut pings, mut processes, mut tasks) = (500, 2000, 4, 4);
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
                "--mode" => modes = parse_modes(&value()?)?,
                "--cycles" => cycles = Some(parse_num(flag, &value()?)?),
                "--warmup" => warmup = parse_num(flag, &value()?)?,
                "--pings" => pings = parse_num(flag, &value()?)?,
                "--seconds" => seconds = Some(parse_num::<f64>(flag, &value()?)?),
                "--processes" => processes = parse_num(flag, &value()?)?,
                "--tasks" => tasks = parse_num(flag, &value()?)?,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        let args = Args {
            quick,
            json,
            modes,
            cycles: cycles.unwrap_or(if quick { 1000 } else { 5000 }),
            warmup,
            pings,
            seconds: seconds.unwrap_or(if quick { 2.0 } else { 5.0 }),
            processes,
            tasks,
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
    match mode {
        NotificationMode::Stream => "stream",
        NotificationMode::PubSub => "pubsub",
    }
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

/// Wall-clock microseconds since the epoch: the common clock of all S2 processes.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("system clock before 1970")
        .as_micros() as u64
}

/// CPU time (user + system, µs) of the S2 workers and of the redis-server, from `/proc`.
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

fn config(url: &str, mode: NotificationMode, prefix: &str) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config
}

async fn connect(url: &str, mode: NotificationMode, prefix: &str) -> Result<LockClient, String> {
    LockClient::connect(config(url, mode, prefix))
        .await
        .map_err(|err| format!("cannot connect the lock client to {}: {err}", redact(url)))
}

/// The S2 counter key, under the run's prefix so that the cleanup finds it.
fn counter_key(prefix: &str) -> String {
    format!("{{{prefix}:bench}}:counter")
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
            p99: hist.value_at_quantile(0.99) as f64 * unit_us,
            max: hist.max() as f64 * unit_us,
            mean: hist.mean() * unit_us,
        }
    }

    fn json(&self) -> Json {
        json!({
            "count": self.count,
            "p50_us": round2(self.p50),
            "p99_us": round2(self.p99),
            "max_us": round2(self.max),
            "mean_us": round2(self.mean),
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

/// Commands whose Redis-side statistics the report shows.
const TRACKED_COMMANDS: [&str; 7] = ["evalsha", "eval", "get", "set", "xread", "ping", "publish"];

/// `INFO commandstats` for the tracked commands: name → (calls, server µs).
#[derive(Debug, Clone, Default)]
struct CommandStats {
    commands: std::collections::BTreeMap<String, (u64, u64)>,
}

impl CommandStats {
    fn parse(info: &str) -> CommandStats {
        let mut commands = std::collections::BTreeMap::new();
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

// ---------------------------------------------------------------------------------------------
// Parent: the scenarios
// ---------------------------------------------------------------------------------------------

/// Runs every selected mode, prints the markdown report and writes the JSON.
async fn bench(args: &Args, url: &str, redis_pid: Option<u32>) -> Result<(), String> {
    let run_id = format!("{}-{}", std::process::id(), now_us() / 1_000_000);
    let mut results = Vec::new();
    let mut version = String::from("unknown");
    for &mode in &args.modes {
        let ctx = ModeCtx {
            args,
            url,
            mode,
            prefix: format!("fredlock-bench-{}-{run_id}", mode_name(mode)),
            redis_pid,
        };
        let result = bench_mode(&ctx).await?;
        version = result.redis_version.clone();
        results.push(result);
    }
    let report = markdown(args, &results, &version);
    println!("{report}");
    write_json(args, &results, &version)?;
    Ok(())
}

/// What every scenario of one notification mode needs.
struct ModeCtx<'a> {
    args: &'a Args,
    url: &'a str,
    mode: NotificationMode,
    /// Key prefix of this mode's clients (unique per run and mode).
    prefix: String,
    /// The bench's own redis-server, for CPU accounting.
    redis_pid: Option<u32>,
}

/// Everything measured for one notification mode.
struct ModeResult {
    mode: NotificationMode,
    redis_version: String,
    s1: S1Result,
    s2: S2Result,
}

async fn bench_mode(ctx: &ModeCtx<'_>) -> Result<ModeResult, String> {
    let (url, mode, prefix) = (ctx.url, ctx.mode, ctx.prefix.as_str());
    progress(&format!(
        "mode {}: prefix {prefix}; load average {}",
        mode_name(mode),
        load_average()
    ));
    let locks = connect(url, mode, prefix).await?;
    let redis_version = redis_version(locks.redis()).await;
    let s1 = run_s1(ctx.args, &locks).await?;
    let s2 = run_s2(ctx, &locks).await?;
    locks
        .shutdown()
        .await
        .map_err(|err| format!("shutdown failed: {err}"))?;
    let cleaner = Client::new(
        fred::types::config::Config::from_url(url)
            .map_err(|err| format!("bad REDIS_URL {}: {err}", redact(url)))?,
        None,
        None,
        None,
    );
    cleaner
        .init()
        .await
        .map_err(|err| format!("cleanup connection failed: {err}"))?;
    let deleted = delete_prefix(&cleaner, prefix).await?;
    let _ = cleaner.quit().await;
    progress(&format!("mode {}: deleted {deleted} keys", mode_name(mode)));
    Ok(ModeResult {
        mode,
        redis_version,
        s1,
        s2,
    })
}

// --- S1 --------------------------------------------------------------------------------------

/// S1: uncontended lock + unlock cycles on one name from one task.
struct S1Result {
    ping: Summary,
    cycle: Summary,
    lock: Summary,
    unlock: Summary,
    /// Redis command statistics of the measured cycles (and the interleaved PINGs).
    commands: CommandStats,
    cycles: u64,
}

async fn run_s1(args: &Args, locks: &LockClient) -> Result<S1Result, String> {
    let mutex = locks.mutex(S1_LOCK).map_err(|err| err.to_string())?;
    for _ in 0..args.warmup {
        s1_cycle(&mutex).await?;
    }
    ping_warmup(locks.redis()).await?;
    progress(&format!(
        "S1: {} cycles interleaved with {} PINGs",
        args.cycles, args.pings
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
    let result = S1Result {
        ping: Summary::of(&ping, 1e-3),
        cycle: Summary::of(&cycle, 1e-3),
        lock: Summary::of(&lock, 1e-3),
        unlock: Summary::of(&unlock, 1e-3),
        commands,
        cycles: args.cycles,
    };
    progress(&format!(
        "S1: PING p50 {:.1} µs, cycle p50 {:.1} µs = {:.2} × PING",
        result.ping.p50,
        result.cycle.p50,
        ratio(result.cycle.p50, result.ping.p50)
    ));
    Ok(result)
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

// --- S2 --------------------------------------------------------------------------------------

/// One acquisition of the S2 lock, in wall-clock µs.
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
}

impl Record {
    fn to_line(self) -> String {
        json!([
            self.task,
            self.start,
            self.acquire,
            self.release,
            self.done,
            u8::from(self.unlock_ok)
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
        })
    }
}

/// What one worker process reported.
#[derive(Default)]
struct WorkerReport {
    records: Vec<Record>,
    wakeups: u64,
}

/// The PING round trips measured right before and right after S2; the reference is their union.
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

/// S2: contended handoff between processes and tasks on one lock.
struct S2Result {
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
    /// Time from the end of the window until the last task released (tasks that were waiting
    /// when the window closed still take the lock once).
    drain_s: f64,
    handoff_other: Summary,
    handoff_same: Summary,
    same_share: f64,
    /// Every acquisition's wait (from calling `lock()` until it returned), drain included.
    wait: Summary,
    /// The longest wait among the acquisitions made inside the window.
    longest_wait_in_window_us: u64,
    per_task_min: u64,
    per_task_max: u64,
    overlaps: u64,
    counter: i64,
    unlock_errors: u64,
    wakeups: u64,
    /// CPU used by the workers and the redis-server during the window.
    cpu: CpuSample,
    /// Length of the window.
    window_s: f64,
    /// Redis command statistics during the window.
    commands: CommandStats,
}

impl S2Result {
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

    fn counter_mismatch(&self) -> bool {
        self.counter != self.acquisitions as i64
    }
}

/// A running worker process with its pipes.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

async fn run_s2(ctx: &ModeCtx<'_>, locks: &LockClient) -> Result<S2Result, String> {
    let args = ctx.args;
    let counter = counter_key(&ctx.prefix);
    let _: i64 = locks
        .redis()
        .del(counter.as_str())
        .await
        .map_err(|err| format!("DEL counter: {err}"))?;
    let mut ping_before = histogram();
    measure_ping(locks.redis(), args.pings, &mut ping_before).await?;
    progress(&format!(
        "S2: PING p50 {:.1} µs; {} processes × {} tasks for {} s",
        Summary::of(&ping_before, 1e-3).p50,
        args.processes,
        args.tasks,
        args.seconds
    ));
    let mut workers = Vec::new();
    for id in 0..args.processes {
        workers.push(spawn_worker(ctx, id)?);
    }
    for (id, worker) in workers.iter_mut().enumerate() {
        wait_ready(worker, id).await?;
    }
    let pids: Vec<u32> = workers.iter().filter_map(|w| w.child.id()).collect();
    let stats_before = command_stats(locks.redis()).await?;
    let go = now_us() + START_DELAY_US;
    let window = Window {
        go,
        end: go + (args.seconds * 1e6) as u64,
    };
    for worker in &mut workers {
        let line = format!("GO {go}\n");
        worker
            .stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|err| format!("cannot send GO to a worker: {err}"))?;
        worker.stdin.flush().await.map_err(|err| err.to_string())?;
    }
    progress("S2: workers started");
    let collecting = tokio::spawn(collect_all(workers));
    let cpu = cpu_during(&window, &pids, ctx.redis_pid).await;
    let stats = command_stats(locks.redis()).await?.since(&stats_before);
    let limit = Duration::from_secs_f64(args.seconds) + FINISH_GRACE;
    let reports = tokio::time::timeout(limit, collecting)
        .await
        .map_err(|_| format!("S2 workers did not finish within {limit:?}"))?
        .map_err(|err| err.to_string())??;
    let value: Option<i64> = locks
        .redis()
        .get(counter.as_str())
        .await
        .map_err(|err| format!("GET counter: {err}"))?;
    let mut ping_after = histogram();
    measure_ping(locks.redis(), args.pings, &mut ping_after).await?;
    let pings = PingBracket::new(&ping_before, &ping_after);
    let mut result = analyze(pings, window, reports, value.unwrap_or(0), cpu);
    result.commands = stats;
    progress(&format!(
        "S2: {} acquisitions, {:.0}/s = {:.3} per PING; handoff to another task p50 {:.1} µs = \
         {:.2} × PING",
        result.acquisitions,
        result.acq_per_s,
        result.throughput_ratio(),
        result.handoff_other.p50,
        ratio(result.handoff_other.p50, result.ping.p50)
    ));
    Ok(result)
}

fn spawn_worker(ctx: &ModeCtx<'_>, id: usize) -> Result<Worker, String> {
    let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
    let mut child = Command::new(exe)
        .arg(WORKER_FLAG)
        .arg(mode_name(ctx.mode))
        .arg(&ctx.prefix)
        .arg(ctx.args.seconds.to_string())
        .arg(id.to_string())
        .arg(ctx.args.tasks.to_string())
        .env(WORKER_URL_ENV, ctx.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| format!("cannot start S2 worker {id}: {err}"))?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    Ok(Worker {
        child,
        stdin,
        stdout,
    })
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

async fn wait_ready(worker: &mut Worker, id: usize) -> Result<(), String> {
    let line = tokio::time::timeout(READY_TIMEOUT, worker.stdout.next_line())
        .await
        .map_err(|_| format!("S2 worker {id} not ready within {READY_TIMEOUT:?}"))?
        .map_err(|err| format!("S2 worker {id}: {err}"))?;
    match line.as_deref() {
        Some("READY") => Ok(()),
        other => Err(format!("S2 worker {id} said {other:?} instead of READY")),
    }
}

async fn collect_all(workers: Vec<Worker>) -> Result<Vec<WorkerReport>, String> {
    let tasks: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(id, worker)| tokio::spawn(collect(id, worker)))
        .collect();
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.map_err(|err| err.to_string())??);
    }
    Ok(reports)
}

/// Reads a worker's records until `DONE`, then waits for it to exit successfully.
async fn collect(id: usize, mut worker: Worker) -> Result<WorkerReport, String> {
    let mut report = WorkerReport::default();
    let mut done = false;
    while let Some(line) = worker
        .stdout
        .next_line()
        .await
        .map_err(|err| format!("S2 worker {id}: {err}"))?
    {
        if line == "DONE" {
            done = true;
            break;
        }
        let value: Json = serde_json::from_str(&line)
            .map_err(|err| format!("S2 worker {id}: bad line {line:?}: {err}"))?;
        if let Some(wakeups) = value.get("wakeups").and_then(Json::as_u64) {
            report.wakeups = wakeups;
        } else {
            let record = Record::from_json(&value)
                .ok_or_else(|| format!("S2 worker {id}: bad record {line:?}"))?;
            report.records.push(record);
        }
    }
    drop(worker.stdin);
    let status = worker
        .child
        .wait()
        .await
        .map_err(|err| format!("S2 worker {id}: {err}"))?;
    if !done || !status.success() {
        return Err(format!(
            "S2 worker {id} failed ({status}, DONE seen: {done})"
        ));
    }
    Ok(report)
}

/// The S2 measurement window in wall-clock µs: tasks start `lock()` calls in [go, end).
#[derive(Debug, Clone, Copy)]
struct Window {
    go: u64,
    end: u64,
}

/// Merges the workers' records and computes every S2 figure. Throughput counts the
/// acquisitions made inside the window; everything else uses every acquisition, including
/// those of tasks that were still waiting when the window closed (the drain).
fn analyze(
    pings: PingBracket,
    window: Window,
    reports: Vec<WorkerReport>,
    counter: i64,
    cpu: CpuSample,
) -> S2Result {
    let wakeups = reports.iter().map(|r| r.wakeups).sum();
    let mut records: Vec<Record> = reports.into_iter().flat_map(|r| r.records).collect();
    records.sort_by_key(|r| (r.acquire, r.release));
    let acquisitions = records.len() as u64;
    let in_window = records.iter().filter(|r| r.acquire < window.end).count() as u64;
    let window_s = window.end.saturating_sub(window.go) as f64 / 1e6;
    let last_done = records.iter().map(|r| r.done).max().unwrap_or(window.end);
    let (handoff_other, handoff_same, same) = handoffs(&records);
    let (per_task_min, per_task_max) = per_task_range(&records);
    let mut wait = histogram();
    let mut longest_in_window = 0;
    for record in &records {
        let waited = record.acquire.saturating_sub(record.start);
        wait.saturating_record(waited.max(1));
        if record.acquire < window.end {
            longest_in_window = longest_in_window.max(waited);
        }
    }
    S2Result {
        ping: pings.both,
        ping_before: pings.before,
        ping_after: pings.after,
        acquisitions,
        in_window,
        acq_per_s: in_window as f64 / window_s,
        drain_s: last_done.saturating_sub(window.end) as f64 / 1e6,
        handoff_other: Summary::of(&handoff_other, 1.0),
        handoff_same: Summary::of(&handoff_same, 1.0),
        same_share: if acquisitions > 1 {
            same as f64 / (acquisitions - 1) as f64
        } else {
            0.0
        },
        wait: Summary::of(&wait, 1.0),
        longest_wait_in_window_us: longest_in_window,
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

/// Acquisitions whose interval starts before an earlier one ended (sorted by acquire time).
fn overlaps(records: &[Record]) -> u64 {
    let mut latest_release = 0;
    let mut count = 0;
    for record in records {
        if record.acquire < latest_release {
            count += 1;
        }
        latest_release = latest_release.max(record.release);
    }
    count
}

/// Fewest and most acquisitions of any task.
fn per_task_range(records: &[Record]) -> (u64, u64) {
    let mut counts = std::collections::BTreeMap::new();
    for record in records {
        *counts.entry(record.task).or_insert(0u64) += 1;
    }
    let min = counts.values().copied().min().unwrap_or(0);
    let max = counts.values().copied().max().unwrap_or(0);
    (min, max)
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

/// The targets of SPEC §6 and the benchmark brief for one mode: (label, value, met).
fn targets(result: &ModeResult) -> Vec<(&'static str, String, bool)> {
    let s1 = &result.s1;
    let s2 = &result.s2;
    let s1_ratio = ratio(s1.cycle.p50, s1.ping.p50);
    let p50 = ratio(s2.handoff_other.p50, s2.ping.p50);
    let p99 = ratio(s2.handoff_other.p99, s2.ping.p50);
    vec![
        (
            "S1 cycle p50 ≤ 2.1 × PING",
            format!("{s1_ratio:.2}"),
            s1_ratio <= 2.1,
        ),
        (
            "S2 acq/s × PING p50 ≥ 0.30",
            format!("{:.3}", s2.throughput_ratio()),
            s2.throughput_ratio() >= 0.30,
        ),
        (
            "S2 handoff to another task p50 ≤ 2.5 × PING",
            format!("{p50:.2}"),
            p50 <= 2.5,
        ),
        (
            "S2 handoff to another task p99 ≤ 10 × PING",
            format!("{p99:.2}"),
            p99 <= 10.0,
        ),
        (
            "S2 overlapping holds = 0",
            s2.overlaps.to_string(),
            s2.overlaps == 0,
        ),
        (
            "S2 counter = acquisitions",
            format!("{} / {}", s2.counter, s2.acquisitions),
            !s2.counter_mismatch(),
        ),
    ]
}

fn markdown(args: &Args, results: &[ModeResult], version: &str) -> String {
    let mut out = String::new();
    out += &format!(
        "### fredlock benchmarks (Redis {version}{})\n\n",
        if args.quick { ", --quick" } else { "" }
    );
    out += &s1_table(args, results);
    out += &s2_table(args, results);
    out += &targets_table(results);
    out
}

fn s1_table(args: &Args, results: &[ModeResult]) -> String {
    let mut out = format!(
        "#### S1 uncontended: {} × lock + unlock, one task, after {} warm-up (µs)\n\n",
        args.cycles, args.warmup
    );
    out += "| mode | PING p50 | cycle p50 | cycle p99 | p50 / PING | p99 / PING | lock p50 \
            | unlock p50 | EVALSHA per cycle (server µs per call) | PING server µs per call \
            |\n|---|---|---|---|---|---|---|---|---|---|\n";
    for r in results {
        let (s1, ping) = (&r.s1, r.s1.ping.p50);
        let (evalsha, evalsha_us) = s1.commands.per_op("evalsha", s1.cycles);
        let (_, ping_us) = s1.commands.per_op("ping", 1);
        out += &format!(
            "| {} | {:.1} | {:.1} | {:.1} | **{:.2}** | {:.2} | {:.1} | {:.1} | {:.2} ({:.1}) \
             | {:.1} |\n",
            mode_name(r.mode),
            ping,
            s1.cycle.p50,
            s1.cycle.p99,
            ratio(s1.cycle.p50, ping),
            ratio(s1.cycle.p99, ping),
            s1.lock.p50,
            s1.unlock.p50,
            evalsha,
            evalsha_us,
            ping_us
        );
    }
    out + "\n"
}

fn s2_table(args: &Args, results: &[ModeResult]) -> String {
    let mut out = format!(
        "#### S2 contended: {} processes × {} tasks on one lock for {} s, GET + SET inside \
         (µs; × = ratio to PING p50)\n\n",
        args.processes, args.tasks, args.seconds
    );
    out += "| mode | PING p50 (before / after) | acquisitions in window (all) | acq/s | acq/s × \
            PING | handoff to another task p50 | p99 | max | handoff to same task p50 | same-task \
            share | wakeups / acq |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in results {
        let s2 = &r.s2;
        let x = |v: f64| times_ping(v, s2.ping.p50);
        out += &format!(
            "| {} | {:.1} ({:.1} / {:.1}) | {} ({}) | {:.0} | **{:.3}** | {} | {} | {} | {} | \
             {:.1} % | {:.2} |\n",
            mode_name(r.mode),
            s2.ping.p50,
            s2.ping_before.p50,
            s2.ping_after.p50,
            s2.in_window,
            s2.acquisitions,
            s2.acq_per_s,
            s2.throughput_ratio(),
            x(s2.handoff_other.p50),
            x(s2.handoff_other.p99),
            x(s2.handoff_other.max),
            x(s2.handoff_same.p50),
            s2.same_share * 100.0,
            s2.wakeups_per_acquisition()
        );
    }
    out += "\n| mode | wait p50 | wait p99 | longest wait: in window / overall | acquisitions \
            per task min–max \
            | drain after window | CPU µs per acquisition (workers / redis) | machine busy \
            | EVALSHA per acquisition (server µs per call) | overlapping holds \
            | counter / acquisitions | unlock errors |\n\
            |---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in results {
        let s2 = &r.s2;
        let (workers_cpu, redis_cpu) = s2.cpu_per_acquisition();
        let redis_cpu = redis_cpu.map_or("n/a".to_owned(), |us| format!("{us:.0}"));
        let (evalsha, evalsha_us) = s2.commands.per_op("evalsha", s2.in_window);
        out += &format!(
            "| {} | {} | {} | {:.1} ms / {:.1} ms | {}–{} | {:.3} s | {:.0} / {} | {:.0} % | {:.2} ({:.1}) \
             | {} | {} / {} | {} |\n",
            mode_name(r.mode),
            times_ping(s2.wait.p50, s2.ping.p50),
            times_ping(s2.wait.p99, s2.ping.p50),
            s2.longest_wait_in_window_us as f64 / 1000.0,
            s2.wait.max / 1000.0,
            s2.per_task_min,
            s2.per_task_max,
            s2.drain_s,
            workers_cpu,
            redis_cpu,
            s2.machine_busy() * 100.0,
            evalsha,
            evalsha_us,
            s2.overlaps,
            s2.counter,
            s2.acquisitions,
            s2.unlock_errors
        );
    }
    out + "\n"
}

/// `value` µs with its ratio to the PING p50.
fn times_ping(value: f64, ping_p50: f64) -> String {
    format!("{value:.0} ({:.2}×)", ratio(value, ping_p50))
}

fn targets_table(results: &[ModeResult]) -> String {
    let mut out = String::from("#### Targets\n\n| target |");
    for r in results {
        out += &format!(" {} |", mode_name(r.mode));
    }
    out += "\n|---|";
    out += &"---|".repeat(results.len());
    out += "\n";
    let per_mode: Vec<_> = results.iter().map(targets).collect();
    let Some(first) = per_mode.first() else {
        return out;
    };
    for (i, (label, _, _)) in first.iter().enumerate() {
        out += &format!("| {label} |");
        for mode in &per_mode {
            let (_, value, met) = &mode[i];
            out += &format!(" {value} {} |", if *met { "met" } else { "**MISSED**" });
        }
        out += "\n";
    }
    out
}

fn write_json(args: &Args, results: &[ModeResult], version: &str) -> Result<(), String> {
    let modes: Vec<Json> = results.iter().map(mode_json).collect();
    let doc = json!({
        "redis_version": version,
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "quick": args.quick,
        "settings": {
            "cycles": args.cycles,
            "warmup": args.warmup,
            "pings": args.pings,
            "seconds": args.seconds,
            "processes": args.processes,
            "tasks": args.tasks,
        },
        "modes": modes,
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

fn mode_json(r: &ModeResult) -> Json {
    let (s1, s2) = (&r.s1, &r.s2);
    let targets: Vec<Json> = targets(r)
        .into_iter()
        .map(|(label, value, met)| json!({ "target": label, "value": value, "met": met }))
        .collect();
    json!({
        "mode": mode_name(r.mode),
        "s1": {
            "ping": s1.ping.json(),
            "cycle": s1.cycle.json(),
            "lock": s1.lock.json(),
            "unlock": s1.unlock.json(),
            "cycle_p50_per_ping": round(ratio(s1.cycle.p50, s1.ping.p50), 3),
            "cycle_p99_per_ping": round(ratio(s1.cycle.p99, s1.ping.p50), 3),
            "redis_commands_per_cycle": s1.commands.json(s1.cycles),
        },
        "s2": {
            "ping": s2.ping.json(),
            "ping_before": s2.ping_before.json(),
            "ping_after": s2.ping_after.json(),
            "acquisitions": s2.acquisitions,
            "acquisitions_in_window": s2.in_window,
            "acq_per_s": round2(s2.acq_per_s),
            "drain_s": round(s2.drain_s, 3),
            "cpu_us_per_acquisition_workers": round2(s2.cpu_per_acquisition().0),
            "cpu_us_per_acquisition_redis": s2.cpu_per_acquisition().1.map(round2),
            "machine_busy": round(s2.machine_busy(), 3),
            "redis_commands_per_acquisition": s2.commands.json(s2.in_window),
            "acq_per_s_times_ping_p50": round(s2.throughput_ratio(), 4),
            "handoff_other": s2.handoff_other.json(),
            "handoff_other_p50_per_ping": round2(ratio(s2.handoff_other.p50, s2.ping.p50)),
            "handoff_other_p99_per_ping": round2(ratio(s2.handoff_other.p99, s2.ping.p50)),
            "handoff_same": s2.handoff_same.json(),
            "same_task_share": round(s2.same_share, 4),
            "wait": s2.wait.json(),
            "longest_wait_us": s2.wait.max,
            "longest_wait_in_window_us": s2.longest_wait_in_window_us,
            "per_task_min": s2.per_task_min,
            "per_task_max": s2.per_task_max,
            "overlaps": s2.overlaps,
            "counter": s2.counter,
            "counter_mismatch": s2.counter_mismatch(),
            "unlock_errors": s2.unlock_errors,
            "wakeups": s2.wakeups,
            "wakeups_per_acquisition": round(s2.wakeups_per_acquisition(), 3),
        },
        "targets": targets,
    })
}

// ---------------------------------------------------------------------------------------------
// S2 worker process
// ---------------------------------------------------------------------------------------------

/// The S2 worker: `--s2-worker <mode> <prefix> <seconds> <id> <tasks>`, URL in
/// `FREDLOCK_BENCH_URL`. Prints `READY`, waits for `GO <start µs>` on stdin, runs its tasks
/// until start + seconds, then prints one JSON array per acquisition, a `{"wakeups": n}`
/// object and `DONE`.
mod worker {
    use super::*;

    /// Settings passed by the parent.
    struct WorkerArgs {
        mode: NotificationMode,
        url: String,
        prefix: String,
        seconds: f64,
        id: u64,
        tasks: u64,
    }

    pub(super) fn main(raw: &[String]) -> i32 {
        let args = match parse(raw) {
            Ok(args) => args,
            Err(message) => {
                eprintln!("S2 worker: {message}");
                return 2;
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("build the tokio runtime");
        match runtime.block_on(run(args)) {
            Ok(()) => 0,
            Err(message) => {
                eprintln!("S2 worker: {message}");
                1
            }
        }
    }

    fn parse(raw: &[String]) -> Result<WorkerArgs, String> {
        let [mode, prefix, seconds, id, tasks] = raw else {
            return Err(format!("expected 5 arguments, got {raw:?}"));
        };
        Ok(WorkerArgs {
            mode: parse_mode(mode)?,
            url: std::env::var(WORKER_URL_ENV).map_err(|_| format!("{WORKER_URL_ENV} unset"))?,
            prefix: prefix.clone(),
            seconds: parse_num("seconds", seconds)?,
            id: parse_num("id", id)?,
            tasks: parse_num("tasks", tasks)?,
        })
    }

    async fn run(args: WorkerArgs) -> Result<(), String> {
        let locks = connect(&args.url, args.mode, &args.prefix).await?;
        let mutex = locks.mutex(S2_LOCK).map_err(|err| err.to_string())?;
        let _: String = locks
            .redis()
            .ping(None)
            .await
            .map_err(|err| format!("PING failed: {err}"))?;
        say("READY")?;
        let start = read_go().await?;
        let end = start + (args.seconds * 1e6) as u64;
        sleep_until_wall(start).await;
        let counter = counter_key(&args.prefix);
        let handles: Vec<_> = (0..args.tasks)
            .map(|t| {
                let task = args.id * args.tasks + t;
                let (mutex, redis) = (mutex.clone(), locks.redis().clone());
                tokio::spawn(task_loop(mutex, redis, counter.clone(), task, end))
            })
            .collect();
        let mut records = Vec::new();
        for handle in handles {
            records.extend(handle.await.map_err(|err| err.to_string())??);
        }
        report(&records, locks.stats().wakeups)?;
        locks
            .shutdown()
            .await
            .map_err(|err| format!("shutdown failed: {err}"))
    }

    /// One task: lock, GET, SET + 1, unlock, until the common end instant.
    async fn task_loop(
        mutex: fredlock::Mutex,
        redis: Client,
        counter: String,
        task: u64,
        end: u64,
    ) -> Result<Vec<Record>, String> {
        let mut records = Vec::new();
        while now_us() < end {
            let start = now_us();
            let guard = mutex
                .lock()
                .await
                .map_err(|err| format!("task {task}: lock failed: {err}"))?;
            let acquire = now_us();
            let value: Option<i64> = redis
                .get(counter.as_str())
                .await
                .map_err(|err| format!("task {task}: GET failed: {err}"))?;
            let _: () = redis
                .set(counter.as_str(), value.unwrap_or(0) + 1, None, None, false)
                .await
                .map_err(|err| format!("task {task}: SET failed: {err}"))?;
            let release = now_us();
            let unlocked = guard.unlock().await;
            let done = now_us();
            if let Err(err) = &unlocked {
                eprintln!("S2 worker: task {task}: unlock failed: {err}");
            }
            records.push(Record {
                task,
                start,
                acquire,
                release,
                done,
                unlock_ok: unlocked.is_ok(),
            });
        }
        Ok(records)
    }

    fn say(line: &str) -> Result<(), String> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{line}")
            .and_then(|_| stdout.flush())
            .map_err(|err| format!("stdout: {err}"))
    }

    async fn read_go() -> Result<u64, String> {
        let mut line = String::new();
        BufReader::new(tokio::io::stdin())
            .read_line(&mut line)
            .await
            .map_err(|err| format!("stdin: {err}"))?;
        line.trim()
            .strip_prefix("GO ")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| format!("expected GO <µs>, got {line:?}"))
    }

    fn report(records: &[Record], wakeups: u64) -> Result<(), String> {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for record in records {
            writeln!(out, "{}", record.to_line()).map_err(|err| format!("stdout: {err}"))?;
        }
        writeln!(out, "{}", json!({ "wakeups": wakeups }))
            .and_then(|_| writeln!(out, "DONE"))
            .and_then(|_| out.flush())
            .map_err(|err| format!("stdout: {err}"))
    }
}
