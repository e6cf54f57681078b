//! The flash-sale ("seckill") oversell problem, and the same sale under a fredlock `Mutex`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example seckill -- \
//!     [--procs N] [--tasks N] [--stock N] [--fair]
//! ```
//!
//! A flash sale has 100 units in Redis (`ex-seckill:stock`). Buyers run in several OS
//! processes (this example starts copies of itself, default 4 processes × 8 tasks) and each
//! sale is the classic read-check-write sequence:
//!
//! 1. `GET stock`; stop when it is 0;
//! 2. do some work (1 ms: payment, order record, ...);
//! 3. `SET stock <read value - 1>` and record the sale of unit number `<read value>`
//!    (`RPUSH ex-seckill:sold`).
//!
//! Run 1 does this without a lock. Two buyers that read the same value sell the same unit, and
//! a buyer that writes back a stale value puts units back on the shelf that were already sold:
//! the shop sells more than it has. A lock inside one process would not help, because the
//! buyers are in different processes.
//!
//! Run 2 wraps each sale in `locks.mutex("seckill")`, a lock in Redis that every process sees.
//! Then the stock never goes below zero, every unit from 1 to 100 is sold exactly once, and
//! exactly 100 sales are recorded. The example exits with status 1 if run 2 breaks any of
//! that. Run 1 is expected to oversell, but timing decides; it is reported, not checked.
//!
//! The `Mutex` barges: a task that releases and asks again at once often wins against the
//! waiters of other processes, which first have to be woken, so one process may make most of
//! the sales. That is correct (and the fastest hand-off); `--fair` uses `locks.fair_mutex`
//! instead, which serves waiters across processes in arrival order.
//!
//! The processes start together: each connects, prints `ready`, and waits for `go` on stdin.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::process::Stdio;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use fredlock::{Config, LockClient};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

type AnyResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

const PREFIX: &str = "ex-seckill";
const STOCK: &str = "ex-seckill:stock";
const SOLD: &str = "ex-seckill:sold";
/// Simulated work inside the critical section.
const WORK: Duration = Duration::from_millis(1);
/// Only a hang takes this long.
const HANG: Duration = Duration::from_secs(45);

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Hidden mode: `--worker <unlocked|locked|fair> <tasks>`, started by the parent below.
    if args.first().map(String::as_str) == Some("--worker") {
        let locked = match args.get(1).map(String::as_str) {
            Some("locked") => Lock::Mutex,
            Some("fair") => Lock::Fair,
            _ => Lock::None,
        };
        let tasks = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(8);
        if let Err(err) = worker(&url, locked, tasks).await {
            eprintln!("worker {}: {err}", std::process::id());
            std::process::exit(1);
        }
        return;
    }
    match parent(&url, &args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(err) => {
            eprintln!("FAILED: {err}");
            std::process::exit(1);
        }
    }
}

/// How the sales are guarded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lock {
    None,
    Mutex,
    Fair,
}

impl Lock {
    fn arg(self) -> &'static str {
        match self {
            Lock::None => "unlocked",
            Lock::Mutex => "locked",
            Lock::Fair => "fair",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Lock::None => "no lock",
            Lock::Mutex => "Mutex \"seckill\"",
            Lock::Fair => "FairMutex \"seckill\"",
        }
    }
}

struct Options {
    procs: usize,
    tasks: usize,
    stock: i64,
    fair: bool,
}

fn parse(args: &[String]) -> AnyResult<Options> {
    let mut options = Options {
        procs: 4,
        tasks: 8,
        stock: 100,
        fair: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--procs" => options.procs = value()?.parse()?,
            "--tasks" => options.tasks = value()?.parse()?,
            "--stock" => options.stock = value()?.parse()?,
            "--fair" => options.fair = true,
            other => return Err(format!("unknown argument {other:?} (see the module docs)").into()),
        }
    }
    if options.procs == 0 || options.tasks == 0 || options.stock <= 0 {
        return Err("--procs, --tasks and --stock must be at least 1".into());
    }
    Ok(options)
}

/// What one run left in Redis, plus what the processes reported.
struct Outcome {
    label: &'static str,
    records: usize,
    /// unit number -> how many times it was sold
    units: BTreeMap<i64, usize>,
    final_stock: i64,
    per_process: Vec<usize>,
    elapsed: Duration,
}

impl Outcome {
    fn distinct(&self) -> usize {
        self.units.len()
    }
    fn sold_twice(&self) -> usize {
        self.units.values().filter(|&&n| n > 1).count()
    }
    fn out_of_range(&self, stock: i64) -> usize {
        self.units.keys().filter(|&&u| u < 1 || u > stock).count()
    }
    fn oversold(&self, stock: i64) -> i64 {
        self.records as i64 - stock
    }

    /// The lines of the result table: (what, value).
    fn rows(&self, stock: i64) -> Vec<(&'static str, String)> {
        vec![
            ("sales recorded", self.records.to_string()),
            ("sold beyond stock", self.oversold(stock).to_string()),
            ("distinct units sold", self.distinct().to_string()),
            ("units sold 2+ times", self.sold_twice().to_string()),
            (
                "unit numbers <1 / >stock",
                self.out_of_range(stock).to_string(),
            ),
            ("final stock", self.final_stock.to_string()),
            ("sales per process", format!("{:?}", self.per_process)),
            (
                "time",
                format!("{:.0} ms", self.elapsed.as_secs_f64() * 1000.0),
            ),
        ]
    }
}

async fn parent(url: &str, args: &[String]) -> AnyResult<bool> {
    let options = parse(args)?;
    let redis = Client::new(
        fred::types::config::Config::from_url(url)?,
        None,
        None,
        None,
    );
    redis.init().await.map_err(|err| {
        format!("cannot connect to {url}: {err} (set REDIS_URL to a running Redis)")
    })?;
    println!(
        "flash sale against {url}: {} units, {} processes × {} tasks, {:?} of work per sale",
        options.stock, options.procs, options.tasks, WORK
    );

    let unlocked = run(&redis, &options, Lock::None).await?;
    let guarded = if options.fair {
        Lock::Fair
    } else {
        Lock::Mutex
    };
    let locked = run(&redis, &options, guarded).await?;
    let _ = redis.quit().await;

    let stock = options.stock;
    println!();
    println!("{:<26} | {:<22} | {:<22}", "", unlocked.label, locked.label);
    println!("{}", "-".repeat(76));
    for ((name, left), (_, right)) in unlocked.rows(stock).into_iter().zip(locked.rows(stock)) {
        println!("{name:<26} | {left:<22} | {right:<22}");
    }
    println!();

    if unlocked.oversold(stock) > 0 || unlocked.sold_twice() > 0 {
        println!(
            "without a lock: {} sales for {stock} units ({} units sold more than once)",
            unlocked.records,
            unlocked.sold_twice()
        );
    } else {
        println!(
            "without a lock: no oversell this time (timing was lucky); run again or raise --tasks"
        );
    }

    if guarded == Lock::Mutex {
        println!(
            "(the Mutex barges: a process that just released often takes the lock again before \
             other processes' waiters wake up, hence an uneven split; --fair serves them in order)"
        );
    }

    let mut problems = Vec::new();
    if locked.records as i64 != stock {
        problems.push(format!(
            "{} sales recorded, expected {stock}",
            locked.records
        ));
    }
    if locked.final_stock != 0 {
        problems.push(format!("final stock {} (expected 0)", locked.final_stock));
    }
    if locked.sold_twice() > 0 {
        problems.push(format!("{} units sold twice", locked.sold_twice()));
    }
    if locked.out_of_range(stock) > 0 || locked.distinct() as i64 != stock {
        problems.push(format!(
            "units sold are not exactly 1..={stock} ({} distinct, {} out of range)",
            locked.distinct(),
            locked.out_of_range(stock)
        ));
    }
    if problems.is_empty() {
        println!(
            "with the lock: OK, every unit 1..={stock} sold exactly once, stock never below 0"
        );
        Ok(true)
    } else {
        for problem in &problems {
            println!("with the lock: FAILED: {problem}");
        }
        Ok(false)
    }
}

/// One sale run: resets the stock, starts the worker processes together, and collects the
/// results from Redis and from the workers' output.
async fn run(redis: &Client, options: &Options, lock: Lock) -> AnyResult<Outcome> {
    let _: () = redis.set(STOCK, options.stock, None, None, false).await?;
    let _: i64 = redis.del(SOLD).await?;

    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..options.procs {
        let child = tokio::process::Command::new(&exe)
            .arg("--worker")
            .arg(lock.arg())
            .arg(options.tasks.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", exe.display()))?;
        children.push(child);
    }

    // Wait until every process is connected, then let them all go at once.
    let mut outputs = Vec::new();
    for child in &mut children {
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(HANG, lines.next_line())
            .await
            .map_err(|_| "a worker did not get ready")??;
        if ready.as_deref() != Some("ready") {
            return Err(format!("a worker failed to start (said {ready:?})").into());
        }
        outputs.push(lines);
    }
    let started = Instant::now();
    for child in &mut children {
        let stdin = child.stdin.as_mut().ok_or("worker without stdin")?;
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }

    let mut per_process = Vec::new();
    for (child, mut lines) in children.iter_mut().zip(outputs) {
        let line = tokio::time::timeout(HANG, lines.next_line())
            .await
            .map_err(|_| "a worker did not finish")??;
        let status = child.wait().await?;
        let sold = line
            .as_deref()
            .and_then(|l| l.strip_prefix("sold "))
            .and_then(|n| n.parse().ok());
        match (status.success(), sold) {
            (true, Some(sold)) => per_process.push(sold),
            _ => return Err(format!("a worker failed ({status}, said {line:?})").into()),
        }
    }
    let elapsed = started.elapsed();

    let final_stock: i64 = redis.get(STOCK).await?;
    let lrange = CustomCommand::new_static("LRANGE", ClusterHash::FirstKey, false);
    let sold: Vec<i64> = redis
        .custom(lrange, vec![Value::from(SOLD), 0.into(), (-1).into()])
        .await?;
    let mut units = BTreeMap::new();
    for unit in &sold {
        *units.entry(*unit).or_insert(0) += 1;
    }
    Ok(Outcome {
        label: lock.label(),
        records: sold.len(),
        units,
        final_stock,
        per_process,
        elapsed,
    })
}

/// A worker process: `tasks` buyers that sell until the stock is gone, under the lock or not.
async fn worker(url: &str, lock: Lock, tasks: usize) -> AnyResult<()> {
    let mut config = Config::new(url);
    config.key_prefix = PREFIX.into();
    let locks = LockClient::connect(config).await?;
    let mutex = match lock {
        Lock::Fair => locks.fair_mutex("seckill")?.into(),
        _ => locks.mutex("seckill")?,
    };
    let locked = lock != Lock::None;

    // Start barrier: tell the parent we are connected, wait for its "go".
    println!("ready");
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    if stdin.next_line().await?.as_deref() != Some("go") {
        return Err("expected go on stdin".into());
    }

    let mut buyers = Vec::new();
    for _ in 0..tasks {
        let redis = locks.redis().clone();
        let mutex = mutex.clone();
        buyers.push(tokio::spawn(async move {
            let rpush = CustomCommand::new_static("RPUSH", ClusterHash::FirstKey, false);
            let mut sold = 0usize;
            loop {
                // Run 2: the whole read-check-write sequence is one critical section.
                let guard = if locked {
                    Some(mutex.lock().await?)
                } else {
                    None
                };
                let stock: i64 = redis.get(STOCK).await?;
                if stock > 0 {
                    tokio::time::sleep(WORK).await;
                    let _: () = redis.set(STOCK, stock - 1, None, None, false).await?;
                    let _: i64 = redis
                        .custom(rpush.clone(), vec![Value::from(SOLD), stock.into()])
                        .await?;
                    sold += 1;
                }
                if let Some(guard) = guard {
                    guard.unlock().await?;
                }
                if stock <= 0 {
                    return Ok::<_, Box<dyn StdError + Send + Sync>>(sold);
                }
            }
        }));
    }
    let mut sold = 0;
    for buyer in buyers {
        sold += buyer.await??;
    }
    locks.shutdown().await?;
    println!("sold {sold}");
    Ok(())
}
