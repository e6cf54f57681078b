//! `RwLock`: shared readers, a writer that cannot starve, downgrade, and no upgrade.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --example rwlock
//! ```
//!
//! Two `LockClient`s (think: two processes) share the read-write lock `catalog`:
//!
//! 1. **Readers share.** Three readers hold read locks at the same time.
//! 2. **A waiting writer blocks new readers.** A writer asks for the write lock and waits for
//!    the three readers. A reader that arrives after it does not slip in beside the readers
//!    still holding (that could starve the writer forever): `try_read` says no, and `read`
//!    queues behind the writer. Order of events: readers release, writer writes, late reader
//!    reads.
//! 3. **Downgrade.** Under one [`Owner`], a writer takes a read lock too, then releases the write
//!    lock: it keeps reading without a gap in which another writer could get in. Other readers
//!    can join; writers cannot.
//! 4. **No upgrade.** An owner holding a read lock that asks for the write lock gets
//!    [`Error::UpgradeNotSupported`] at once. Waiting would deadlock: the write lock waits for
//!    all readers to leave, including the one asking.
//!
//! Every step is checked; the example exits with status 1 if one fails.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fredlock::{Config, Error, LockClient, Owner};

type AnyResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

/// Only a hang takes this long.
const HANG: Duration = Duration::from_secs(30);

/// Checks that failed; the example exits non-zero when this is not empty at the end.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, what: &str) {
        println!("    [{}] {what}", if ok { "ok" } else { "FAILED" });
        if !ok {
            self.0.push(what.to_owned());
        }
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut checks = Checks::default();
    match tokio::time::timeout(HANG * 2, run(&url, &mut checks)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => checks.check(false, &format!("error: {err}")),
        Err(_) => checks.check(false, "the example hung"),
    }
    if !checks.0.is_empty() {
        eprintln!("{} check(s) failed", checks.0.len());
        std::process::exit(1);
    }
    println!("\nall checks passed");
}

async fn connect(url: &str) -> AnyResult<LockClient> {
    let mut config = Config::new(url);
    config.key_prefix = "ex-rwlock".into();
    Ok(LockClient::connect(config)
        .await
        .map_err(|err| connect_error(url, err))?)
}

/// Waits until `client` has `n` acquisitions queued in Redis (a reader or writer that asked and
/// was told to wait).
async fn queued(client: &LockClient, n: usize, who: &str) -> AnyResult<()> {
    let wait = async {
        while client.stats().queued_in_redis < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(HANG, wait)
        .await
        .map_err(|_| format!("{who} never queued"))?;
    Ok(())
}

async fn run(url: &str, checks: &mut Checks) -> AnyResult<()> {
    println!("read-write lock \"catalog\" against {url}");
    let a = connect(url).await?;
    let b = connect(url).await?;
    let on_a = a.rwlock("catalog")?;
    let on_b = b.rwlock("catalog")?;
    // Start from a clean lock even if an earlier run was interrupted.
    on_a.force_unlock().await?;

    println!("1. readers share");
    let r1 = on_a.read().await?;
    let r2 = on_b.read().await?;
    let r3 = on_a.read().await?;
    let state = on_a.state().await?;
    println!(
        "    state: readers = {}, write_locked = {}",
        state.readers, state.write_locked
    );
    checks.check(state.readers == 3, "three read holds at once");

    println!("2. a waiting writer blocks new readers");
    let events = Arc::new(StdMutex::new(Vec::<String>::new()));
    let log = |events: &Arc<StdMutex<Vec<String>>>, what: String| {
        println!("    - {what}");
        events.lock().expect("event log poisoned").push(what);
    };
    let writer = {
        let (lock, events) = (on_b.clone(), events.clone());
        tokio::spawn(async move {
            let guard = lock.write().await?;
            log(
                &events,
                format!(
                    "writer got the write lock (token {})",
                    guard.fencing_token()
                ),
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            log(&events, "writer releases".into());
            guard.unlock().await
        })
    };
    queued(&b, 1, "the writer").await?;
    log(&events, "writer is waiting for 3 readers".into());

    let sneaked = on_a.try_read().await?;
    checks.check(
        sneaked.is_none(),
        "try_read while a writer waits: refused (no barging past the writer)",
    );
    drop(sneaked);
    let late_reader = {
        let (lock, events) = (on_a.clone(), events.clone());
        tokio::spawn(async move {
            let guard = lock.read().await?;
            log(
                &events,
                format!(
                    "late reader got a read lock (token {})",
                    guard.fencing_token()
                ),
            );
            guard.unlock().await
        })
    };
    queued(&a, 1, "the late reader").await?;
    log(&events, "late reader queued behind the writer".into());

    log(&events, "the three readers release".into());
    for guard in [r1, r2, r3] {
        guard.unlock().await?;
    }
    tokio::time::timeout(HANG, writer)
        .await
        .map_err(|_| "the writer hung")???;
    tokio::time::timeout(HANG, late_reader)
        .await
        .map_err(|_| "the late reader hung")???;
    let events = events.lock().expect("event log poisoned").clone();
    let at = |prefix: &str| events.iter().position(|e| e.starts_with(prefix));
    checks.check(
        matches!(
            (at("the three readers release"), at("writer got"), at("writer releases"), at("late reader got")),
            (Some(a), Some(b), Some(c), Some(d)) if a < b && b < c && c < d
        ),
        "order: readers release < writer writes < writer releases < late reader reads",
    );

    println!("3. downgrade: write -> read under one Owner");
    let owner = Owner::new();
    let mine = on_a.clone().with_owner(&owner);
    let write = mine.write().await?;
    let read = mine.read().await?; // allowed: the owner holds the write lock
    println!(
        "    holding write (token {}) and read (token {})",
        write.fencing_token(),
        read.fencing_token()
    );
    write.unlock().await?;
    let state = on_a.state().await?;
    println!(
        "    after the write unlock: write_locked = {}, readers = {}",
        state.write_locked, state.readers
    );
    checks.check(
        !state.write_locked && state.readers == 1,
        "the owner still reads after releasing the write lock",
    );
    let other_reader = on_b.try_read().await?;
    checks.check(
        other_reader.is_some(),
        "another reader can join the downgraded hold",
    );
    let other_writer = on_b.try_write().await?;
    checks.check(other_writer.is_none(), "a writer cannot get in");
    drop(other_writer);
    if let Some(guard) = other_reader {
        guard.unlock().await?;
    }
    read.unlock().await?;

    println!("4. no upgrade: read -> write fails at once");
    let owner = Owner::new();
    let mine = on_b.clone().with_owner(&owner);
    let read = mine.read().await?;
    let asked = std::time::Instant::now();
    let upgrade = tokio::time::timeout(HANG, mine.write()).await;
    match &upgrade {
        Ok(Err(err)) => println!(
            "    write() while reading, after {:.1} ms: Err({err})",
            asked.elapsed().as_secs_f64() * 1000.0
        ),
        Ok(Ok(_)) => println!("    write() while reading: got the write lock?!"),
        Err(_) => println!("    write() while reading: hung"),
    }
    checks.check(
        matches!(upgrade, Ok(Err(Error::UpgradeNotSupported(_)))),
        "Error::UpgradeNotSupported",
    );
    read.unlock().await?;
    let state = on_a.state().await?;
    checks.check(
        !state.write_locked && state.readers == 0,
        "the lock is free at the end",
    );

    a.shutdown().await?;
    b.shutdown().await?;
    Ok(())
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
