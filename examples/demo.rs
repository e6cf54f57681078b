//! A short guided tour of fredlock, run by `scripts/demo`.
//!
//! It connects to `REDIS_URL` (default `redis://127.0.0.1:6379`) and runs the same eight
//! scenes twice, once per notification mode (Stream, then Pub/Sub), each under its own key
//! prefix so that the two layouts never meet:
//!
//! * (a) contention: 8 tasks increment a counter with a non-atomic GET + SET, guarded by one
//!   `Mutex`; no increment may be lost;
//! * (b) re-entry: one `Owner` takes the same lock twice; the hold count goes 1, 2, 1, 0;
//! * (c) fencing tokens grow with every new holder, also after `force_unlock`, and a stale
//!   guard cannot release the new holder's lock;
//! * (d) lease lost: the lock key is deleted behind a watchdog guard's back, and `lost()` says so;
//! * (e) push wakeup: how long a waiting task takes to get the lock after `unlock()`, and how
//!   many connections the server sees meanwhile.
//! * (f) transfers between two accounts, each under a `MultiLock` over both accounts' locks,
//!   named in opposite orders by half of the tasks: no deadlock, the total stays the same.
//! * (g) a `CountDownLatch`: two tasks wait until three count-downs open it.
//! * (h) a `Semaphore` with 2 permits and 6 tasks: never more than 2 inside, and
//!   `LockClient::inspect` shows the 2 holders and the waiters queued behind them.
//!
//! The process exits with status 1 if a check fails. Set `RUST_LOG` (e.g. `RUST_LOG=debug`)
//! to see the crate's tracing output. The demo leaves its keys under `fredlock-demo-<pid>-*`.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::InfoKind;
use fredlock::{
    Config, Lease, LockClient, LockKind, LostCause, MultiLock, NotificationMode, Owner,
};

type DemoResult<T> = Result<T, Box<dyn StdError + Send + Sync>>;

/// Checks that failed; the demo exits non-zero when this is not empty at the end.
#[derive(Default)]
struct Checks {
    failed: Vec<String>,
}

impl Checks {
    fn expect(&mut self, ok: bool, what: String) {
        if !ok {
            println!("    FAILED: {what}");
            self.failed.push(what);
        }
    }
}

#[tokio::main]
async fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    println!("fredlock demo against {url}");

    let mut checks = Checks::default();
    for mode in [NotificationMode::Stream, NotificationMode::PubSub] {
        // A generous bound: the tour takes a few seconds; this only catches a hang.
        let tour = tokio::time::timeout(Duration::from_secs(60), tour(&url, mode, &mut checks));
        match tour.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => checks.expect(false, format!("{mode:?}: error: {err}")),
            Err(_) => checks.expect(false, format!("{mode:?}: the tour did not finish in 60 s")),
        }
    }

    println!();
    if checks.failed.is_empty() {
        println!("all checks passed");
    } else {
        println!("{} check(s) failed:", checks.failed.len());
        for what in &checks.failed {
            println!("  - {what}");
        }
        std::process::exit(1);
    }
}

/// All the scenes with one client in one notification mode.
async fn tour(url: &str, mode: NotificationMode, checks: &mut Checks) -> DemoResult<()> {
    let mode_name = mode.as_str();
    let mut config = Config::new(url);
    config.key_prefix = format!("fredlock-demo-{}-{mode_name}", std::process::id());
    config.notification = mode;
    config.shards = 1; // one shard: every lock's keys start with `{<prefix>:0}`
    println!();
    println!(
        "== {mode:?} notifications (key prefix {}) ==",
        config.key_prefix
    );

    let locks = LockClient::connect(config.clone()).await?;
    contention(&locks, &config.key_prefix, checks).await?;
    reentry(&locks, checks).await?;
    fencing(&locks, checks).await?;
    lease_lost(&locks, &config.key_prefix, checks).await?;
    push_wakeup(&locks, checks).await?;
    transfers(&locks, &config.key_prefix, checks).await?;
    latch(&locks, checks).await?;
    semaphore(&locks, checks).await?;
    locks.shutdown().await?;
    Ok(())
}

/// (a) 8 tasks × 25 non-atomic increments under one lock: the counter must reach 200.
async fn contention(locks: &LockClient, prefix: &str, checks: &mut Checks) -> DemoResult<()> {
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 25;
    const STALL: Duration = Duration::from_secs(10);
    let counter = Arc::new(format!("{prefix}:counter"));
    let mutex = locks.mutex("counter")?;
    let wakeups_before = locks.stats().wakeups;
    let started = Instant::now();

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (mutex, redis, counter) = (mutex.clone(), locks.redis().clone(), counter.clone());
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let guard = mutex.lock().await?;
                // Read, pause, write: without the lock, concurrent tasks would lose increments.
                let value: Option<u64> = redis.get(counter.as_str()).await?;
                tokio::task::yield_now().await;
                let _: () = redis
                    .set(counter.as_str(), value.unwrap_or(0) + 1, None, None, false)
                    .await?;
                guard.unlock().await?;
            }
            DemoResult::Ok(())
        });
    }
    // Normally well under a second. The bound only turns a stalled hand-off into a failed check.
    let stalled = !finished_within(&mut tasks, STALL).await?;
    let waiting = locks.stats().waiting;

    let total: Option<u64> = locks.redis().get(counter.as_str()).await?;
    let total = total.unwrap_or(0);
    println!(
        "(a) {TASKS} tasks x {ROUNDS} GET+SET increments under one Mutex: counter = {total} \
         (expected {}), {:.2} s, {} wakeups delivered",
        TASKS * ROUNDS,
        started.elapsed().as_secs_f64(),
        locks.stats().wakeups - wakeups_before,
    );
    checks.expect(
        !stalled,
        format!("hand-offs stalled: {waiting} task(s) still waiting after {STALL:?}"),
    );
    checks.expect(
        total == TASKS * ROUNDS,
        format!("counter is {total}, expected {}", TASKS * ROUNDS),
    );
    Ok(())
}

/// Waits up to `bound` for every task of `tasks`; false (and the rest aborted) when it passed.
async fn finished_within(
    tasks: &mut tokio::task::JoinSet<DemoResult<()>>,
    bound: Duration,
) -> DemoResult<bool> {
    let finished = tokio::time::timeout(bound, async {
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        DemoResult::Ok(())
    })
    .await;
    tasks.abort_all();
    match finished {
        Ok(result) => result.map(|()| true),
        Err(_) => Ok(false),
    }
}

/// (f) Transfers between two accounts, each under a `MultiLock` over both accounts' locks,
/// half of the tasks naming them in the opposite order: no deadlock, no money lost.
async fn transfers(locks: &LockClient, prefix: &str, checks: &mut Checks) -> DemoResult<()> {
    const ROUNDS: u64 = 10;
    const STALL: Duration = Duration::from_secs(10);
    let accounts = [format!("{prefix}:account:a"), format!("{prefix}:account:b")];
    for account in &accounts {
        let _: () = locks.redis().set(account, 100, None, None, false).await?;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (from, to) in [(0, 1), (1, 0), (0, 1), (1, 0)] {
        // Listed from the source account: two tasks name the locks in each order.
        let names = [format!("account:{from}"), format!("account:{to}")];
        let both = MultiLock::new([locks.mutex(&names[0])?, locks.mutex(&names[1])?])?;
        let (redis, accounts) = (locks.redis().clone(), accounts.clone());
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let guard = both.lock().await?;
                let source: i64 = redis.get(&accounts[from]).await?;
                let target: i64 = redis.get(&accounts[to]).await?;
                tokio::task::yield_now().await;
                let _: () = redis
                    .set(&accounts[from], source - 1, None, None, false)
                    .await?;
                let _: () = redis
                    .set(&accounts[to], target + 1, None, None, false)
                    .await?;
                guard.unlock().await?;
            }
            DemoResult::Ok(())
        });
    }
    let finished = finished_within(&mut tasks, STALL).await?;
    let mut total = 0;
    for account in &accounts {
        let balance: i64 = locks.redis().get(account).await?;
        total += balance;
    }
    println!(
        "(f) 4 tasks x {ROUNDS} transfers, each under a MultiLock over both accounts (listed in \
         opposite orders by half of them): finished {finished}, total {total} (expected 200)"
    );
    checks.expect(finished, format!("transfers stalled after {STALL:?}"));
    checks.expect(total == 200, format!("total is {total}, expected 200"));
    Ok(())
}

/// (g) A count-down latch: two tasks wait until three workers have counted it down.
async fn latch(locks: &LockClient, checks: &mut Checks) -> DemoResult<()> {
    const STALL: Duration = Duration::from_secs(10);
    let ready = locks.count_down_latch("workers-ready")?;
    let set = ready.try_set_count(3).await?;
    let mut waiting = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let ready = ready.clone();
        waiting.spawn(async move {
            ready.wait().await?;
            DemoResult::Ok(())
        });
    }
    let mut counts = Vec::new();
    for _ in 0..3 {
        counts.push(ready.count_down().await?);
    }
    let woken = finished_within(&mut waiting, STALL).await?;
    println!(
        "(g) a CountDownLatch set to 3 (set: {set}), counted down to {counts:?}: the 2 waiting \
         tasks returned: {woken}"
    );
    checks.expect(
        set && counts == [2, 1, 0],
        format!("latch counts {counts:?}"),
    );
    checks.expect(
        woken,
        format!("latch waiters still waiting after {STALL:?}"),
    );
    Ok(())
}

/// (h) A semaphore with 2 permits: 6 tasks, never more than 2 inside; the inspection of it
/// while 2 permits are held shows them and the waiters.
async fn semaphore(locks: &LockClient, checks: &mut Checks) -> DemoResult<()> {
    const TASKS: usize = 6;
    const STALL: Duration = Duration::from_secs(10);
    let pool = locks.semaphore("db-pool", 2)?;
    let held = [pool.acquire().await?, pool.acquire().await?];
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut users = tokio::task::JoinSet::new();
    let queued_before = locks.stats().queued_in_redis;
    for _ in 0..TASKS {
        let (pool, inside, most) = (pool.clone(), inside.clone(), most.clone());
        users.spawn(async move {
            let permit = pool.acquire().await?;
            let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            permit.unlock().await?;
            DemoResult::Ok(())
        });
    }
    let queued = tokio::time::timeout(STALL, async {
        while locks.stats().queued_in_redis < queued_before + TASKS {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .is_ok();
    let report = locks.inspect(LockKind::Semaphore, "db-pool").await?;
    drop(held);
    let finished = finished_within(&mut users, STALL).await?;
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "(h) a Semaphore with 2 permits: inspect saw {} held, {} queued; the {TASKS} tasks \
         finished: {finished}, at most {most} inside at once",
        report.held, report.queued
    );
    checks.expect(
        queued && report.held == 2 && report.queued == TASKS as u64,
        format!("semaphore inspection {report:?}"),
    );
    checks.expect(finished, format!("semaphore users stalled after {STALL:?}"));
    checks.expect(most <= 2, format!("{most} permit holders at once"));
    Ok(())
}

/// (b) Re-entry: a handle bound to one owner takes the lock twice.
async fn reentry(locks: &LockClient, checks: &mut Checks) -> DemoResult<()> {
    let owner = Owner::new();
    let mutex = locks.mutex("reentrant")?.with_owner(&owner);
    let mut counts = Vec::new();

    let outer = mutex.lock().await?;
    counts.push(mutex.state().await?.hold_count);
    let inner = mutex.lock().await?; // same owner: re-enters instead of waiting
    counts.push(mutex.state().await?.hold_count);
    let same_token = outer.fencing_token() == inner.fencing_token();
    inner.unlock().await?;
    counts.push(mutex.state().await?.hold_count);
    outer.unlock().await?;
    let state = mutex.state().await?;
    counts.push(state.hold_count);

    let shown: Vec<String> = counts.iter().map(u64::to_string).collect();
    println!(
        "(b) re-entry with one Owner: hold count {} (token kept across re-entry: {same_token}, \
         locked at the end: {})",
        shown.join(" -> "),
        state.locked
    );
    checks.expect(
        counts == [1, 2, 1, 0] && !state.locked,
        format!("hold counts {counts:?}, expected [1, 2, 1, 0] and unlocked"),
    );
    checks.expect(same_token, "re-entry changed the fencing token".into());
    Ok(())
}

/// (c) Fencing tokens: strictly increasing per lock name, also across `force_unlock`.
async fn fencing(locks: &LockClient, checks: &mut Checks) -> DemoResult<()> {
    let mutex = locks.mutex("fenced")?;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = mutex.lock().await?;
        tokens.push(guard.fencing_token());
        guard.unlock().await?;
    }

    // An administrator frees the lock under a holder's feet; the next holder gets a higher token.
    let stale = mutex.lock().await?;
    tokens.push(stale.fencing_token());
    let removed = mutex.force_unlock().await?;
    let fresh = mutex.lock().await?;
    tokens.push(fresh.fencing_token());
    // The evicted guard cannot release the new holder's lock.
    let stale_unlock = match stale.unlock().await {
        Ok(()) => "Ok (unexpected)".to_owned(),
        Err(err) => err.to_string(),
    };
    let still_held = mutex.state().await?.fencing_token == Some(fresh.fencing_token());
    fresh.unlock().await?;

    let shown: Vec<String> = tokens.iter().map(u64::to_string).collect();
    println!(
        "(c) fencing tokens: {} (the last one after force_unlock = {removed})",
        shown.join(" < ")
    );
    println!("    the evicted guard's unlock: {stale_unlock}; new holder untouched: {still_held}");
    let increasing = tokens.windows(2).all(|pair| pair[0] < pair[1]);
    checks.expect(increasing, format!("tokens not increasing: {tokens:?}"));
    checks.expect(removed, "force_unlock removed nothing".into());
    checks.expect(
        still_held,
        "the stale unlock disturbed the new holder".into(),
    );
    Ok(())
}

/// (d) Lease lost: the hold's key disappears; the watchdog notices at its next renewal.
async fn lease_lost(locks: &LockClient, prefix: &str, checks: &mut Checks) -> DemoResult<()> {
    let name = "fragile";
    // A short watchdog lease, renewed every 300 ms, so the loss is noticed quickly.
    let mutex = locks
        .mutex(name)?
        .with_lease(Lease::watchdog(Duration::from_millis(900)))?;
    let guard = mutex.lock().await?;
    let key = format!("{{{prefix}:0}}:mutex:{name}");
    let deleted: u64 = locks.redis().del(&key).await?;
    let since = Instant::now();
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.lost()).await;
    match cause {
        Ok(cause) => {
            println!(
                "(d) deleted {key} ({deleted} key) behind the guard's back: lost() -> {cause:?} \
                 after {:.2} s",
                since.elapsed().as_secs_f64()
            );
            checks.expect(
                cause == LostCause::KeyDeleted,
                format!("lost() gave {cause:?}, expected KeyDeleted"),
            );
        }
        Err(_) => checks.expect(false, "lost() did not resolve within 10 s".into()),
    }
    drop(guard); // releasing a hold that is gone is harmless
    Ok(())
}

/// (e) A waiter woken by push: unlock → the waiter's acquisition, measured a few times.
async fn push_wakeup(locks: &LockClient, checks: &mut Checks) -> DemoResult<()> {
    const ROUNDS: usize = 5;
    let mutex = locks.mutex("handoff")?;
    let mut gaps = Vec::new();
    let mut clients = None;
    for _ in 0..ROUNDS {
        let holder = mutex.lock().await?;
        let waiter = {
            let mutex = mutex.clone();
            tokio::spawn(async move {
                let guard = mutex.lock().await?;
                let acquired = Instant::now();
                guard.unlock().await?;
                DemoResult::Ok(acquired)
            })
        };
        // Let the waiter try once, fail and go to sleep on its local queue.
        while locks.stats().waiting == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if clients.is_none() {
            clients = connected_clients(locks).await;
        }
        let unlocked = Instant::now();
        holder.unlock().await?;
        let acquired = waiter.await??;
        gaps.push(acquired.saturating_duration_since(unlocked));
    }

    gaps.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "(e) unlock -> waiter acquired (lease 30 s, so only a push can explain it): \
         median {:.2} ms, max {:.2} ms over {ROUNDS} hand-offs",
        ms(gaps[ROUNDS / 2]),
        ms(gaps[ROUNDS - 1]),
    );
    match clients {
        Some(count) => println!(
            "    INFO clients while a task waited: connected_clients = {count} \
             (this client uses 2: commands + notifier)"
        ),
        None => println!("    (INFO clients unavailable)"),
    }
    checks.expect(gaps.len() == ROUNDS, "missing hand-offs".into());
    Ok(())
}

/// `connected_clients` from `INFO clients`, if the server answers it.
async fn connected_clients(locks: &LockClient) -> Option<u64> {
    let info: String = locks.redis().info(Some(InfoKind::Clients)).await.ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|value| value.trim().parse().ok())
}
