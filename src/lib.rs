//! # fredlock
//!
//! Redis-backed distributed locks for services built on [fred](https://docs.rs/fred) and
//! tokio: the Redisson lock family, with waiters woken by push instead of polling.
//!
//! ```no_run
//! use std::time::Duration;
//! use fredlock::{Config, LockClient};
//!
//! # async fn run() -> fredlock::Result<()> {
//! let locks = LockClient::connect(Config::new("redis://127.0.0.1:6379")).await?;
//! let orders = locks.mutex("orders")?;
//!
//! let guard = orders.lock().await?;                 // waits, woken by a release event
//! let token = guard.fencing_token();                // hand it to the resource you protect
//! // ... critical section; `guard.lost()` tells you if the lease could not be kept ...
//! guard.unlock().await?;                            // or just drop the guard
//!
//! if let Some(guard) = orders.lock_timeout(Duration::from_secs(2)).await? {
//!     drop(guard);
//! }
//! locks.shutdown().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! ## Which lock
//!
//! * [`Mutex`] ([`LockClient::mutex`]): exclusive, reentrant per [`Owner`], barging. The
//!   default choice: fastest hand-off.
//! * [`FairMutex`] ([`LockClient::fair_mutex`]): the same, but strictly first-come,
//!   first-served across all processes, with dead waiters evicted within a waiter lease.
//! * [`RwLock`] ([`LockClient::rwlock`]): many readers or one writer; once a writer waits, new
//!   readers queue behind it; writers barge within a process as on a [`Mutex`] (bounded by
//!   the same limit); per-hold leases; downgrade, no upgrade.
//! * [`Redlock`]: one exclusive lock over N independent masters (quorum N/2+1), for when a
//!   single Redis is not trusted to keep a lock through a failover.
//! * [`MultiLock`]: several of the locks above taken all or nothing under one guard, in one
//!   order every process shares, so that two multi-locks over the same locks never deadlock.
//! * [`Semaphore`] ([`LockClient::semaphore`]): at most N holders at once, each permit held
//!   like a lock (its own lease, token, `lost()`, release on drop); FIFO, woken by push.
//! * [`CountDownLatch`] ([`LockClient::count_down_latch`]): not a lock: a count set once,
//!   counted down from anywhere; every task waiting for it wakes, by push, when it reaches 0.
//!
//! ## Who holds what
//!
//! [`LockClient::inspect`] reads one lock's holders and waiters, [`LockClient::list`] every
//! lock under the key prefix; an [`Inspector`] does both for a tool without writing anything,
//! and the `fredlock` binary (feature `cli`) prints them.
//!
//! ## Guarantees
//!
//! * **Mutual exclusion** while leases hold: every hold has a lease in Redis; the watchdog
//!   renews it every third of the lease while the guard lives ([`Lease`]).
//! * **Fencing tokens**: every hold carries a token strictly greater than every earlier hold of
//!   the same lock name ([`LockGuard::fencing_token`]). Leases cannot protect against a holder
//!   that pauses longer than its lease; tokens checked by the resource can.
//! * **Lease-lost signal**: [`LockGuard::lost`] resolves with a [`LostCause`] when the hold can
//!   no longer be guaranteed.
//! * **Push wakeups, no lost wakeups**: releases emit an event in the same script that frees
//!   the lock; one reader per process wakes local waiters. Every wait is also bounded by the
//!   holder's remaining lease, and reconnects or gaps make every waiter re-check.
//! * **Cancellation safety**: dropping an acquire future leaves no trace and releases a hold
//!   its in-flight script obtained.
//! * **Bounded connections**: a fixed number per client (2 on a single Redis or Sentinel; see
//!   [`LockClient`] for clusters), whatever the number of waiters and locks.
//!
//! See `docs/design.md` for the data layout, the scripts, the notification protocol and the
//! failure behaviour.

#![warn(missing_docs, missing_debug_implementations)]

mod client;
mod config;
mod context;
mod engine;
mod error;
mod keys;
mod layout;
mod lease;
mod lock;
mod notify;
mod owner;
mod queue;
mod scripts;
mod watch;

/// The [fred](https://docs.rs/fred) crate, in the version fredlock is built with: use it to
/// name the types of [`LockClient::redis`] or to build the client given to
/// [`LockClient::from_client`], so that they match this crate's without a second `fred`
/// dependency to keep in step.
pub use fred;

pub use client::{ClientStats, LockClient};
pub use config::{Config, NotificationMode, MAX_DURATION, MIN_LEASE};
pub use error::{Error, NotHeldReason, Result};
pub use keys::MAX_NAME_LEN;
pub use lease::{Lease, LostCause};
pub use lock::guard::{FairMutexGuard, LockGuard, MutexGuard, PermitGuard, ReadGuard, WriteGuard};
pub use lock::inspect::{HoldSide, Holder, Inspector, LockKind, LockReport, Waiter, INSPECT_LIMIT};
pub use lock::latch::CountDownLatch;
pub use lock::multi::{MultiLock, MultiLockGuard, MultiMember};
pub use lock::mutex::{FairMutex, Mutex};
pub use lock::redlock::{Redlock, RedlockGuard};
pub use lock::rwlock::{RwLock, RwLockState};
pub use lock::semaphore::{Semaphore, SemaphoreState};
pub use lock::LockState;
pub use owner::Owner;
