//! The smallest useful fredlock program.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart
//! ```

use std::time::Duration;

use fredlock::{Config, LockClient};

#[tokio::main]
async fn main() -> fredlock::Result<()> {
    // One client per process: it opens two connections (commands + the event reader) and
    // starts the background tasks (event reader, watchdog, release worker).
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = LockClient::connect(Config::new(url)).await?;

    // A lock handle is cheap (no Redis call); clone it freely.
    let orders = locks.mutex("orders")?;

    // Wait as long as it takes. The guard keeps the lock: a watchdog renews its 30 s lease
    // every 10 s for as long as the guard lives.
    let guard = orders.lock().await?;

    // The fencing token is larger than that of every earlier holder of "orders". Send it along
    // with your writes so that the resource can refuse a late write from an older holder.
    let token = guard.fencing_token();
    println!("holding {:?} with fencing token {token}", guard.name());

    // Race the critical section against the lease-lost signal: if the lock can no longer be
    // guaranteed (Redis unreachable, key deleted, lease ran out), stop working on the resource.
    tokio::select! {
        cause = guard.lost() => eprintln!("lost the lock ({cause:?}); abandoning the work"),
        () = write_orders(token) => println!("work done"),
    }

    // Release explicitly to see errors (for example when the lease had expired). Dropping the
    // guard releases too, in the background.
    guard.unlock().await?;

    // Wait at most two seconds: `None` means somebody else kept the lock all that time.
    match orders.lock_timeout(Duration::from_secs(2)).await? {
        Some(guard) => {
            println!("got it again, token {}", guard.fencing_token());
            guard.unlock().await?;
        }
        None => println!("still busy after 2 s"),
    }

    // Releases any holds that are left, stops the background tasks, closes the connections.
    locks.shutdown().await?;
    Ok(())
}

/// Stands for the protected work, e.g. a database write that carries the fencing token.
async fn write_orders(token: u64) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    println!("wrote orders with fencing token {token}");
}
