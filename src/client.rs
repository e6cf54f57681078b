//! [`LockClient`]: connections, background tasks and lock handles.
//!
//! A client owns exactly:
//!
//! * the **command client** (a fred `Client`; or the service's own, see
//!   [`LockClient::from_client`]) for every script call;
//! * the **notifier client(s)**, dedicated to the event readers (a blocking `XREAD` or a
//!   subscription would stall anything multiplexed behind it): one, except in Stream mode on a
//!   Redis Cluster, where one `XREAD` can only read one slot, so each shard gets its own;
//! * the tasks: the event reader(s), the watchdog, the waiter heartbeat and the release worker.
//!
//! Connections, whatever the number of waiting tasks and locks: standalone and Sentinel 2;
//! cluster `masters × 2` in Pub/Sub mode and `masters × (1 + shards)` in Stream mode (fred
//! connects a cluster client to every master).
//! Every lock handle and guard keeps the client alive; when the last one is dropped the tasks
//! stop by themselves. [`LockClient::shutdown`] does the same on demand and releases every
//! hold first.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, PerformanceConfig, ReconnectPolicy,
};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, NotificationMode};
use crate::context::Context;
use crate::engine::{Core, Engine};
use crate::error::{Error, Result};
use crate::keys::Keyspace;
use crate::layout::{recorded_layout, Layout};
use crate::lock::inspect::{self, Inspector, LockKind, LockReport};
use crate::lock::latch::CountDownLatch;
use crate::lock::mutex::{FairMutex, Mutex};
use crate::lock::redlock::Redlock;
use crate::lock::rwlock::RwLock;
use crate::lock::semaphore::Semaphore;
use crate::notify::{hang_up, pubsub, stream, Reader, WaiterTable};

/// A `maxmemory-policy` of the `allkeys-*` family lets Redis evict any key under memory
/// pressure, held locks included, which no lease can guard against: say so at connect
/// (`noeviction` refuses writes instead, and the `volatile-*` policies evict keys with a TTL,
/// which every lock key has, but only after keys that were touched longer ago). Read from
/// `INFO memory` (which a client needs anyway), not `CONFIG`, which ACLs often deny.
async fn warn_if_locks_may_be_evicted(redis: &Client) {
    let Ok(info) = redis
        .info::<String>(Some(fred::types::InfoKind::Memory))
        .await
    else {
        return;
    };
    let policy = info
        .lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(str::trim);
    if let Some(policy) = policy.filter(|p| p.starts_with("allkeys")) {
        tracing::warn!(
            policy,
            "maxmemory-policy lets Redis evict any key, held locks included; use noeviction"
        );
    }
}

/// A connection to Redis for distributed locks: the factory of lock handles.
///
/// Cheap to clone (all clones share connections and tasks). See the [crate docs](crate) for
/// an overview.
#[derive(Clone)]
pub struct LockClient {
    /// The running client, which every lock handle and guard holds too (see [`Engine`]).
    engine: Arc<Engine>,
}

/// Opens the notifier connection(s). One client reads every shard, except in Stream mode on a
/// cluster: there one `XREAD` can only name keys of one slot, and a blocked read stalls its
/// connection, so every shard gets its own client.
async fn open_notifiers(command: &Client, config: &Config, clustered: bool) -> Result<Vec<Client>> {
    let count = if clustered && config.notification == NotificationMode::Stream {
        usize::from(config.shards)
    } else {
        1
    };
    let (perf, connection, policy) = fred_parts(config, 4096);
    let mut clients = Vec::with_capacity(count);
    for _ in 0..count {
        let client = Client::new(
            command.client_config(),
            Some(perf.clone()),
            Some(connection.clone()),
            Some(policy.clone()),
        );
        if let Err(err) = init_client(&client, config).await {
            for opened in &clients {
                hang_up(opened).await;
            }
            return Err(err);
        }
        clients.push(client);
    }
    Ok(clients)
}

/// The shards reader `index` of `readers` covers.
fn reader_shards(keyspace: &Keyspace, readers: usize, index: usize) -> Vec<u16> {
    (0..keyspace.event_shards())
        .filter(|shard| usize::from(*shard) % readers == index)
        .collect()
}

/// Builds fred's configuration from ours.
fn fred_parts(
    config: &Config,
    broadcast_capacity: usize,
) -> (PerformanceConfig, ConnectionConfig, ReconnectPolicy) {
    let perf = PerformanceConfig {
        default_command_timeout: config.command_timeout,
        broadcast_channel_capacity: broadcast_capacity,
        ..PerformanceConfig::default()
    };
    let connection = ConnectionConfig {
        connection_timeout: config.connect_timeout,
        internal_command_timeout: config.command_timeout,
        max_command_attempts: 3,
        ..ConnectionConfig::default()
    };
    let max_delay = config
        .reconnect_max_delay
        .as_millis()
        .min(u128::from(u32::MAX)) as u32;
    let policy = ReconnectPolicy::new_exponential(0, 20.min(max_delay), max_delay, 2);
    (perf, connection, policy)
}

/// Connects a fred client within the configured timeout.
async fn init_client(client: &Client, config: &Config) -> Result<()> {
    let connecting = client.init();
    match tokio::time::timeout(config.connect_timeout, connecting).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => {
            let _ = client.quit().await;
            Err(if Error::is_auth_refusal(&err) {
                Error::Auth(err)
            } else {
                Error::Connect(err)
            })
        }
        Err(_) => {
            let quitting = client.clone();
            tokio::spawn(async move {
                let _ = quitting.quit().await;
            });
            Err(Error::Connect(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                format!(
                    "no connection to {} within {:?}",
                    config.redacted_url(),
                    config.connect_timeout
                ),
            )))
        }
    }
}

/// A command connection to `config.url`, with `config`'s shard count and notification mode
/// replaced by those recorded under its key prefix (see [`LockClient::connect_as_recorded`]):
/// one `GET`, nothing written. The connection is closed again on every failure.
async fn recorded_connection(config: &mut Config) -> Result<Client> {
    config.validate()?;
    let fred_config = FredConfig::from_url(&config.url)
        .map_err(|err| Error::InvalidConfig(format!("bad url {}: {err}", config.redacted_url())))?;
    let (perf, connection, policy) = fred_parts(config, 32);
    let command = Client::new(fred_config, Some(perf), Some(connection), Some(policy));
    init_client(&command, config).await?;
    match adopt_recorded_layout(&command, config).await {
        Ok(()) => Ok(command),
        Err(err) => {
            let _ = command.quit().await;
            Err(err)
        }
    }
}

/// Reads the layout record under `config.key_prefix` and applies it to `config` (validated
/// again: a record is data, and a damaged one must not open thousands of connections).
async fn adopt_recorded_layout(command: &Client, config: &mut Config) -> Result<()> {
    let key = Keyspace::new(&config.key_prefix, 1, command.is_clustered()).layout();
    let recorded: Option<String> = command
        .get(key.as_str())
        .await
        .map_err(|err| Error::from_redis(err, "(layout)", &key))?;
    let Some(text) = recorded else {
        return Err(Error::NoLayout(config.key_prefix.clone()));
    };
    let Some((shards, notification)) = recorded_layout(&text) else {
        let ours = Layout::new(
            config,
            &Keyspace::new(&config.key_prefix, config.shards, false),
        );
        return Err(Error::LayoutMismatch {
            prefix: config.key_prefix.clone(),
            server: text,
            ours: ours.text().to_owned(),
        });
    };
    config.shards = shards;
    config.notification = notification;
    config.validate()
}

impl Inspector {
    /// Connects to `config.url` with one command connection and takes the layout recorded
    /// under `config.key_prefix` (see [`LockClient::connect_as_recorded`]); nothing else is
    /// started and nothing is written. Fails with [`Error::NoLayout`] when no client has used
    /// the prefix on this server.
    pub async fn connect(mut config: Config) -> Result<Inspector> {
        let command = recorded_connection(&mut config).await?;
        let clustered = command.is_clustered();
        let keyspace = Keyspace::new(&config.key_prefix, config.shards, clustered);
        let layout = Layout::new(&config, &keyspace);
        let sharded_pubsub = clustered && command.server_version().map_or(true, |v| v.major >= 7);
        let nomkstream = command
            .server_version()
            .is_some_and(|v| (v.major, v.minor) >= (6, 2));
        let ctx = Context::new(
            command,
            config,
            keyspace,
            layout,
            sharded_pubsub,
            nomkstream,
            // No inbox: an inspector never waits.
            "".into(),
        );
        Ok(Inspector { ctx })
    }
}

impl LockClient {
    /// Connects to `config.url` and starts the notifier, watchdog and release worker.
    ///
    /// Fails with a typed error within `config.connect_timeout` when Redis is unreachable
    /// ([`Error::Connect`]), refuses the credentials ([`Error::Auth`]), or already hosts a
    /// different layout under the same prefix ([`Error::LayoutMismatch`]).
    pub async fn connect(config: Config) -> Result<LockClient> {
        config.validate()?;
        let fred_config = FredConfig::from_url(&config.url).map_err(|err| {
            Error::InvalidConfig(format!("bad url {}: {err}", config.redacted_url()))
        })?;
        let (perf, connection, policy) = fred_parts(&config, 32);
        let command = Client::new(fred_config, Some(perf), Some(connection), Some(policy));
        init_client(&command, &config).await?;
        Self::start(command, true, config).await
    }

    /// Connects like [`connect`](LockClient::connect), but with the shard count and the
    /// notification mode recorded in Redis under `config.key_prefix` by the clients that use
    /// it, whatever `config` says: for tools that act on other processes' locks (the
    /// `fredlock force-unlock` command). Like any client it keeps the record and its own marker
    /// key; to only read, use an [`Inspector`]. Fails with [`Error::NoLayout`] when nothing is
    /// recorded there, and with [`Error::LayoutMismatch`] when the record is not one this
    /// version reads.
    pub async fn connect_as_recorded(mut config: Config) -> Result<LockClient> {
        let command = recorded_connection(&mut config).await?;
        Self::start(command, true, config).await
    }

    /// Uses a fred client the service already has for commands (it must be connected). The
    /// notifier still opens its own connection with the same settings, because a blocking read
    /// must not stall the service's commands. `config.url` is ignored. Shutdown leaves the
    /// given client connected.
    pub async fn from_client(client: Client, config: Config) -> Result<LockClient> {
        config.validate()?;
        Self::start(client, false, config).await
    }

    async fn start(command: Client, owns_command: bool, config: Config) -> Result<LockClient> {
        // Built here, not by the first lock call: services of many processes start together
        // and take their first locks together, when a few ms of CPU in each would starve the
        // server they all wait on.
        crate::scripts::prepare();
        let clustered = command.is_clustered();
        // Sharded Pub/Sub (SPUBLISH/SSUBSCRIBE) exists from Redis 7 on; an older cluster
        // broadcasts plain PUBLISH messages to every node, which works too (at more traffic).
        let sharded_pubsub = clustered && command.server_version().map_or(true, |v| v.major >= 7);
        let nomkstream = command
            .server_version()
            .is_some_and(|v| (v.major, v.minor) >= (6, 2));
        let keyspace = Keyspace::new(&config.key_prefix, config.shards, clustered);
        let layout = Layout::new(&config, &keyspace);
        let started = async {
            layout.verify(&command).await?;
            warn_if_locks_may_be_evicted(&command).await;
            let notifiers = open_notifiers(&command, &config, clustered).await?;
            Ok::<_, Error>(notifiers)
        };
        let notifiers = match started.await {
            Ok(notifiers) => notifiers,
            Err(err) => {
                if owns_command {
                    let _ = command.quit().await;
                }
                return Err(err);
            }
        };

        let waiters = WaiterTable::new();
        let inbox_tag: Arc<str> = uuid::Uuid::new_v4().simple().to_string()[..16].into();
        let ctx = Arc::new(Context::new(
            command,
            config.clone(),
            keyspace.clone(),
            layout,
            sharded_pubsub,
            nomkstream,
            inbox_tag.clone(),
        ));
        let core = Core::new(ctx.clone(), waiters.clone());
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let readers = notifiers.iter().enumerate().map(|(i, client)| Reader {
            client: client.clone(),
            keyspace: keyspace.clone(),
            shards: reader_shards(&keyspace, notifiers.len(), i),
            sharded_pubsub,
            inbox_tag: inbox_tag.clone(),
            waiters: waiters.clone(),
            config: config.clone(),
            shutdown: shutdown_rx.clone(),
        });
        let mut tasks = Vec::new();
        for reader in readers {
            let task = match config.notification {
                NotificationMode::Stream => stream::start(reader).await,
                NotificationMode::PubSub => pubsub::start(reader).await,
            };
            match task {
                Ok(task) => tasks.push(task),
                Err(err) => {
                    shutdown_tx.send_replace(true);
                    for notifier in &notifiers {
                        hang_up(notifier).await;
                    }
                    if owns_command {
                        let _ = ctx.redis.quit().await;
                    }
                    return Err(err);
                }
            }
        }
        let (release_tx, release_rx) = mpsc::unbounded_channel();
        tasks.extend(core.start_tasks(release_rx, shutdown_rx));
        tracing::info!(
            url = %config.redacted_url(),
            mode = config.notification.as_str(),
            shards = config.shards,
            clustered,
            notifier_clients = notifiers.len(),
            "lock client started"
        );
        Ok(LockClient {
            engine: Engine::new(
                core,
                notifiers,
                owns_command,
                release_tx,
                shutdown_tx,
                tasks,
            ),
        })
    }

    /// An exclusive reentrant lock handle, barging (see [`Mutex`]). Validates the name
    /// (non-empty, at most [`crate::MAX_NAME_LEN`] bytes); no Redis call.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Mutex::barging(self.engine.clone(), name)
    }

    /// A fair (strict FIFO across processes) exclusive reentrant lock handle (see
    /// [`FairMutex`]). A fair lock and a barging lock of the same name are different locks.
    /// Validates the name; no Redis call.
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        FairMutex::new(self.engine.clone(), name)
    }

    /// A read-write lock handle (see [`RwLock`]). Validates the name; no Redis call.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.engine.clone(), name)
    }

    /// A semaphore handle with `permits` permits (see [`Semaphore`]); every user of one name
    /// must give the same count. Validates the name and the count; no Redis call.
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.engine.clone(), name, permits)
    }

    /// A count-down latch handle (see [`CountDownLatch`]). Validates the name; no Redis call.
    pub fn count_down_latch(&self, name: &str) -> Result<CountDownLatch> {
        CountDownLatch::new(self.engine.clone(), name)
    }

    /// One lock's holders and waiters, read in one atomic call without changing anything
    /// (see [`LockReport`]).
    pub async fn inspect(&self, kind: LockKind, name: &str) -> Result<LockReport> {
        inspect::inspect(&self.engine.ctx, kind, name).await
    }

    /// Every lock under this client's key prefix that has state in Redis, by kind and name,
    /// sorted. It `SCAN`s the whole keyspace (every master of a cluster): an operator's tool,
    /// not for a hot path.
    pub async fn list(&self) -> Result<Vec<(LockKind, String)>> {
        inspect::list(&self.engine.ctx).await
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.engine.ctx.config
    }

    /// The fred client used for commands.
    pub fn redis(&self) -> &Client {
        &self.engine.ctx.redis
    }

    /// Counters for monitoring and tests.
    pub fn stats(&self) -> ClientStats {
        let core = &self.engine;
        let ctx = &core.ctx;
        ClientStats {
            held: core.holds.len(),
            waiting: core.waiters.waiters(),
            waiting_locks: core.waiters.queues(),
            wakeups: core.waiters.wakeups(),
            orphaned_attempts: ctx.orphans.load(Ordering::Acquire),
            queued_in_redis: core.queued.len(),
            retried_attempts: ctx.retried_attempts.load(Ordering::Relaxed),
            attempts: ctx.attempts.load(Ordering::Relaxed),
            granted: ctx.granted.load(Ordering::Relaxed),
            handed_over: ctx.handed_over.load(Ordering::Relaxed),
            taken_over: ctx.taken_over.load(Ordering::Relaxed),
            deferred_lazily: ctx.deferred_lazily.load(Ordering::Relaxed),
            handed_locally: ctx.handed_locally.load(Ordering::Relaxed),
            deferred_releases: core.parked.len(),
            queued_behind: core.waiters.notices(),
            fast_paths: ctx.fast_paths.load(Ordering::Relaxed),
        }
    }

    /// Releases every hold, stops the tasks and closes the connections this client opened.
    /// Pending and later acquisitions fail with [`Error::Shutdown`]; guards still alive report
    /// [`LostCause::Shutdown`](crate::LostCause::Shutdown). Idempotent.
    pub async fn shutdown(&self) -> Result<()> {
        self.engine.shutdown().await
    }
}

/// Defined here rather than with the lock types: it takes the clients, and the lock types sit
/// below the client (they reach a client's state through its engine).
impl Redlock {
    /// A Redlock named `name` over the masters behind `clients` (one client per independent
    /// master; an odd number, 3 or 5, is usual). Validates the name; no Redis call.
    ///
    /// The same client given twice is refused ([`Error::InvalidConfig`]): its one server would
    /// answer both, under the same op id, and count as two votes towards the quorum. (Two
    /// clients of the same server cannot be told apart here: give each master one client.)
    pub fn new(clients: &[LockClient], name: &str) -> Result<Redlock> {
        for (at, client) in clients.iter().enumerate() {
            if clients[..at]
                .iter()
                .any(|earlier| Arc::ptr_eq(&earlier.engine, &client.engine))
            {
                return Err(Error::InvalidConfig(format!(
                    "Redlock {name:?}: client {at} is given twice (one client per master)"
                )));
            }
        }
        let engines = clients.iter().map(|c| c.engine.clone()).collect();
        Redlock::over(engines, name)
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("config", &self.engine.ctx.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A snapshot of a client's local state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Holds this client keeps (each possibly re-entered several times).
    pub held: usize,
    /// Acquisitions waiting in this process.
    pub waiting: usize,
    /// Locks with at least one local waiter.
    pub waiting_locks: usize,
    /// Wakeups delivered to local waiters since start.
    pub wakeups: u64,
    /// Acquire calls abandoned by their caller (dropped future) that are still being finished
    /// in the background; each releases the lock if its call obtained it.
    pub orphaned_attempts: usize,
    /// Waiters of this client that hold a place in a queue in Redis, which its heartbeat
    /// watches.
    pub queued_in_redis: usize,
    /// Acquire attempts repeated after a transient failure (see
    /// [`Config::transient_retry`](crate::Config::transient_retry)) since start.
    pub retried_attempts: u64,
    /// Acquire script calls made since start (`lock`, `try_lock`, `read`, `write`, ...).
    pub attempts: u64,
    /// Acquisitions of exclusive locks that a release granted directly, completed without a
    /// script call of their own, since start.
    pub granted: u64,
    /// Barging-mutex acquisitions that a release of this client handed over directly to a
    /// waiting task (see [`Config::handover_limit`](crate::Config::handover_limit)), since
    /// start.
    pub handed_over: u64,
    /// Acquisitions that took over a release this client had deferred, holding the lock by
    /// that release's own call (see [`Config::defer_release`](crate::Config::defer_release)),
    /// since start.
    pub taken_over: u64,
    /// Of the acquisitions counted in `handed_over` and `taken_over`, those handed a hold of
    /// this client without a call to Redis (see
    /// [`Config::local_handover`](crate::Config::local_handover)), since start.
    pub handed_locally: u64,
    /// Releases deferred right now, waiting for the releasing task to yield or a task of this
    /// client to take them over (not counting those an acquisition asked for already).
    pub deferred_releases: usize,
    /// Releases deferred *lazily* since start: releases of a loop (their hold was taken over
    /// from the task's own deferred release) that wait for the next acquisition of the loop
    /// without a release task of their own; the lock's turn timer releases one that nobody
    /// takes over by the end of its hand-over window (see
    /// [`Config::defer_release`](crate::Config::defer_release)).
    pub deferred_lazily: u64,
    /// Notices that the first waiter queued behind a hold of this client that nobody waited
    /// for when it began, since start: such a hold's release is deferred from then on, like
    /// that of a hold granted with waiters behind it (see
    /// [`Config::defer_release`](crate::Config::defer_release)).
    pub queued_behind: u64,
    /// Takes and releases of `Mutex` and `FairMutex` holds that their fast path served, since
    /// start: the uncontended case, one lean script call each (a lock this client has seen
    /// contended in the last second goes through the full scripts).
    pub fast_paths: u64,
}
