//! Segmented (sharded) stock: N locks over N stock keys instead of one lock over one key.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example sharded_stock -- \
//!     [--stock N] [--shards N] [--buyers N] [--clients N] [--work-ms N]
//! ```
//!
//! A lock turns concurrent sales into a queue: with one lock over one stock counter, only one
//! sale runs at a time however many buyers there are. A common fix for hot items is to split
//! the stock into segments, `stock:0 .. stock:N-1`, each guarded by its own lock
//! (`stock-0 .. stock-N-1`): up to N sales then run at once.
//!
//! A buyer picks a random segment. If that segment is sold out, it does not give up: it moves
//! on to the next segments (the "merge" step), and only when every segment is empty does it
//! report the item sold out. A buyer remembers which segments it saw empty (stock never grows
//! back), so it does not lock them again.
//!
//! Both set-ups run with the same buyers (default 16 tasks spread over 2 `LockClient`s, as if
//! in 2 processes), the same total stock (default 1000) and the same simulated work per sale
//! (default 1 ms inside the lock). The table shows sales per second; the example checks for
//! both that no segment went below zero, nothing is left, exactly `stock` sales were recorded
//! and no unit was sold twice, and exits with status 1 otherwise.
//!
//! (Not to be confused with [`fredlock::Config::shards`], which spreads the *lock keys* over
//! hash tags; it changes nothing about how many sales can run at once.)

use std::collections::HashSet;
use std::error::Error as StdError;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use fredlock::{Config, LockClient};

type AnyResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

const PREFIX: &str = "ex-sharded";
/// Only a hang takes this long.
const HANG: Duration = Duration::from_secs(50);

struct Options {
    stock: i64,
    shards: usize,
    buyers: usize,
    clients: usize,
    work: Duration,
}

fn parse() -> AnyResult<Options> {
    let mut options = Options {
        stock: 1000,
        shards: 8,
        buyers: 16,
        clients: 2,
        work: Duration::from_millis(1),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--stock" => options.stock = value()?.parse()?,
            "--shards" => options.shards = value()?.parse()?,
            "--buyers" => options.buyers = value()?.parse()?,
            "--clients" => options.clients = value()?.parse()?,
            "--work-ms" => options.work = Duration::from_millis(value()?.parse()?),
            other => return Err(format!("unknown argument {other:?} (see the module docs)").into()),
        }
    }
    if options.stock <= 0 || options.shards == 0 || options.buyers == 0 || options.clients == 0 {
        return Err("--stock, --shards, --buyers and --clients must be at least 1".into());
    }
    Ok(options)
}

/// The result of one set-up.
struct Outcome {
    label: String,
    sold: usize,
    elapsed: Duration,
    /// Sales made in another segment than the one the buyer picked first.
    moved_on: u64,
    /// Stock left per segment.
    left: Vec<i64>,
    /// Units recorded more than once.
    duplicates: usize,
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    match run(&url).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(err) => {
            eprintln!("FAILED: {err}");
            std::process::exit(1);
        }
    }
}

async fn run(url: &str) -> AnyResult<bool> {
    let options = parse()?;
    let mut clients = Vec::new();
    for _ in 0..options.clients {
        let mut config = Config::new(url);
        config.key_prefix = PREFIX.into();
        let client = LockClient::connect(config)
            .await
            .map_err(|err| connect_error(url, err))?;
        clients.push(client);
    }
    println!(
        "segmented stock against {url}: {} units, {} buyers on {} clients, {:?} of work per sale",
        options.stock, options.buyers, options.clients, options.work
    );

    let single = sell(&clients, &options, 1).await?;
    let sharded = sell(&clients, &options, options.shards).await?;
    for client in &clients {
        client.shutdown().await?;
    }

    println!();
    println!(
        "{:<22} | {:>6} | {:>8} | {:>9} | {:>9} | {:>10} | {:>10}",
        "set-up", "sold", "time", "sales/s", "moved on", "duplicates", "stock left"
    );
    println!("{}", "-".repeat(92));
    let mut ok = true;
    for outcome in [&single, &sharded] {
        let left: i64 = outcome.left.iter().sum();
        println!(
            "{:<22} | {:>6} | {:>6.0}ms | {:>9.0} | {:>9} | {:>10} | {:>10}",
            outcome.label,
            outcome.sold,
            outcome.elapsed.as_secs_f64() * 1000.0,
            outcome.sold as f64 / outcome.elapsed.as_secs_f64(),
            outcome.moved_on,
            outcome.duplicates,
            left,
        );
        let mut problems = Vec::new();
        if outcome.sold as i64 != options.stock {
            problems.push(format!("{} sold, expected {}", outcome.sold, options.stock));
        }
        if outcome.left.iter().any(|&l| l != 0) {
            problems.push(format!("stock left per segment {:?}", outcome.left));
        }
        if outcome.duplicates > 0 {
            problems.push(format!("{} units sold twice", outcome.duplicates));
        }
        for problem in problems {
            println!("  FAILED ({}): {problem}", outcome.label);
            ok = false;
        }
    }
    println!();
    println!(
        "speed-up with {} segments: {:.1}×",
        options.shards,
        single.elapsed.as_secs_f64() / sharded.elapsed.as_secs_f64()
    );
    if ok {
        println!("OK: no oversell, every unit sold exactly once, in both set-ups");
    }
    Ok(ok)
}

/// Splits the stock over `segments` keys, lets the buyers sell everything, and checks Redis.
async fn sell(clients: &[LockClient], options: &Options, segments: usize) -> AnyResult<Outcome> {
    let redis = clients[0].redis();
    let stock_key = |k: usize| format!("{PREFIX}:{segments}:stock:{k}");
    let sold_key = format!("{PREFIX}:{segments}:sold");
    // Equal segments; the first ones take the remainder.
    for k in 0..segments {
        let share = options.stock / segments as i64
            + i64::from((k as i64) < options.stock % segments as i64);
        let _: () = redis.set(stock_key(k), share, None, None, false).await?;
    }
    let _: i64 = redis.del(sold_key.as_str()).await?;

    let started = Instant::now();
    let mut buyers = Vec::new();
    for b in 0..options.buyers {
        let client = clients[b % clients.len()].clone();
        let locks = (0..segments)
            .map(|k| client.mutex(&format!("stock-{k}")))
            .collect::<Result<Vec<_>, _>>()?;
        let stock_keys: Vec<String> = (0..segments).map(stock_key).collect();
        let sold_key = sold_key.clone();
        let work = options.work;
        let mut rng = Rng::new();
        buyers.push(tokio::spawn(async move {
            let redis = client.redis().clone();
            let rpush = CustomCommand::new_static("RPUSH", ClusterHash::FirstKey, false);
            let mut empty = vec![false; segments];
            let (mut sold, mut moved_on) = (0usize, 0u64);
            'buying: loop {
                let first = rng.below(segments);
                for step in 0..segments {
                    let k = (first + step) % segments;
                    if empty[k] {
                        continue;
                    }
                    let guard = locks[k].lock().await?;
                    let stock: i64 = redis.get(stock_keys[k].as_str()).await?;
                    if stock > 0 {
                        tokio::time::sleep(work).await;
                        let _: () = redis
                            .set(stock_keys[k].as_str(), stock - 1, None, None, false)
                            .await?;
                        let unit = format!("{k}:{stock}");
                        let _: i64 = redis
                            .custom(
                                rpush.clone(),
                                vec![Value::from(sold_key.as_str()), unit.into()],
                            )
                            .await?;
                        guard.unlock().await?;
                        sold += 1;
                        moved_on += u64::from(step > 0);
                        continue 'buying;
                    }
                    guard.unlock().await?;
                    empty[k] = true; // this segment ran dry: try the next one
                }
                // Every segment is empty: sold out.
                return Ok::<_, Box<dyn StdError + Send + Sync>>((sold, moved_on));
            }
        }));
    }
    let (mut sold, mut moved_on) = (0, 0);
    for buyer in buyers {
        let (s, m) = tokio::time::timeout(HANG, buyer)
            .await
            .map_err(|_| "a buyer hung")???;
        sold += s;
        moved_on += m;
    }
    let elapsed = started.elapsed();

    let mut left = Vec::new();
    for k in 0..segments {
        left.push(redis.get::<i64, _>(stock_key(k)).await?);
    }
    let lrange = CustomCommand::new_static("LRANGE", ClusterHash::FirstKey, false);
    let units: Vec<String> = redis
        .custom(
            lrange,
            vec![Value::from(sold_key.as_str()), 0.into(), (-1).into()],
        )
        .await?;
    let distinct: HashSet<&String> = units.iter().collect();
    if units.len() != sold {
        return Err(format!(
            "buyers counted {sold} sales, Redis recorded {}",
            units.len()
        )
        .into());
    }
    Ok(Outcome {
        label: if segments == 1 {
            "1 lock, 1 key".into()
        } else {
            format!("{segments} locks, {segments} keys")
        },
        sold,
        elapsed,
        moved_on,
        left,
        duplicates: units.len() - distinct.len(),
    })
}

/// A tiny xorshift generator (seeded from std's random hasher keys), enough to pick segments.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Rng(seed | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A readable message for a failed `LockClient::connect`.
fn connect_error(url: &str, err: fredlock::Error) -> String {
    match err {
        fredlock::Error::Connect(_) => {
            format!("cannot connect to {url}: {err} (set REDIS_URL to a running Redis)")
        }
        other => format!("cannot start a lock client on {url}: {other}"),
    }
}
