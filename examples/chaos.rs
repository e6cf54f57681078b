//! Fault injection against fredlock, checked by a resource that verifies fencing tokens.
//!
//! ```text
//! cargo run --release --example chaos -- [--scenario NAME|all] [--seconds N]
//!     [--modes stream,pubsub] [--workers 4] [--tasks 4] [--markdown docs/reliability.md]
//! ```
//!
//! For every scenario and notification mode the parent starts a fresh lock `redis-server`
//! (AOF, `appendfsync always`) in a temporary directory, and `--workers` worker processes
//! (this binary re-executed with the hidden `--worker` argument). Each worker runs `--tasks`
//! tasks per lock type (`Mutex`, fair `Mutex`, `RwLock` writes) that loop: acquire, critical
//! section on the resource, release. The resource is a hash on a *separate* `redis-server`
//! (so faults of the lock server never touch it) updated by two Lua scripts:
//!
//! * `enter(token)`: refuses a token lower than the highest seen (a stale holder), records the
//!   holder as inside, counts an *overlap* when an older holder is still inside, and returns
//!   the counter;
//! * `commit(token, read)`: refuses a stale token again; otherwise sets the counter to
//!   `read + 1` and counts a *violation* if the counter moved since `enter` (a lost update, i.e.
//!   two holders' writes were both accepted).
//!
//! Meanwhile the parent injects the scenario's fault. At the end it reads the resource and the
//! workers' statistics (the last snapshot of a killed worker counts) and prints a markdown
//! table; `--markdown PATH` also writes the full report. Every loop is bounded in time; the
//! parent kills every process it started (servers and workers) by pid when it is done.
//! The exit status is 1 when a safety check failed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::Client;
use fred::interfaces::{ClientLike, HashesInterface, LuaInterface};
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, PerformanceConfig, ReconnectPolicy,
};
use fred::types::{ClusterHash, CustomCommand, Value};
use fredlock::{Config, Error, LockClient, LockGuard, NotificationMode};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    Baseline,
    ClientKill,
    Restart,
    SigStop,
    SigKill,
    ScriptFlush,
    Oom,
    StreamGap,
    Mixed,
}

impl Scenario {
    const ALL: [Scenario; 9] = [
        Scenario::Baseline,
        Scenario::ClientKill,
        Scenario::Restart,
        Scenario::SigStop,
        Scenario::SigKill,
        Scenario::ScriptFlush,
        Scenario::Oom,
        Scenario::StreamGap,
        Scenario::Mixed,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::ClientKill => "client-kill",
            Scenario::Restart => "restart",
            Scenario::SigStop => "sigstop",
            Scenario::SigKill => "sigkill",
            Scenario::ScriptFlush => "script-flush",
            Scenario::Oom => "oom",
            Scenario::StreamGap => "stream-gap",
            Scenario::Mixed => "mixed",
        }
    }

    fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The watchdog lease of the workers. Short where a paused holder must outlive it.
    fn lease(self) -> Duration {
        match self {
            Scenario::SigStop | Scenario::Mixed => Duration::from_secs(1),
            _ => Duration::from_secs(2),
        }
    }

    /// Whether a holder may legitimately die or vanish (so waiting out a lease is expected).
    fn holders_die(self) -> bool {
        matches!(
            self,
            Scenario::Restart | Scenario::SigStop | Scenario::SigKill | Scenario::Mixed
        )
    }

    fn explanation(self) -> &'static str {
        match self {
            Scenario::Baseline => {
                "No fault: the reference for the numbers below (same workload, same lease)."
            }
            Scenario::ClientKill => {
                "`CLIENT KILL ID` of one random connection of the lock server (command or \
                 notifier connection of any worker) every 100-300 ms."
            }
            Scenario::Restart => {
                "The lock `redis-server` is SIGKILLed and restarted on the same port and \
                 directory every 4 s. With `appendfsync always` every acknowledged write \
                 (holds, fencing counters, queues, streams) survives; clients reconnect."
            }
            Scenario::SigStop => {
                "Every 3 s a worker process that is inside a critical section is SIGSTOPped \
                 for 2.5 leases (lease 1 s), then SIGCONTed. Its hold expires meanwhile and \
                 another holder takes over with a higher token; after SIGCONT its guard must \
                 report `lost()` and its late write must be refused by the resource."
            }
            Scenario::SigKill => {
                "Every 3 s a worker process inside a critical section is SIGKILLed and a new \
                 worker process is started in its place. Its holds (and fair-lock queue \
                 places) are freed by lease expiry."
            }
            Scenario::ScriptFlush => {
                "`SCRIPT FLUSH` on the lock server every 200 ms: every script call may meet \
                 `NOSCRIPT` and must reload transparently."
            }
            Scenario::Oom => {
                "Every 2 s `CONFIG SET maxmemory` to 32 KiB above the used memory for 1.5 s, \
                 then back to 0. Writes fail with `OOM`; fredlock reports `Error::OutOfMemory` \
                 and workers retry."
            }
            Scenario::StreamGap => {
                "`XTRIM <stream> MAXLEN 0` on every event stream of the prefix (found with \
                 `SCAN … TYPE stream`) every 50 ms while workers wait, so readers miss events \
                 and must detect the gap and re-check. In Pub/Sub mode there are no streams: \
                 the cell is a second baseline."
            }
            Scenario::Mixed => {
                "All of the above at once at lower rates (kills every 300-900 ms, restart every \
                 7 s, SIGSTOP and SIGKILL every 6 s, flush every 500 ms, OOM windows every 5 s, \
                 trims every 200 ms), lease 1 s."
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum LockKind {
    Mutex,
    Fair,
    RwWrite,
}

impl LockKind {
    const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::Fair, LockKind::RwWrite];

    fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "Mutex",
            LockKind::Fair => "FairMutex",
            LockKind::RwWrite => "RwLock write",
        }
    }

    /// Redis-safe short name (resource keys, stats map).
    fn id(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair",
            LockKind::RwWrite => "rw",
        }
    }
}

fn mode_name(mode: NotificationMode) -> &'static str {
    mode.as_str()
}

fn parse_mode(name: &str) -> Option<NotificationMode> {
    match name {
        "stream" => Some(NotificationMode::Stream),
        "pubsub" => Some(NotificationMode::PubSub),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

/// `--key value` pairs (a flag without value maps to "").
fn parse_flags(args: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut flags = BTreeMap::new();
    let mut iter = args.iter().peekable();
    while let Some(arg) = iter.next() {
        let key = arg
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {arg:?}"))?;
        let value = match iter.peek() {
            Some(next) if !next.starts_with("--") => iter.next().cloned().unwrap_or_default(),
            _ => String::new(),
        };
        flags.insert(key.to_owned(), value);
    }
    Ok(flags)
}

fn flag<T: std::str::FromStr>(
    flags: &BTreeMap<String, String>,
    name: &str,
    default: Option<T>,
) -> Result<T, String> {
    match flags.get(name) {
        Some(value) => value
            .parse()
            .map_err(|_| format!("--{name}: cannot parse {value:?}")),
        None => default.ok_or_else(|| format!("--{name} is required")),
    }
}

struct Options {
    scenarios: Vec<Scenario>,
    modes: Vec<NotificationMode>,
    seconds: u64,
    workers: usize,
    tasks: usize,
    markdown: Option<String>,
}

fn parse_options(flags: &BTreeMap<String, String>) -> Result<Options, String> {
    let scenario: String = flag(flags, "scenario", Some("all".to_owned()))?;
    let scenarios = if scenario == "all" {
        Scenario::ALL.to_vec()
    } else {
        scenario
            .split(',')
            .map(|name| Scenario::parse(name).ok_or_else(|| format!("unknown scenario {name:?}")))
            .collect::<Result<_, _>>()?
    };
    let modes: String = flag(flags, "modes", Some("stream,pubsub".to_owned()))?;
    let modes = modes
        .split(',')
        .map(|m| parse_mode(m).ok_or_else(|| format!("unknown mode {m:?}")))
        .collect::<Result<_, _>>()?;
    let options = Options {
        scenarios,
        modes,
        seconds: flag(flags, "seconds", Some(20))?,
        workers: flag(flags, "workers", Some(4))?,
        tasks: flag(flags, "tasks", Some(4))?,
        markdown: flags.get("markdown").cloned(),
    };
    if !(1..=600).contains(&options.seconds) || options.workers < 1 || options.tasks < 1 {
        return Err("--seconds must be 1..=600, --workers and --tasks at least 1".into());
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags = match parse_flags(&args) {
        Ok(flags) => flags,
        Err(err) => return usage(&err),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the tokio runtime");
    if flags.contains_key("worker") {
        return match WorkerOptions::parse(&flags) {
            Ok(options) => runtime.block_on(worker::run(options)),
            Err(err) => usage(&err),
        };
    }
    match parse_options(&flags) {
        Ok(options) => runtime.block_on(parent::run(options, &args)),
        Err(err) => usage(&err),
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

// ---------------------------------------------------------------------------
// Statistics shared by workers and parent
// ---------------------------------------------------------------------------

/// What one worker observed for one lock type (cumulative).
#[derive(Serialize, Deserialize, Default, Clone, Debug)]
struct KindStats {
    /// Successful `lock()` calls.
    acquisitions: u64,
    /// Critical sections whose commit the resource accepted.
    sections: u64,
    /// Enters or commits the resource refused as stale.
    stale: u64,
    /// Stale refusals whose guard did not report `lost()` within three leases.
    stale_not_lost: u64,
    /// Guards that reported `lost()` by the end of their critical section.
    lost: u64,
    /// `lock()` calls that failed with `Error::OutOfMemory` / any other error.
    oom_errors: u64,
    lock_errors: u64,
    /// `unlock()` that found the hold gone / that failed.
    unlock_not_held: u64,
    unlock_errors: u64,
    /// Failed calls to the resource server (should never happen).
    resource_errors: u64,
    /// Longest single `lock()` wait, and how many waits took longer than the lease.
    max_wait_ms: u64,
    waits_over_lease: u64,
    /// `lock()` calls still waiting at the end of the run after more than one lease.
    unfinished_over_lease: u64,
    /// A few distinct error messages and lost causes, for the report.
    samples: Vec<String>,
}

const MAX_SAMPLES: usize = 6;

impl KindStats {
    fn sample(&mut self, text: String) {
        if self.samples.len() < MAX_SAMPLES && !self.samples.contains(&text) {
            self.samples.push(text);
        }
    }

    fn merge(&mut self, other: &KindStats) {
        self.acquisitions += other.acquisitions;
        self.sections += other.sections;
        self.stale += other.stale;
        self.stale_not_lost += other.stale_not_lost;
        self.lost += other.lost;
        self.oom_errors += other.oom_errors;
        self.lock_errors += other.lock_errors;
        self.unlock_not_held += other.unlock_not_held;
        self.unlock_errors += other.unlock_errors;
        self.resource_errors += other.resource_errors;
        self.max_wait_ms = self.max_wait_ms.max(other.max_wait_ms);
        self.waits_over_lease += other.waits_over_lease;
        self.unfinished_over_lease += other.unfinished_over_lease;
        for sample in &other.samples {
            self.sample(sample.clone());
        }
    }
}

/// Per lock type, keyed by [`LockKind::id`].
type WorkerStats = BTreeMap<String, KindStats>;

/// Resource scripts. KEYS: state hash, inside hash. See the module docs.
const ENTER: &str = r#"
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('HGET', KEYS[1], 'highest') or '0')
if token < highest then
  redis.call('HINCRBY', KEYS[1], 'stale', 1)
  return {0, 0}
end
local overlapped = false
for _, t in ipairs(redis.call('HKEYS', KEYS[2])) do
  local other = tonumber(t)
  if other == token then
    redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  elseif other < token then
    -- an older holder never left: count it once, then forget it
    overlapped = true
    redis.call('HDEL', KEYS[2], t)
  end
end
if overlapped then redis.call('HINCRBY', KEYS[1], 'overlaps', 1) end
redis.call('HSET', KEYS[1], 'highest', token)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {1, tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')}
"#;

const COMMIT: &str = r#"
local token = tonumber(ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
local highest = tonumber(redis.call('HGET', KEYS[1], 'highest') or '0')
if token < highest then
  redis.call('HINCRBY', KEYS[1], 'stale', 1)
  return 0
end
local counter = tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')
if counter ~= tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[1], 'violations', 1)
end
redis.call('HSET', KEYS[1], 'counter', tonumber(ARGV[2]) + 1)
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return 1
"#;

fn resource_keys(prefix: &str, kind: LockKind) -> (String, String) {
    let state = format!("res:{prefix}:{}", kind.id());
    let inside = format!("{state}:inside");
    (state, inside)
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

/// A small xorshift generator: randomness for fault timing, not for security.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(nanos ^ (u64::from(std::process::id()) << 32) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

// ---------------------------------------------------------------------------
// Worker process
// ---------------------------------------------------------------------------

struct WorkerOptions {
    lock_url: String,
    resource_url: String,
    prefix: String,
    mode: NotificationMode,
    lease: Duration,
    tasks: usize,
    start_ms: u64,
    until_ms: u64,
}

impl WorkerOptions {
    fn parse(flags: &BTreeMap<String, String>) -> Result<WorkerOptions, String> {
        let mode: String = flag(flags, "mode", None)?;
        Ok(WorkerOptions {
            lock_url: flag(flags, "lock-url", None)?,
            resource_url: flag(flags, "resource-url", None)?,
            prefix: flag(flags, "prefix", None)?,
            mode: parse_mode(&mode).ok_or_else(|| format!("unknown mode {mode:?}"))?,
            lease: Duration::from_millis(flag(flags, "lease-ms", None)?),
            tasks: flag(flags, "tasks", None)?,
            start_ms: flag(flags, "start-ms", None)?,
            until_ms: flag(flags, "until-ms", None)?,
        })
    }

    fn to_args(&self) -> Vec<String> {
        let pairs = [
            ("lock-url", self.lock_url.clone()),
            ("resource-url", self.resource_url.clone()),
            ("prefix", self.prefix.clone()),
            ("mode", mode_name(self.mode).to_owned()),
            ("lease-ms", self.lease.as_millis().to_string()),
            ("tasks", self.tasks.to_string()),
            ("start-ms", self.start_ms.to_string()),
            ("until-ms", self.until_ms.to_string()),
        ];
        let mut args = vec!["--worker".to_owned()];
        for (key, value) in pairs {
            args.push(format!("--{key}"));
            args.push(value);
        }
        args
    }
}

mod worker {
    use super::*;

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
        resource: Client,
        keys: (String, String),
        stats: Arc<StdMutex<WorkerStats>>,
        lease: Duration,
        until: Instant,
    }

    impl Task {
        fn record(&self, update: impl FnOnce(&mut KindStats)) {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            update(stats.entry(self.kind.id().to_owned()).or_default());
        }
    }

    pub(super) async fn run(options: WorkerOptions) -> ExitCode {
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
                resource: resource.clone(),
                keys: resource_keys(&options.prefix, kind),
                stats: stats.clone(),
                lease: options.lease,
                until,
            };
            for index in 0..options.tasks {
                tasks.spawn(task_loop(task.clone(), index as u64));
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
        // Dead waiters leave a fair queue within one lease, like dead holders.
        config.waiter_lease = options.lease;
        // Experiments: CHAOS_HANDOVER_STREAK overrides Config::handover_streak (0 turns the
        // barging mutex's local hand-over off).
        if let Some(streak) = std::env::var("CHAOS_HANDOVER_STREAK")
            .ok()
            .and_then(|value| value.parse().ok())
        {
            config.handover_streak = streak;
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

    async fn task_loop(task: Task, index: u64) {
        let mut rng = Rng::seeded();
        rng.0 ^= index.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
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
                    tokio::time::sleep(Duration::from_millis(rng.range(10, 40))).await;
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
            critical_section(&task, &guard, &mut rng).await;
            finish(&task, guard).await;
        }
    }

    /// Enter, "work", commit; the resource checks the token at both ends.
    async fn critical_section(task: &Task, guard: &LockGuard, rng: &mut Rng) {
        let token = guard.fencing_token();
        let keys = vec![task.keys.0.clone(), task.keys.1.clone()];
        let pid = std::process::id().to_string();
        let entered: Result<Vec<i64>, _> = task
            .resource
            .eval(ENTER, keys.clone(), vec![token.to_string(), pid])
            .await;
        let read = match entered.as_deref() {
            Ok([1, counter]) => *counter,
            Ok(_) => return stale(task, guard).await,
            Err(err) => return resource_error(task, err),
        };
        tokio::time::sleep(Duration::from_micros(rng.range(0, 2000))).await;
        let committed: Result<i64, _> = task
            .resource
            .eval(COMMIT, keys, vec![token.to_string(), read.to_string()])
            .await;
        match committed {
            Ok(1) => task.record(|s| s.sections += 1),
            Ok(_) => stale(task, guard).await,
            Err(err) => resource_error(task, &err),
        }
    }

    /// The resource refused this holder's token: the guard must know it lost the lock.
    async fn stale(task: &Task, guard: &LockGuard) {
        let learned = tokio::time::timeout(task.lease * 3, guard.lost()).await;
        task.record(|s| {
            s.stale += 1;
            match learned {
                Ok(cause) => s.sample(format!("stale write refused, guard lost: {cause:?}")),
                Err(_) => s.stale_not_lost += 1,
            }
        });
    }

    fn resource_error(task: &Task, err: &fred::error::Error) {
        task.record(|s| {
            s.resource_errors += 1;
            s.sample(format!("resource: {err}"));
        });
    }

    async fn finish(task: &Task, guard: LockGuard) {
        if let Some(cause) = guard.lost_cause() {
            task.record(|s| {
                s.lost += 1;
                s.sample(format!("lost: {cause:?}"));
            });
        }
        match guard.unlock().await {
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
}

// ---------------------------------------------------------------------------
// Parent: servers, workers, fault injection, report
// ---------------------------------------------------------------------------

fn redis_server_bin() -> String {
    std::env::var("FREDLOCK_REDIS_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// A `redis-server` child in its own temporary directory; SIGKILLed on drop.
struct RedisProcess {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    // Dropped after the process is killed (see Drop).
    dir: tempfile::TempDir,
}

impl RedisProcess {
    fn start(args: &[&str]) -> std::io::Result<RedisProcess> {
        let dir = tempfile::Builder::new()
            .prefix("fredlock-chaos-")
            .tempdir()?;
        let mut server = RedisProcess {
            child: None,
            port: 0,
            args: args.iter().map(|a| a.to_string()).collect(),
            dir,
        };
        let mut last = None;
        for _ in 0..5 {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("redis-server did not start")))
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> std::io::Result<()> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))?;
        let mut child = Command::new(redis_server_bin())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--protected-mode", "no", "--save", ""])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "redis-server exited: {status}"
                )));
            }
            if ping(self.port) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other("redis-server did not answer PING"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGKILL and start again on the same port and directory (the AOF is reloaded).
    fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        let mut last = None;
        for _ in 0..20 {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(err) => last = Some(err),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("restart failed")))
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `PING` answered with `PONG` (a server still loading its AOF answers `-LOADING`).
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

fn signal(pid: u32, sig: libc::c_int) -> bool {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// A worker process and the last statistics it printed.
struct Worker {
    child: Child,
    pid: u32,
    stats: Arc<StdMutex<Option<WorkerStats>>>,
    done: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    /// Killed on purpose (sigkill scenario) or because it hung.
    killed: bool,
    exited: bool,
}

impl Worker {
    fn spawn(options: &WorkerOptions) -> std::io::Result<Worker> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(options.to_args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("worker stdout not piped"))?;
        let stats = Arc::new(StdMutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let (sink, finished) = (stats.clone(), done.clone());
        let reader = std::thread::spawn(move || read_worker_output(stdout, &sink, &finished));
        Ok(Worker {
            pid: child.id(),
            child,
            stats,
            done,
            reader: Some(reader),
            killed: false,
            exited: false,
        })
    }

    fn is_live(&self) -> bool {
        !self.killed && !self.exited
    }

    fn kill(&mut self) {
        signal(self.pid, libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.killed = true;
        self.join_reader();
    }

    fn join_reader(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }

    /// Waits until `deadline` for the exit; false when it had to be killed.
    fn wait_until(&mut self, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.exited = true;
                self.join_reader();
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// Exited without its final `DONE` report (a crash).
    fn crashed(&self) -> bool {
        self.exited && !self.done.load(Ordering::Acquire)
    }

    fn last_stats(&self) -> Option<WorkerStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.is_live() {
            self.kill();
        }
    }
}

fn read_worker_output(
    stdout: std::process::ChildStdout,
    sink: &StdMutex<Option<WorkerStats>>,
    done: &AtomicBool,
) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let (tag, json) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        if tag != "STATS" && tag != "DONE" {
            continue;
        }
        if let Ok(stats) = serde_json::from_str::<WorkerStats>(json) {
            *sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
        }
        if tag == "DONE" {
            done.store(true, Ordering::Release);
        }
    }
}

/// Fault counters of one cell.
#[derive(Default)]
struct Faults {
    client_kills: AtomicU64,
    restarts: AtomicU64,
    stops: AtomicU64,
    sigkills: AtomicU64,
    flushes: AtomicU64,
    oom_windows: AtomicU64,
    trimmed_entries: AtomicU64,
    admin_errors: AtomicU64,
    admin_samples: StdMutex<Vec<String>>,
}

impl Faults {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn summary(&self) -> String {
        let items = [
            ("connections killed", &self.client_kills),
            ("restarts", &self.restarts),
            ("SIGSTOPs", &self.stops),
            ("SIGKILLs", &self.sigkills),
            ("script flushes", &self.flushes),
            ("OOM windows", &self.oom_windows),
            ("stream entries trimmed", &self.trimmed_entries),
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

/// Resource counters of one lock type, read at the end of a cell.
#[derive(Default, Debug, Clone)]
struct ResourceCounts {
    accepted: u64,
    counter: u64,
    stale: u64,
    overlaps: u64,
    violations: u64,
    duplicates: u64,
}

struct KindReport {
    kind: LockKind,
    resource: ResourceCounts,
    workers: KindStats,
}

impl KindReport {
    /// The safety properties: no accepted lost update, no shared token, exact counter, every
    /// refused holder told through `lost()`.
    fn safe(&self, hung: usize) -> bool {
        let r = &self.resource;
        r.violations == 0
            && r.duplicates == 0
            && r.counter == r.accepted
            && self.workers.stale_not_lost == 0
            && self.workers.resource_errors == 0
            && hung == 0
    }
}

struct CellReport {
    scenario: Scenario,
    mode: NotificationMode,
    lease: Duration,
    faults: String,
    workers_started: usize,
    /// Workers killed because they did not finish in time, or that exited without reporting.
    hung: usize,
    kinds: Vec<KindReport>,
}

/// Everything the fault injectors of one cell share.
struct Cell {
    scenario: Scenario,
    mode: NotificationMode,
    prefix: String,
    lease: Duration,
    lock_server: Arc<StdMutex<RedisProcess>>,
    lock_admin: Client,
    resource_admin: Client,
    workers: Arc<StdMutex<Vec<Worker>>>,
    worker_options: WorkerOptions,
    faults: Faults,
    rng: StdMutex<Rng>,
    until: Instant,
}

impl Cell {
    fn random(&self, lo: u64, hi: u64) -> u64 {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .range(lo, hi)
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Worker>> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sleeps `ms`, or less when the run ends first. False when the run is over.
    async fn pause(&self, ms: u64) -> bool {
        let wake = (Instant::now() + Duration::from_millis(ms)).min(self.until);
        tokio::time::sleep_until(wake.into()).await;
        Instant::now() < self.until
    }

    /// Counts a failed admin command (expected while the server restarts) and keeps samples.
    fn admin_error(&self, what: &str, err: &dyn std::fmt::Display) {
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
}

mod parent {
    use super::*;

    pub(super) async fn run(options: Options, args: &[String]) -> ExitCode {
        let machine = machine_description();
        println!("chaos: {machine}");
        let resource = match RedisProcess::start(&["--appendonly", "no"]) {
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
                    mode_name(*mode),
                    options.seconds
                );
                match run_cell(*scenario, *mode, &options, &resource, &resource_admin).await {
                    Ok(report) => {
                        print_cell(&report);
                        reports.push(report);
                    }
                    Err(err) => {
                        eprintln!(
                            "cell {} / {} failed: {err}",
                            scenario.name(),
                            mode_name(*mode)
                        );
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
        let elapsed = started.elapsed();
        let _ = resource_admin.quit().await;
        drop(resource);

        let table = results_table(&reports);
        println!("\n{table}\n{}", faults_table(&reports));
        if let Some(path) = &options.markdown {
            let command = format!("cargo run --release --example chaos -- {}", args.join(" "));
            let doc = render_markdown(&reports, &command, &machine, elapsed, &options);
            if let Err(err) = std::fs::write(path, doc) {
                eprintln!("cannot write {path}: {err}");
                return ExitCode::FAILURE;
            }
            println!("wrote {path}");
        }
        let safe = reports
            .iter()
            .all(|cell| cell.kinds.iter().all(|k| k.safe(cell.hung)));
        println!(
            "{} in {:.0?}",
            if safe {
                "all safety checks passed"
            } else {
                "SAFETY CHECK FAILED"
            },
            elapsed
        );
        if safe {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    async fn run_cell(
        scenario: Scenario,
        mode: NotificationMode,
        options: &Options,
        resource: &RedisProcess,
        resource_admin: &Client,
    ) -> Result<CellReport, String> {
        let lock_server = RedisProcess::start(&["--appendonly", "yes", "--appendfsync", "always"])
            .map_err(|err| format!("lock redis-server: {err}"))?;
        let lock_admin = fred_client(&lock_server.url())
            .await
            .map_err(|err| format!("admin connection: {err}"))?;
        println!("   lock server {}", lock_server.url());
        let prefix = format!(
            "chaos-{}-{}-{}",
            scenario.name(),
            mode_name(mode),
            unix_ms()
        );
        let lease = scenario.lease();
        // Workers connect during the first 1.5 s, then all start together.
        let start_ms = unix_ms() + 1500;
        let worker_options = WorkerOptions {
            lock_url: lock_server.url(),
            resource_url: resource.url(),
            prefix: prefix.clone(),
            mode,
            lease,
            tasks: options.tasks,
            start_ms,
            until_ms: start_ms + options.seconds * 1000,
        };
        let mut workers = Vec::new();
        for _ in 0..options.workers {
            workers.push(Worker::spawn(&worker_options).map_err(|e| format!("worker: {e}"))?);
        }
        let cell = Arc::new(Cell {
            scenario,
            mode,
            prefix,
            lease,
            lock_server: Arc::new(StdMutex::new(lock_server)),
            lock_admin,
            resource_admin: resource_admin.clone(),
            workers: Arc::new(StdMutex::new(workers)),
            until: instant_of(worker_options.until_ms),
            worker_options,
            faults: Faults::default(),
            rng: StdMutex::new(Rng::seeded()),
        });
        tokio::time::sleep_until(instant_of(start_ms).into()).await;
        inject(&cell).await;
        recover(&cell).await;
        let hung = wait_for_workers(&cell).await;
        let report = collect(&cell, hung).await;
        let _ = cell.lock_admin.quit().await;
        Ok(report)
    }

    /// Runs the scenario's injector(s) until the end of the cell.
    async fn inject(cell: &Arc<Cell>) {
        match cell.scenario {
            Scenario::Baseline => {
                let _ = cell.pause(u64::MAX / 4).await;
            }
            Scenario::ClientKill => client_kill(cell, 100, 300).await,
            Scenario::Restart => restart(cell, 4000).await,
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
        }
    }

    /// Undoes lasting faults so the workers can finish: SIGCONT everyone, no memory limit.
    async fn recover(cell: &Cell) {
        for worker in cell.workers().iter().filter(|w| w.is_live()) {
            signal(worker.pid, libc::SIGCONT);
        }
        if cell
            .lock_server
            .lock()
            .map(|s| s.child.is_some())
            .unwrap_or(false)
        {
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
        for kind in LockKind::ALL {
            let mut workers = KindStats::default();
            for stats in snapshots.iter().flatten() {
                if let Some(kind_stats) = stats.get(kind.id()) {
                    workers.merge(kind_stats);
                }
            }
            let resource = read_resource(&cell.resource_admin, &cell.prefix, kind).await;
            kinds.push(KindReport {
                kind,
                resource,
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

    async fn read_resource(client: &Client, prefix: &str, kind: LockKind) -> ResourceCounts {
        let (state, _) = resource_keys(prefix, kind);
        let fields: BTreeMap<String, u64> = client.hgetall(&state).await.unwrap_or_default();
        let get = |name: &str| fields.get(name).copied().unwrap_or(0);
        ResourceCounts {
            accepted: get("accepted"),
            counter: get("counter"),
            stale: get("stale"),
            overlaps: get("overlaps"),
            violations: get("violations"),
            duplicates: get("duplicates"),
        }
    }

    // -- fault injectors --------------------------------------------------------

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

    /// SIGKILLs the lock server and restarts it from its AOF, once per period.
    async fn restart(cell: &Cell, period_ms: u64) {
        while cell.pause(period_ms).await {
            let server = cell.lock_server.clone();
            let restarted = tokio::task::spawn_blocking(move || {
                server.lock().unwrap_or_else(|p| p.into_inner()).restart()
            })
            .await
            .expect("restart task");
            match restarted {
                Ok(()) => Faults::add(&cell.faults.restarts, 1),
                Err(err) => cell.admin_error("restart", &err),
            }
        }
    }

    /// Pids of live workers that are inside a critical section now (by the resource's record).
    async fn holders(cell: &Cell) -> Vec<u32> {
        let mut pids = Vec::new();
        for kind in LockKind::ALL {
            let (_, inside) = resource_keys(&cell.prefix, kind);
            let map: BTreeMap<String, u32> = cell
                .resource_admin
                .hgetall(&inside)
                .await
                .unwrap_or_default();
            pids.extend(map.into_values());
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
            let mut options = clone_options(&cell.worker_options);
            options.start_ms = unix_ms();
            match Worker::spawn(&options) {
                Ok(worker) => workers.push(worker),
                Err(err) => eprintln!("respawn failed: {err}"),
            }
        }
    }

    fn clone_options(options: &WorkerOptions) -> WorkerOptions {
        WorkerOptions {
            lock_url: options.lock_url.clone(),
            resource_url: options.resource_url.clone(),
            prefix: options.prefix.clone(),
            ..*options
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
            if let Err(err) =
                command(&cell.lock_admin, "CONFIG", &["SET", "maxmemory", &limit]).await
            {
                cell.admin_error("CONFIG SET", &err);
                continue;
            }
            Faults::add(&cell.faults.oom_windows, 1);
            tokio::time::sleep(Duration::from_millis(window_ms)).await;
            if let Err(err) = command(&cell.lock_admin, "CONFIG", &["SET", "maxmemory", "0"]).await
            {
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

    // -- reporting ----------------------------------------------------------------

    fn print_cell(cell: &CellReport) {
        println!("   faults: {}", cell.faults);
        for k in &cell.kinds {
            let r = &k.resource;
            let w = &k.workers;
            println!(
                "   {:<13} sections={} violations={} stale={} overlaps={} lost={} \
                 max_wait={}ms waits>lease={} errors(oom/other)={}/{} unlock_failed={} {}",
                k.kind.name(),
                r.accepted,
                r.violations,
                r.stale,
                r.overlaps,
                w.lost,
                w.max_wait_ms,
                w.waits_over_lease + w.unfinished_over_lease,
                w.oom_errors,
                w.lock_errors,
                w.unlock_errors + w.unlock_not_held,
                if k.safe(cell.hung) { "ok" } else { "UNSAFE" }
            );
        }
    }

    pub(super) fn results_table(reports: &[CellReport]) -> String {
        let mut out = String::from(
            "| Scenario | Mode | Lock | Sections | Violations | Stale rejected | Overlaps \
             | Lost | Longest wait (ms) | Waits > lease (+ still waiting at the end) \
             | lock() errors OOM / other \
             | unlock() failed | Safe |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for cell in reports {
            for k in &cell.kinds {
                let (r, w) = (&k.resource, &k.workers);
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                    cell.scenario.name(),
                    mode_name(cell.mode),
                    k.kind.name(),
                    r.accepted,
                    r.violations + r.duplicates,
                    r.stale,
                    r.overlaps,
                    w.lost,
                    w.max_wait_ms,
                    long_waits(w),
                    w.oom_errors,
                    w.lock_errors,
                    w.unlock_errors + w.unlock_not_held,
                    if k.safe(cell.hung) { "yes" } else { "**NO**" }
                );
            }
        }
        out
    }

    /// `n`, or `n (+m)` when `m` calls were still waiting at the end after more than a lease.
    fn long_waits(w: &KindStats) -> String {
        if w.unfinished_over_lease > 0 {
            format!("{} (+{})", w.waits_over_lease, w.unfinished_over_lease)
        } else {
            w.waits_over_lease.to_string()
        }
    }

    pub(super) fn faults_table(reports: &[CellReport]) -> String {
        let mut out = String::from(
            "| Scenario | Mode | Lease | Worker processes | Faults injected |\n|---|---|---:|---:|---|\n",
        );
        for cell in reports {
            let _ = writeln!(
                out,
                "| {} | {} | {} s | {}{} | {} |",
                cell.scenario.name(),
                mode_name(cell.mode),
                cell.lease.as_secs_f32(),
                cell.workers_started,
                if cell.hung > 0 {
                    format!(" ({} hung or crashed)", cell.hung)
                } else {
                    String::new()
                },
                cell.faults
            );
        }
        out
    }
}

// ---------------------------------------------------------------------------
// The markdown report
// ---------------------------------------------------------------------------

fn machine_description() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let redis = Command::new(redis_server_bin())
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|f| f.strip_prefix("v="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    format!("{cpus} CPUs (nproc), {model}, Redis {redis}")
}

const METRICS: &str = "\
* **Sections**: critical sections whose commit the resource accepted.
* **Violations**: accepted commits that lost an update (the counter moved between the holder's \
  `enter` and its `commit`), plus entries by two holders with the same token. The resource \
  accepts a write only with a token at least as high as every token it has seen, so this \
  must be 0; it is the column that says whether fencing kept the data correct. The final \
  counter is also checked to equal the number of accepted commits.
* **Stale rejected**: enters or commits refused because a higher token had been seen: a \
  holder whose lease had run out (paused, or cut off from Redis) tried to write late. Every \
  such holder must also learn it through `LockGuard::lost()` within three leases (checked; \
  a miss makes the row unsafe).
* **Overlaps**: hand-offs during which an older holder was still inside its critical \
  section (each abandoned section counted once). They happen only when a lease expires \
  under a live or dead holder (SIGSTOP, SIGKILL, a server that lost the hold): this is the \
  mutual exclusion a lease alone cannot give, and why the tokens matter.
* **Lost**: guards whose `lost()` had fired by the end of their critical section.
* **Longest wait**: the longest single `lock()` / `write()` call that succeeded.
* **Waits > lease**: successful `lock()` calls that took longer than the lease; in \
  parentheses, calls still waiting at the end after more than a lease. With push wakeups a \
  waiter should only wait out a lease when the holder vanished without releasing (killed, \
  paused, a release that failed) or the queue ahead of it was long.
* **lock() errors**: acquisitions that failed with `Error::OutOfMemory` / another error; \
  the workers retry after 10-40 ms. A waiting `lock()` repeats an attempt that failed for a \
  transient reason (timeout, broken connection, a restarting server) itself, with the same \
  op id, for up to `Config::transient_retry` (30 s), so killed connections and restarts \
  show up here only when that runs out; `OOM` is not retried.
* **unlock() failed**: releases that returned `NotHeld` (the hold had expired or passed to \
  another owner; where no holder dies, it can also be a release that the Redis client sent \
  again after its connection broke, when the first send had already freed the lock and \
  another owner had taken it) or an error (the lock then frees itself when its lease ends).
* **Safe**: no violation, no duplicate token, exact counter, every refused holder told \
  through `lost()`, no resource error, no worker hung.";

/// Shown when `RwLock` writers waited out a lease although no holder died.
const RW_WAKEUP_NOTE: &str = "\
* **Unexpected `RwLock` write waits (liveness, not safety)**: writers waited out a lease \
  although no holder died. A release names the writer at the head of the Redis queue (rule \
  `name`, since 2c3caa8) and a reader head gets one `chain` event that lists the readers \
  Redis admits (since 1988e32), so a waiter should not have to sleep out its wait bound \
  here. Treat this as a regression and look at the wake events (`RUST_LOG=fredlock=debug` \
  in the workers).
";

fn render_markdown(
    reports: &[CellReport],
    command: &str,
    machine: &str,
    elapsed: Duration,
    options: &Options,
) -> String {
    let mut doc = String::new();
    let _ = writeln!(
        doc,
        "# Reliability under fault injection\n\n\
         Generated by `examples/chaos.rs` (do not edit the numbers by hand; re-run instead).\n\n\
         * Command: `{command}`\n\
         * Machine: {machine}\n\
         * Run time: {:.0} s; {} s per scenario and notification mode; {} worker processes x \
         {} tasks per lock type\n",
        elapsed.as_secs_f64(),
        options.seconds,
        options.workers,
        options.tasks
    );
    doc.push_str(
        "## Set-up\n\n\
         Each scenario runs once per notification mode against a fresh lock `redis-server` \
         (`--appendonly yes --appendfsync always`). Worker processes (the example binary \
         re-executed) each run the same number of tasks on a `Mutex`, a fair `Mutex` and the \
         write side of an `RwLock` at the same time, all with a watchdog lease (1 s for \
         `sigstop` and `mixed`, 2 s otherwise; the waiter lease of the fair and read-write \
         queues equals it; every other setting has its default, e.g. `transient_retry` 30 s). \
         A task loops: `lock()`, critical section, `unlock()`, retrying after errors.\n\n\
         The critical section works on a resource on a **separate** `redis-server`, so faults \
         of the lock server never touch it: a Lua `enter(token)` refuses tokens lower than the \
         highest it has seen and records the holder as inside; after 0-2 ms of work a Lua \
         `commit(token, value_read)` refuses a stale token again, otherwise writes \
         `value_read + 1` and counts a violation if the value moved meanwhile.\n\n\
         ## Scenarios\n\n",
    );
    for scenario in Scenario::ALL {
        let _ = writeln!(doc, "* `{}`: {}", scenario.name(), scenario.explanation());
    }
    let _ = write!(
        doc,
        "\n## Results\n\n{}\n{METRICS}\n\n## Faults injected\n\n{}\n",
        parent::results_table(reports),
        parent::faults_table(reports)
    );
    doc.push_str(&observations(reports));
    doc
}

/// Findings derived from the numbers, so the text never contradicts the table.
fn observations(reports: &[CellReport]) -> String {
    let rows = || {
        reports
            .iter()
            .flat_map(|cell| cell.kinds.iter().map(move |k| (cell, k)))
    };
    let label = |cell: &CellReport, k: &KindReport| {
        format!(
            "{}/{}/{}",
            cell.scenario.name(),
            mode_name(cell.mode),
            k.kind.name()
        )
    };
    let mut out = String::from("## What the numbers show\n\n");
    let unsafe_rows: Vec<String> = rows()
        .filter(|(cell, k)| !k.safe(cell.hung))
        .map(|(cell, k)| label(cell, k))
        .collect();
    let sections: u64 = rows().map(|(_, k)| k.resource.accepted).sum();
    let stale: u64 = rows().map(|(_, k)| k.resource.stale).sum();
    if unsafe_rows.is_empty() {
        let _ = writeln!(
            out,
            "* **Safety held in every cell**: {sections} critical sections were committed, \
             no commit lost an update, no two holders shared a token, every final counter \
             equals its number of accepted commits, and each of the {stale} late writes was \
             refused by the token check and its holder learned about it through `lost()`."
        );
    } else {
        let _ = writeln!(
            out,
            "* **Safety checks failed in**: {}.",
            unsafe_rows.join(", ")
        );
    }
    let overlaps: Vec<String> = rows()
        .filter(|(_, k)| k.resource.overlaps > 0)
        .map(|(cell, k)| format!("{} ({})", label(cell, k), k.resource.overlaps))
        .collect();
    let _ = writeln!(
        out,
        "* Overlapping critical sections (a lease expired under a holder that was still \
         inside): {}.",
        if overlaps.is_empty() {
            "none".to_owned()
        } else {
            overlaps.join(", ")
        }
    );
    let long = |k: &KindReport| k.workers.waits_over_lease + k.workers.unfinished_over_lease;
    // The same lock type and mode in the fault-free baseline, if it ran.
    let in_baseline = |cell: &CellReport, kind: LockKind| {
        reports
            .iter()
            .filter(|c| c.scenario == Scenario::Baseline && c.mode == cell.mode)
            .flat_map(|c| c.kinds.iter())
            .any(|k| k.kind == kind && long(k) > 0)
    };
    let unexpected_waits: Vec<String> = rows()
        .filter(|(cell, k)| !cell.scenario.holders_die() && long(k) > 0)
        .map(|(cell, k)| {
            let note = if in_baseline(cell, k.kind) && cell.scenario != Scenario::Baseline {
                ", also in the baseline"
            } else {
                ""
            };
            format!("{} ({}{note})", label(cell, k), long(k))
        })
        .collect();
    let _ = writeln!(
        out,
        "* Waits longer than a lease where no holder dies (baseline, client-kill, \
         script-flush, oom, stream-gap): {}.",
        if unexpected_waits.is_empty() {
            "none: every waiter was woken by an event or a re-check, never by waiting out a \
             lease"
                .to_owned()
        } else {
            unexpected_waits.join(", ")
        }
    );
    let rw_stalls = rows().any(|(cell, k)| {
        k.kind == LockKind::RwWrite && !cell.scenario.holders_die() && long(k) > 0
    });
    if rw_stalls {
        out.push_str(RW_WAKEUP_NOTE);
    }
    let _ = writeln!(out, "\n### Samples of errors and lost causes\n");
    for (cell, k) in rows().filter(|(_, k)| !k.workers.samples.is_empty()) {
        let _ = writeln!(
            out,
            "* {}: {}",
            label(cell, k),
            k.workers.samples.join("; ")
        );
    }
    out
}
