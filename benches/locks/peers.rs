//! The locks measured: fredlock's, and the peers a fred user would otherwise reach for.
//!
//! * **naive**: the loop a fred user writes by hand: `SET name token NX PX <lease>` retried
//!   every 10 ms, release by a compare-and-delete Lua script through `EVALSHA`, on the same fred
//!   client that runs the critical section.
//! * **rslock** 0.10 with its defaults (`LockManager::acquire`: up to 3 `SET NX PX` tries, a
//!   random 0–200 ms pause between them, repeated until acquired; release by a script), on a
//!   `redis` crate connection of its own.
//!
//! Both peers hold a fixed 10 s lease: the critical sections last microseconds.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fred::types::{Expiration, SetOptions};
use fredlock::{LockClient, LockGuard, NotificationMode};

use crate::redis::{connect_with, plain_client, shutdown};
use crate::ring::Ring;
use crate::workers::say;

/// How long the naive loop sleeps between two `SET NX` tries.
pub const NAIVE_RETRY: Duration = Duration::from_millis(10);
/// The peers' lease.
pub const PEER_LEASE: Duration = Duration::from_secs(10);
/// Deletes the key only if it still holds the caller's token.
const COMPARE_AND_DELETE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
     return redis.call('del', KEYS[1]) else return 0 end";

/// Which lock a task takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Mutex,
    Fair,
    /// The write side of an `RwLock` (its read side too in the rw mix).
    RwLock,
    Naive,
    Rslock,
    /// Not a lock: the FIFO floor of S7 (`crate::ring`).
    Ring,
}

impl LockKind {
    pub const ALL: [LockKind; 6] = [
        LockKind::Mutex,
        LockKind::Fair,
        LockKind::RwLock,
        LockKind::Naive,
        LockKind::Rslock,
        LockKind::Ring,
    ];
    pub const PEERS: [LockKind; 2] = [LockKind::Naive, LockKind::Rslock];

    pub fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair",
            LockKind::RwLock => "rwlock",
            LockKind::Naive => "naive",
            LockKind::Rslock => "rslock",
            LockKind::Ring => "ring",
        }
    }

    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            LockKind::Mutex => "fredlock Mutex",
            LockKind::Fair => "fredlock FairMutex",
            LockKind::RwLock => "fredlock RwLock (write)",
            LockKind::Naive => "naive SET NX PX (10 ms)",
            LockKind::Rslock => "rslock 0.10",
            LockKind::Ring => "FIFO floor: token ring",
        }
    }

    pub fn parse(text: &str) -> Result<LockKind, String> {
        LockKind::ALL
            .into_iter()
            .find(|kind| kind.name() == text)
            .ok_or_else(|| format!("unknown lock kind {text:?}"))
    }

    pub fn is_peer(self) -> bool {
        LockKind::PEERS.contains(&self)
    }

    /// Whether it runs once per run rather than once per notification mode: the peers and the
    /// FIFO floor, which use no fredlock client.
    pub fn runs_once(self) -> bool {
        self.is_peer() || self == LockKind::Ring
    }
}

/// A key of the peers under the run's prefix, so that the cleanup finds it.
fn peer_key(prefix: &str, kind: LockKind, name: &str) -> String {
    format!("{{{prefix}:bench}}:{}:{name}", kind.name())
}

/// The hand-written `SET NX PX` lock.
#[derive(Clone)]
pub struct Naive {
    client: Client,
    key: String,
    sha: String,
}

impl Naive {
    /// The naive lock `name` of the run's `prefix`, on `client`.
    pub async fn on(client: &Client, prefix: &str, name: &str) -> Result<Naive, String> {
        Naive::new(client.clone(), peer_key(prefix, LockKind::Naive, name)).await
    }

    async fn new(client: Client, key: String) -> Result<Naive, String> {
        let sha: String = client
            .script_load(COMPARE_AND_DELETE)
            .await
            .map_err(|err| format!("SCRIPT LOAD failed: {err}"))?;
        Ok(Naive { client, key, sha })
    }

    /// Retries `SET NX PX` every [`NAIVE_RETRY`] until it succeeds; returns the token.
    pub async fn lock(&self) -> Result<String, String> {
        let token = format!("{:032x}", fastrand::u128(..));
        let lease = Expiration::PX(PEER_LEASE.as_millis() as i64);
        loop {
            let set: Option<String> = self
                .client
                .set(
                    self.key.as_str(),
                    token.as_str(),
                    Some(lease.clone()),
                    Some(SetOptions::NX),
                    false,
                )
                .await
                .map_err(|err| format!("SET NX failed: {err}"))?;
            if set.is_some() {
                return Ok(token);
            }
            tokio::time::sleep(NAIVE_RETRY).await;
        }
    }

    pub async fn unlock(&self, token: &str) -> Result<(), String> {
        let deleted: i64 = self
            .client
            .evalsha(self.sha.as_str(), self.key.as_str(), token)
            .await
            .map_err(|err| format!("EVALSHA failed: {err}"))?;
        match deleted {
            1 => Ok(()),
            _ => Err("the lock was no longer ours".into()),
        }
    }
}

/// rslock's `LockManager` with its defaults, on one lock name.
#[derive(Clone)]
pub struct Rslock {
    manager: rslock::LockManager,
    key: String,
}

impl Rslock {
    /// The rslock lock `name` of the run's `prefix`, through `manager`.
    pub fn on(manager: &rslock::LockManager, prefix: &str, name: &str) -> Rslock {
        Rslock {
            manager: manager.clone(),
            key: peer_key(prefix, LockKind::Rslock, name),
        }
    }

    pub async fn lock(&self) -> Result<rslock::Lock, String> {
        self.manager
            .acquire_no_guard(self.key.as_bytes(), PEER_LEASE)
            .await
            .map_err(|err| format!("rslock: {err}"))
    }

    /// rslock's release is best effort: it reports nothing.
    pub async fn unlock(&self, lock: rslock::Lock) {
        self.manager.unlock(&lock).await;
    }
}

/// A lock of any kind, ready to be taken.
#[derive(Clone)]
pub enum AnyLock {
    Exclusive(fredlock::Mutex),
    Rw(fredlock::RwLock),
    Naive(Naive),
    Rslock(Rslock),
    Ring(Ring),
}

/// A hold of an [`AnyLock`].
pub enum AnyGuard {
    Fred(LockGuard),
    Naive(Naive, String),
    Rslock(Rslock, rslock::Lock),
    Ring(Ring),
}

impl AnyLock {
    /// Waits for the lock: a shared hold when `read` (an `RwLock`; others ignore it).
    pub async fn lock(&self, read: bool) -> Result<AnyGuard, String> {
        let fred = match (self, read) {
            (AnyLock::Exclusive(mutex), _) => mutex.lock().await.map(LockGuard::from),
            (AnyLock::Rw(rw), true) => rw.read().await.map(LockGuard::from),
            (AnyLock::Rw(rw), false) => rw.write().await.map(LockGuard::from),
            (AnyLock::Naive(naive), _) => {
                return Ok(AnyGuard::Naive(naive.clone(), naive.lock().await?))
            }
            (AnyLock::Rslock(rslock), _) => {
                return Ok(AnyGuard::Rslock(rslock.clone(), rslock.lock().await?))
            }
            (AnyLock::Ring(ring), _) => {
                ring.lock().await?;
                return Ok(AnyGuard::Ring(ring.clone()));
            }
        };
        fred.map(AnyGuard::Fred).map_err(|err| err.to_string())
    }

    /// The lock as task `task` of this process takes it: itself, but for the ring, where each
    /// task has a turn of its own.
    pub fn for_task(&self, task: usize) -> AnyLock {
        match self {
            AnyLock::Ring(ring) => AnyLock::Ring(ring.for_task(task)),
            other => other.clone(),
        }
    }
}

impl AnyGuard {
    pub async fn unlock(self) -> Result<(), String> {
        match self {
            AnyGuard::Fred(guard) => guard.unlock().await.map_err(|err| err.to_string()),
            AnyGuard::Naive(naive, token) => naive.unlock(&token).await,
            AnyGuard::Rslock(rslock, lock) => {
                rslock.unlock(lock).await;
                Ok(())
            }
            AnyGuard::Ring(ring) => ring.unlock().await,
        }
    }
}

/// What one process needs to take locks of the kinds it was given: a fredlock client when a
/// fredlock kind is among them, a plain fred client (the peers' and the critical section's
/// commands), and an rslock manager (it connects on first use).
pub struct Side {
    url: String,
    prefix: String,
    pub locks: Option<LockClient>,
    plain: Client,
    rslock: rslock::LockManager,
}

impl Side {
    pub async fn open(
        url: &str,
        mode: NotificationMode,
        prefix: &str,
        shards: u16,
        with_fredlock: bool,
    ) -> Result<Side, String> {
        let locks = match with_fredlock {
            true => Some(connect_with(url, mode, prefix, shards).await?),
            false => None,
        };
        let plain = match &locks {
            Some(locks) => locks.redis().clone(),
            None => plain_client(url).await?,
        };
        Ok(Side {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
            locks,
            plain,
            rslock: rslock::LockManager::new(vec![url.to_owned()]),
        })
    }

    /// The fred client of the critical sections (the fredlock client's own when there is one).
    pub fn redis(&self) -> &Client {
        &self.plain
    }

    pub async fn lock(&self, kind: LockKind, name: &str) -> Result<AnyLock, String> {
        let fred = || {
            self.locks
                .as_ref()
                .ok_or_else(|| format!("{}: no fredlock client", self.url))
        };
        let err = |err: fredlock::Error| err.to_string();
        Ok(match kind {
            LockKind::Mutex => AnyLock::Exclusive(fred()?.mutex(name).map_err(err)?),
            LockKind::Fair => AnyLock::Exclusive(fred()?.fair_mutex(name).map_err(err)?.into()),
            LockKind::RwLock => AnyLock::Rw(fred()?.rwlock(name).map_err(err)?),
            LockKind::Naive => AnyLock::Naive(Naive::on(&self.plain, &self.prefix, name).await?),
            LockKind::Rslock => AnyLock::Rslock(Rslock::on(&self.rslock, &self.prefix, name)),
            LockKind::Ring => return Err("the ring is joined with Side::ring".into()),
        })
    }

    /// Joins the FIFO floor's ring `name` as process `process` of `processes` with `tasks`
    /// tasks each (see [`crate::ring`]).
    pub async fn ring(
        &self,
        name: &str,
        process: usize,
        processes: usize,
        tasks: usize,
    ) -> Result<AnyLock, String> {
        let channel = format!("{}:turn:", peer_key(&self.prefix, LockKind::Ring, name));
        let ring = Ring::join(
            &self.url,
            self.plain.clone(),
            channel,
            process,
            processes,
            tasks,
        );
        Ok(AnyLock::Ring(ring.await?))
    }

    /// Worker side: checks the connection with a PING, then tells the parent `READY`.
    pub async fn ready(&self) -> Result<(), String> {
        let _: String = self
            .plain
            .ping(None)
            .await
            .map_err(|err| format!("PING failed: {err}"))?;
        say("READY")
    }

    /// Wakeups the fredlock client delivered (0 for the peers).
    pub fn wakeups(&self) -> u64 {
        self.locks.as_ref().map_or(0, |locks| locks.stats().wakeups)
    }

    pub async fn shutdown(self) -> Result<(), String> {
        match &self.locks {
            Some(locks) => shutdown(locks).await,
            None => {
                let _ = self.plain.quit().await;
                Ok(())
            }
        }
    }
}
