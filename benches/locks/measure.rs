//! Measurement: clocks, CPU time of processes, memory, histograms and their summaries, and the
//! `PING` round trip every figure is compared with.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use hdrhistogram::Histogram;
use serde_json::{json, Value as Json};

/// Warm-up PINGs before the measured ones.
pub const PING_WARMUP: u64 = 200;

pub fn progress(message: &str) {
    eprintln!("[locks bench] {message}");
}

/// Wall-clock microseconds since the epoch: the common clock of all processes.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("system clock before 1970")
        .as_micros() as u64
}

/// CPU time (user + system, µs) used by a set of processes, from `/proc/<pid>/stat`.
pub fn processes_cpu_us(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|&pid| process_cpu_us(pid)).sum()
}

/// User + system CPU µs of a running process, from `/proc/<pid>/stat`.
pub fn process_cpu_us(pid: u32) -> Option<u64> {
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
pub struct CountingAlloc;

pub static HEAP_LIVE: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

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
pub fn heap_live() -> i64 {
    HEAP_LIVE.load(Ordering::Relaxed) as i64
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(pages * page)
}

/// `/proc/loadavg`'s first three fields, for the record.
pub fn load_average() -> String {
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
pub fn machine_json(redis_version: &str) -> Json {
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
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let kib: f64 = text
                .lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(round(kib / 1024.0 / 1024.0, 1))
        });
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "memory_gib": memory_gib,
        "kernel": kernel,
        "redis_version": redis_version,
        "load_average_at_end": load_average(),
    })
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Percentiles of one histogram, in µs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// `hist` holds values in units of `unit_us` microseconds.
    pub fn of(hist: &Histogram<u64>, unit_us: f64) -> Summary {
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
    pub fn of_durations(values: &[Duration]) -> Summary {
        let mut hist = histogram();
        for value in values {
            record(&mut hist, *value);
        }
        Summary::of(&hist, 1e-3)
    }

    pub fn json(&self) -> Json {
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
    pub fn json_per_ping(&self, ping: f64) -> Json {
        json!({
            "p50": round2(ratio(self.p50, ping)),
            "p90": round2(ratio(self.p90, ping)),
            "p99": round2(ratio(self.p99, ping)),
            "max": round2(ratio(self.max, ping)),
        })
    }
}

pub fn round2(x: f64) -> f64 {
    round(x, 2)
}

pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

pub fn ratio(value: f64, ping_p50: f64) -> f64 {
    if ping_p50 > 0.0 {
        value / ping_p50
    } else {
        f64::NAN
    }
}

/// Records a duration in ns.
pub fn record(hist: &mut Histogram<u64>, elapsed: Duration) {
    hist.saturating_record(elapsed.as_nanos().max(1) as u64);
}

pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// One fred PING round trip on `client`.
pub async fn ping_once(client: &Client) -> Result<Duration, String> {
    let started = Instant::now();
    let _: String = client
        .ping(None)
        .await
        .map_err(|err| format!("PING failed: {err}"))?;
    Ok(started.elapsed())
}

pub async fn ping_warmup(client: &Client) -> Result<(), String> {
    for _ in 0..PING_WARMUP {
        ping_once(client).await?;
    }
    Ok(())
}

/// Adds `count` sequential PINGs (after a warm-up) to `hist` (ns).
pub async fn measure_ping(
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
pub async fn ping_summary(client: &Client, count: u64) -> Result<Summary, String> {
    let mut hist = histogram();
    measure_ping(client, count, &mut hist).await?;
    Ok(Summary::of(&hist, 1e-3))
}

pub fn times_ping(value: f64, ping_p50: f64) -> String {
    format!("{value:.0} ({:.2}×)", ratio(value, ping_p50))
}

/// The size of a value (e.g. a future that was never polled).
pub fn size_of<T>(value: &T) -> usize {
    std::mem::size_of_val(value)
}

/// The PING round trips measured right before and right after a scenario; the reference is
/// their union.
pub struct PingBracket {
    pub before: Summary,
    pub after: Summary,
    pub both: Summary,
}

impl PingBracket {
    pub fn new(before: &Histogram<u64>, after: &Histogram<u64>) -> PingBracket {
        let mut both = before.clone();
        both.add(after).expect("histograms with the same bounds");
        PingBracket {
            before: Summary::of(before, 1e-3),
            after: Summary::of(after, 1e-3),
            both: Summary::of(&both, 1e-3),
        }
    }
}

/// Sleeps until the wall-clock instant `at_us` (µs since the epoch).
pub async fn sleep_until_wall(at_us: u64) {
    let now = now_us();
    if at_us > now {
        tokio::time::sleep(Duration::from_micros(at_us - now)).await;
    }
}
