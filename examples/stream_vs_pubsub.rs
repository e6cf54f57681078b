//! Stream or Pub/Sub? The same hand-off workload measured in both notification modes.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example stream_vs_pubsub -- \
//!     [--rounds N | --quick] [--clients N] [--plot PATH] [--json PATH]
//! ```
//!
//! A waiting task is not polling: it sleeps until its client's notifier connection receives the
//! release event of the lock it waits for. [`NotificationMode::Stream`] reads events from a Redis
//! Stream with `XREAD BLOCK`; [`NotificationMode::PubSub`] subscribes to a channel (Redisson's
//! model). This example shows what that costs in practice, mode by mode, under separate key
//! prefixes (two layouts must never share one):
//!
//! * one *holder* client takes the lock `handoff`; `--clients` other clients (default 4, each
//!   its own `LockClient` as if it were its own process) each start one task that calls
//!   `lock()` and waits;
//! * the holder then releases. The **wakeup latency** of the round is the time from just
//!   before `unlock()` is called until the first waiter's `lock()` returns. Everything runs in
//!   one process, so both instants come from the same clock;
//! * the other waiters then take and release the lock in turn, and the next round starts.
//!
//! Latencies go into an HDR histogram (µs) and are compared with the `PING` round trip of a
//! plain fred client measured in the same run: a hand-off costs at least the release script,
//! the event delivery and the waiter's acquire script, so about three round trips. Because
//! every release follows a short idle pause (the waiters must be seen waiting first), the
//! ratio uses a `PING` measured after the same pause; the back-to-back `PING` is shown too. The table
//! also shows how many connections the server counted before and after the clients connected
//! (`INFO clients`): two per `LockClient`, however many tasks wait.
//!
//! A CDF of both distributions is written as SVG to `--plot` (default
//! `target/stream_vs_pubsub.svg`), and the numbers as JSON to `--json` if given. The example
//! exits with status 1 if a round does not complete, or if two holders ever overlap.

use std::error::Error as StdError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::Config as FredConfig;
use fred::types::{ClusterHash, CustomCommand};
use fredlock::{Config, LockClient, NotificationMode};
use hdrhistogram::Histogram;
use tokio::sync::mpsc;

type AnyResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

/// A bound that only a hang can exceed (it is not a performance expectation).
const HANG: Duration = Duration::from_secs(30);

struct Args {
    rounds: usize,
    clients: usize,
    plot: String,
    json: Option<String>,
}

fn parse_args() -> AnyResult<Args> {
    let mut args = Args {
        rounds: 300,
        clients: 4,
        plot: "target/stream_vs_pubsub.svg".into(),
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--rounds" => args.rounds = value("--rounds")?.parse()?,
            "--quick" => args.rounds = 60,
            "--clients" => args.clients = value("--clients")?.parse()?,
            "--plot" => args.plot = value("--plot")?,
            "--json" => args.json = Some(value("--json")?),
            other => return Err(format!("unknown argument {other:?} (see the module docs)").into()),
        }
    }
    if args.rounds == 0 || args.clients == 0 {
        return Err("--rounds and --clients must be at least 1".into());
    }
    Ok(args)
}

/// The yardstick: `PING` round trips of a plain fred client (µs).
struct Ping {
    /// Back-to-back.
    hot: u64,
    /// Each after an idle pause of [`SETTLE`], like the hand-offs below: on a busy or
    /// virtualised machine, waking parked runtime threads costs more than the network.
    idle: u64,
}

/// The pause before each release, so that the waiters' first attempts have reached Redis.
const SETTLE: Duration = Duration::from_millis(5);

/// What one mode produced.
struct ModeResult {
    mode: NotificationMode,
    /// Wakeup latencies in µs.
    histogram: Histogram<u64>,
    /// The same samples, sorted, for the CDF plot.
    samples: Vec<u64>,
    /// How long the holder's `unlock()` call itself took (µs): the release script's round trip.
    unlock: Histogram<u64>,
    connections_before: Option<u64>,
    connections_after: Option<u64>,
    /// Wakeups the waiter clients' notifiers delivered (from `ClientStats`).
    wakeups: u64,
    elapsed: Duration,
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(2);
        }
    };
    match run(&url, &args).await {
        Ok(()) => {}
        Err(err) => {
            eprintln!("FAILED: {err}");
            std::process::exit(1);
        }
    }
}

async fn run(url: &str, args: &Args) -> AnyResult<()> {
    println!(
        "stream vs pub/sub against {url}: {} rounds, 1 holder + {} waiting clients",
        args.rounds, args.clients
    );

    // A plain fred client: the yardstick (PING) and the connection counter (INFO clients).
    let probe = Client::new(FredConfig::from_url(url)?, None, None, None);
    probe.init().await.map_err(|err| {
        format!("cannot connect to {url}: {err} (set REDIS_URL to a running Redis)")
    })?;
    let ping = Ping {
        hot: ping_p50(&probe, 500, None).await?,
        idle: ping_p50(&probe, 200, Some(SETTLE)).await?,
    };
    println!(
        "PING p50 of a fred client: {} µs back-to-back, {} µs after {SETTLE:?} idle",
        ping.hot, ping.idle
    );

    let baseline = connected_clients(&probe).await;
    let mut results = Vec::new();
    for (mode, prefix) in [
        (NotificationMode::Stream, "ex-svp-stream"),
        (NotificationMode::PubSub, "ex-svp-pubsub"),
    ] {
        settle_connections(&probe, baseline).await;
        let result = run_mode(url, mode, prefix, args, &probe).await?;
        results.push(result);
    }
    let _ = probe.quit().await;

    print_table(&results, &ping, args.clients + 1);
    plot(&args.plot, &results, &ping)?;
    println!("CDF plot written to {}", args.plot);
    if let Some(path) = &args.json {
        std::fs::write(path, to_json(&results, &ping, args).to_string())
            .map_err(|err| format!("cannot write {path}: {err}"))?;
        println!("JSON written to {path}");
    }
    Ok(())
}

/// Median round trip of `PING` in µs, back-to-back or each after an `idle` pause.
async fn ping_p50(client: &Client, count: usize, idle: Option<Duration>) -> AnyResult<u64> {
    let mut histogram = Histogram::<u64>::new(3)?;
    for _ in 0..count {
        if let Some(idle) = idle {
            tokio::time::sleep(idle).await;
        }
        let started = Instant::now();
        let _: String = client.ping(None).await?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    Ok(histogram.value_at_quantile(0.5).max(1))
}

/// `connected_clients` from `INFO clients`, sent as a custom command on `client`.
async fn connected_clients(client: &Client) -> Option<u64> {
    let info = CustomCommand::new_static("INFO", ClusterHash::Random, false);
    let text: String = client.custom(info, vec!["clients"]).await.ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|value| value.trim().parse().ok())
}

/// Waits (at most 3 s) until the server has closed the connections of clients shut down
/// earlier, so that the next "before" count is not inflated by them.
async fn settle_connections(probe: &Client, baseline: Option<u64>) {
    let Some(baseline) = baseline else { return };
    for _ in 0..300 {
        match connected_clients(probe).await {
            Some(now) if now > baseline => tokio::time::sleep(Duration::from_millis(10)).await,
            _ => return,
        }
    }
}

async fn run_mode(
    url: &str,
    mode: NotificationMode,
    prefix: &str,
    args: &Args,
    probe: &Client,
) -> AnyResult<ModeResult> {
    let connections_before = connected_clients(probe).await;
    let config = || {
        let mut config = Config::new(url);
        config.key_prefix = prefix.into();
        config.notification = mode;
        config
    };
    let holder = LockClient::connect(config()).await?;
    let mut waiters = Vec::new();
    for _ in 0..args.clients {
        waiters.push(LockClient::connect(config()).await?);
    }
    let mut connections_after = None;
    let wakeups_before: u64 = waiters.iter().map(|w| w.stats().wakeups).sum();

    let lock = holder.mutex("handoff")?;
    // Mutual exclusion check: how many tasks believe they hold the lock right now.
    let inside = Arc::new(AtomicUsize::new(0));
    let mut histogram = Histogram::<u64>::new(3)?;
    let mut samples = Vec::with_capacity(args.rounds);
    let mut unlock = Histogram::<u64>::new(3)?;
    let started = Instant::now();

    for round in 0..args.rounds {
        let guard = tokio::time::timeout(HANG, lock.lock())
            .await
            .map_err(|_| format!("round {round}: the holder could not take the lock"))??;
        enter(&inside, round)?;

        // Every waiter client starts one task that waits for the lock, reports the instant its
        // lock() returned, and passes the lock on.
        let (acquired_tx, mut acquired_rx) = mpsc::unbounded_channel::<Instant>();
        let mut tasks = Vec::new();
        for client in &waiters {
            let mutex = client.mutex("handoff")?;
            let acquired_tx = acquired_tx.clone();
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                let guard = mutex.lock().await?;
                let at = Instant::now();
                enter(&inside, round)?;
                let _ = acquired_tx.send(at);
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.unlock().await?;
                Ok::<_, Box<dyn StdError + Send + Sync>>(())
            }));
        }
        drop(acquired_tx);

        // Wait until every task is registered as a waiter, then give its first (failing)
        // attempt time to reach Redis, so that the release below is what wakes it.
        let all_waiting = async {
            while waiters.iter().map(|w| w.stats().waiting).sum::<usize>() < waiters.len() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(HANG, all_waiting)
            .await
            .map_err(|_| format!("round {round}: the waiters never started waiting"))?;
        tokio::time::sleep(SETTLE).await;
        if round == 0 {
            // Count the server's connections while every task waits (this is the command
            // connection of the holder, used before the clock starts).
            connections_after = connected_clients(holder.redis()).await;
        }

        inside.fetch_sub(1, Ordering::SeqCst);
        let unlock_called = Instant::now();
        guard.unlock().await?;
        unlock.record((unlock_called.elapsed().as_micros() as u64).max(1))?;

        // The channel closes when every waiter task has ended; a task that failed reports
        // its error when joined below.
        let mut earliest: Option<Instant> = None;
        while let Some(at) = tokio::time::timeout(HANG, acquired_rx.recv())
            .await
            .map_err(|_| format!("round {round}: a waiter did not get the lock within {HANG:?}"))?
        {
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        for task in tasks {
            task.await??;
        }
        let earliest = earliest.ok_or_else(|| format!("round {round}: no waiter got the lock"))?;
        let micros = earliest
            .saturating_duration_since(unlock_called)
            .as_micros() as u64;
        histogram.record(micros.max(1))?;
        samples.push(micros.max(1));
    }
    let elapsed = started.elapsed();
    let wakeups = waiters.iter().map(|w| w.stats().wakeups).sum::<u64>() - wakeups_before;

    holder.shutdown().await?;
    for client in &waiters {
        client.shutdown().await?;
    }
    samples.sort_unstable();
    println!(
        "  {:<7} {} rounds in {:.1} s",
        mode.as_str(),
        args.rounds,
        elapsed.as_secs_f64()
    );
    Ok(ModeResult {
        mode,
        histogram,
        samples,
        unlock,
        connections_before,
        connections_after,
        wakeups,
        elapsed,
    })
}

/// Records that one more task holds the lock; fails if another one already did.
fn enter(inside: &AtomicUsize, round: usize) -> AnyResult<()> {
    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
        return Err(format!("round {round}: two tasks held the lock at once").into());
    }
    Ok(())
}

fn print_table(results: &[ModeResult], ping: &Ping, lock_clients: usize) {
    let cell = |micros: u64| format!("{micros} ({:.1}×)", micros as f64 / ping.idle as f64);
    println!();
    println!(
        "wakeup latency = unlock() called -> first waiter's lock() returned; \
         (×) = multiple of the idle PING p50 ({} µs)",
        ping.idle
    );
    println!(
        "{:<7} | {:>7} | {:>16} | {:>16} | {:>16} | {:>16} | {:>8} | {:>11}",
        "mode", "samples", "p50 µs", "p90 µs", "p99 µs", "max µs", "wakeups", "connections"
    );
    println!("{}", "-".repeat(118));
    for r in results {
        let h = &r.histogram;
        let connections = match (r.connections_before, r.connections_after) {
            (Some(before), Some(after)) => format!("{before} -> {after}"),
            _ => "n/a".into(),
        };
        println!(
            "{:<7} | {:>7} | {:>16} | {:>16} | {:>16} | {:>16} | {:>8} | {:>11}",
            r.mode.as_str(),
            h.len(),
            cell(h.value_at_quantile(0.50)),
            cell(h.value_at_quantile(0.90)),
            cell(h.value_at_quantile(0.99)),
            cell(h.max()),
            r.wakeups,
            connections,
        );
    }
    for r in results {
        println!(
            "{}: the holder's unlock() call itself took p50 {} µs; the rest is the grant's \
             delivery to the waiter's process and waking the task (no script of its own)",
            r.mode.as_str(),
            r.unlock.value_at_quantile(0.5)
        );
    }
    for r in results {
        if let (Some(before), Some(after)) = (r.connections_before, r.connections_after) {
            println!(
                "{}: {} connections more for {lock_clients} LockClients \
                 (2 each: commands + notifier) while {} tasks waited",
                r.mode.as_str(),
                after.saturating_sub(before),
                lock_clients - 1,
            );
        }
    }
}

fn to_json(results: &[ModeResult], ping: &Ping, args: &Args) -> serde_json::Value {
    let modes: Vec<_> = results
        .iter()
        .map(|r| {
            let h = &r.histogram;
            serde_json::json!({
                "mode": r.mode.as_str(),
                "samples": h.len(),
                "p50_us": h.value_at_quantile(0.50),
                "p90_us": h.value_at_quantile(0.90),
                "p99_us": h.value_at_quantile(0.99),
                "max_us": h.max(),
                "mean_us": h.mean(),
                "unlock_call_p50_us": r.unlock.value_at_quantile(0.5),
                "wakeups": r.wakeups,
                "connections_before": r.connections_before,
                "connections_after": r.connections_after,
                "elapsed_s": r.elapsed.as_secs_f64(),
            })
        })
        .collect();
    serde_json::json!({
        "rounds": args.rounds,
        "waiting_clients": args.clients,
        "ping_p50_us": ping.hot,
        "ping_after_idle_p50_us": ping.idle,
        "modes": modes,
    })
}

/// Writes the CDF of both latency distributions as SVG (log-scaled latency axis).
fn plot(path: &str, results: &[ModeResult], ping: &Ping) -> AnyResult<()> {
    use plotters::prelude::*;

    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        }
    }
    let max = results
        .iter()
        .filter_map(|r| r.samples.last().copied())
        .max()
        .unwrap_or(1);
    let min = results
        .iter()
        .filter_map(|r| r.samples.first().copied())
        .chain([ping.hot])
        .min()
        .unwrap_or(1);
    let x_range = (min as f64 * 0.8).max(1.0)..(max as f64 * 1.25);

    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "fredlock: unlock() -> waiter's lock() returns (CDF)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x_range.log_scale(), 0f64..100f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("wakeup latency (µs, log scale)")
        .y_desc("percentile")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;

    for (r, color) in results.iter().zip([BLUE, RED]) {
        let n = r.samples.len() as f64;
        let points = r
            .samples
            .iter()
            .enumerate()
            .map(|(i, &v)| (v as f64, (i + 1) as f64 * 100.0 / n));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!(
                "{} (p50 {} µs)",
                r.mode.as_str(),
                r.histogram.value_at_quantile(0.5)
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    // The yardsticks: one PING round trip, back-to-back and after an idle pause.
    for (label, micros, color) in [
        ("PING p50", ping.hot, BLACK.mix(0.3)),
        ("PING p50 after idle", ping.idle, BLACK.mix(0.6)),
    ] {
        let x = micros as f64;
        chart
            .draw_series(LineSeries::new([(x, 0.0), (x, 100.0)], color))
            .map_err(|e| e.to_string())?
            .label(format!("{label} ({micros} µs)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
