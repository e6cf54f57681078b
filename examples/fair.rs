//! `FairMutex`: waiters get the lock in the order they asked for it, across processes.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example fair
//! ```
//!
//! Setup: three `LockClient`s stand for three processes. A holder takes the lock, then six tasks
//! (task `i` on client `i % 3`) ask for it one after the other; each waits until the previous
//! one is known to be waiting before the next one asks. Then the holder releases, and every task
//! takes the lock, notes its turn, holds it for 2 ms and releases.
//!
//! * With `locks.fair_mutex(name)` the waiters queue in Redis, and the lock is handed on in
//!   queue order: the acquisition order must equal the arrival order `0 1 2 3 4 5` (the example
//!   checks this and exits with status 1 otherwise), and each hold gets a larger fencing token.
//! * With `locks.mutex(name)` (barging) the same setup gives no such promise: each process
//!   wakes its own oldest waiter on every release and whichever reaches Redis first wins. Its
//!   order is printed for contrast, not checked.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fredlock::{Config, LockClient, Mutex};

type AnyResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

const TASKS: usize = 6;
const CLIENTS: usize = 3;
/// Only a hang takes this long.
const HANG: Duration = Duration::from_secs(30);

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
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut config = Config::new(url);
        config.key_prefix = "ex-fair".into();
        clients.push(
            LockClient::connect(config)
                .await
                .map_err(|err| connect_error(url, err))?,
        );
    }
    println!("{TASKS} tasks on {CLIENTS} clients queue for a held lock, in order 0..{TASKS}");

    let fair = round(&clients, true).await?;
    let barging = round(&clients, false).await?;
    for client in &clients {
        client.shutdown().await?;
    }

    let show = |order: &[usize]| {
        let names: Vec<String> = order.iter().map(usize::to_string).collect();
        names.join(" ")
    };
    let arrival: Vec<usize> = (0..TASKS).collect();
    let fair_order: Vec<usize> = fair.iter().map(|(task, _)| *task).collect();
    let tokens: Vec<u64> = fair.iter().map(|(_, token)| *token).collect();
    let barging_order: Vec<usize> = barging.iter().map(|(task, _)| *task).collect();
    println!();
    println!("arrival order:                  {}", show(&arrival));
    println!("FairMutex acquisition order:    {}", show(&fair_order));
    println!("  fencing tokens in that order: {tokens:?}");
    println!(
        "Mutex (barging) acquisition:    {}   (no order promised)",
        show(&barging_order)
    );
    println!();

    let in_order = fair_order == arrival;
    let tokens_grow = tokens.windows(2).all(|w| w[0] < w[1]);
    if in_order && tokens_grow {
        println!("OK: the fair lock served the waiters first-come, first-served");
        Ok(true)
    } else {
        println!(
            "FAILED: fair order {fair_order:?} (expected {arrival:?}), tokens growing: {tokens_grow}"
        );
        Ok(false)
    }
}

/// One round: holder takes the lock, the tasks queue in order, holder releases. Returns
/// (task, fencing token) in acquisition order.
async fn round(clients: &[LockClient], fair: bool) -> AnyResult<Vec<(usize, u64)>> {
    let handle = |client: &LockClient| -> fredlock::Result<Mutex> {
        if fair {
            client.fair_mutex("queue-demo").map(Mutex::from)
        } else {
            client.mutex("queue-demo")
        }
    };
    let holder = handle(&clients[0])?.lock().await?;

    let turns = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = &clients[task % CLIENTS];
        let lock = handle(client)?;
        let turns = turns.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await?;
            turns
                .lock()
                .expect("turn list poisoned")
                .push((task, guard.fencing_token()));
            tokio::time::sleep(Duration::from_millis(2)).await;
            guard.unlock().await
        }));
        // Do not let the next task ask before this one is known to wait.
        let waiting = async {
            loop {
                let arrived = if fair {
                    // A fair waiter counts once its place in the Redis queue is taken.
                    clients
                        .iter()
                        .map(|c| c.stats().queued_in_redis)
                        .sum::<usize>()
                } else {
                    // A barging waiter only registers locally; give its first attempt a moment.
                    clients.iter().map(|c| c.stats().waiting).sum::<usize>()
                };
                if arrived > task {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if !fair {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(HANG, waiting)
            .await
            .map_err(|_| format!("task {task} never started waiting"))?;
    }

    holder.unlock().await?;
    for task in tasks {
        tokio::time::timeout(HANG, task)
            .await
            .map_err(|_| "a task never got the lock")???;
    }
    let turns = turns.lock().expect("turn list poisoned").clone();
    Ok(turns)
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
