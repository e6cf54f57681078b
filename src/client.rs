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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use dashmap::DashMap;
use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::config::{
    Config as FredConfig, ConnectionConfig, PerformanceConfig, ReconnectPolicy,
};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::{Config, NotificationMode};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, LockKeys};
use crate::layout::Layout;
use crate::lease::{run_watchdog, HoldRegistry, LostCause};
use crate::lock::mutex::{FairMutex, Mutex};
use crate::lock::rwlock::RwLock;
use crate::notify::{pubsub, stream, WaiterTable};
use crate::queue::{run_heartbeat, QueuedWaiters};
use crate::release::{run_release_worker, ParkedHolds, ReleaseJob};
use crate::scripts::Script;

/// Acquire attempts one client has in flight at once; further attempts wait locally, in FIFO
/// order, for a slot. All of them share one connection, so a deeper pipeline would not be
/// faster, but each in-flight script call costs several KiB of client memory: without a bound,
/// 10 000 tasks calling `lock()` at once would allocate tens of MiB at once, and the allocator
/// keeps that memory long after the calls are done.
pub(crate) const MAX_ATTEMPTS_IN_FLIGHT: usize = 128;

/// A hold that spans several clients (a [`Redlock`](crate::Redlock) hold, one per instance),
/// so no single client's [`HoldRegistry`] tracks it. Each of its clients keeps it in
/// [`Core::spanning`] until it is released; a client that shuts down first releases it.
pub(crate) trait SpanningHold: Send + Sync {
    /// Releases the hold everywhere (once) and tells its guard ([`LostCause::Shutdown`]).
    fn release_on_shutdown(self: Arc<Self>) -> crate::engine::BoxFuture<'static, ()>;
}

/// State shared by handles, guards and background tasks.
pub(crate) struct Core {
    pub(crate) redis: Client,
    pub(crate) config: Config,
    pub(crate) keyspace: Keyspace,
    /// This client's layout, and whether the server's record still matches it.
    pub(crate) layout: Layout,
    /// Redis Cluster 7+: scripts publish with `SPUBLISH` in Pub/Sub mode.
    pub(crate) sharded_pubsub: bool,
    /// Redis 6.2+ (and Valkey): an event into an inbox is one `XADD NOMKSTREAM`, which also
    /// tells whether the inbox exists (mode "stream6" in `lua/lib/notify.lua`).
    pub(crate) nomkstream: bool,
    /// Names this client's inboxes ([`Keyspace::inbox`]): random, 16 hex digits.
    pub(crate) inbox_tag: Arc<str>,
    pub(crate) holds: HoldRegistry,
    pub(crate) waiters: Arc<WaiterTable>,
    pub(crate) queued: QueuedWaiters,
    /// Acquire calls whose caller went away and that are being finished in the background.
    pub(crate) orphans: Arc<AtomicUsize>,
    /// Bounds the acquire attempts in flight at once (see [`MAX_ATTEMPTS_IN_FLIGHT`]).
    pub(crate) attempt_slots: Arc<tokio::sync::Semaphore>,
    /// Holds that span several clients (Redlock), by id: released when this client shuts down.
    pub(crate) spanning: DashMap<u64, Arc<dyn SpanningHold>>,
    /// Attempts repeated after a transient failure (diagnostics).
    pub(crate) retried_attempts: AtomicU64,
    /// Acquire script calls (diagnostics).
    pub(crate) attempts: AtomicU64,
    /// Acquisitions completed by a grant event, without a script call (diagnostics).
    pub(crate) granted: AtomicU64,
    /// Acquisitions handed over by a release of this client (diagnostics).
    pub(crate) handed_over: AtomicU64,
    /// Holds whose release is deferred (see `crate::release`).
    pub(crate) parked: ParkedHolds,
    /// Acquisitions that took over a deferred release (diagnostics).
    pub(crate) taken_over: AtomicU64,
    /// No new acquisitions (shutdown started).
    closed: AtomicBool,
    /// Connections closed: every command fails at once with [`Error::Shutdown`].
    hung_up: AtomicBool,
}

impl Core {
    /// Whether shutdown has begun (no new acquisitions).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Runs a script on the command connection, mapping errors to [`Error`].
    pub(crate) async fn run(
        &self,
        script: &Script,
        lock: &str,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value> {
        if script.issues_tokens() {
            return self.run_fenced(script, lock, keys, args).await;
        }
        let first_key = keys.first().cloned().unwrap_or_default();
        self.call(script, keys, args)
            .await
            .map_err(|err| self.script_error(err, lock, &first_key))
    }

    /// Runs a script that issues fencing tokens, with the fence argument appended to `args`
    /// (`lua/lib/fence.lua`). When the script finds the shard's fence key missing (the server
    /// lost data, or the shard's first use), the layout record is verified (recorded again if
    /// it is gone) and the script runs once more, allowed to create the key. A fence key of
    /// another layout refuses this client ([`Error::LayoutMismatch`]).
    async fn run_fenced(
        &self,
        script: &Script,
        lock: &str,
        keys: Vec<String>,
        mut args: Vec<Value>,
    ) -> Result<Value> {
        self.layout.check_open()?;
        args.push(self.layout.fence_arg(false));
        let refusal = match self.call(script, keys.clone(), args.clone()).await {
            Err(err) if err.details().contains("FLFENCE") => err.details().to_owned(),
            other => return other.map_err(|err| self.script_error(err, lock, first_key(&keys))),
        };
        if let Some(server) = refusal.split("FLFENCE layout ").nth(1) {
            return Err(self.refuse_layout(server.trim().to_owned()));
        }
        tracing::debug!(lock, "shard fence key missing; verifying the layout record");
        if let Err(err) = self.layout.verify(&self.redis).await {
            return Err(self.layout_failed(err));
        }
        if let Some(last) = args.last_mut() {
            *last = self.layout.fence_arg(true);
        }
        match self.call(script, keys.clone(), args).await {
            Err(err) if err.details().contains("FLFENCE layout ") => {
                let server = err.details().split("FLFENCE layout ").nth(1).unwrap_or("");
                Err(self.refuse_layout(server.trim().to_owned()))
            }
            other => other.map_err(|err| self.script_error(err, lock, first_key(&keys))),
        }
    }

    /// Runs a script without mapping its error.
    async fn call(
        &self,
        script: &Script,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> std::result::Result<Value, fred::error::Error> {
        if self.hung_up.load(Ordering::Acquire) {
            return Err(fred::error::Error::new(
                fred::error::ErrorKind::Canceled,
                "client shut down",
            ));
        }
        script.run(&self.redis, keys, args).await
    }

    fn script_error(&self, err: fred::error::Error, lock: &str, first_key: &str) -> Error {
        if self.hung_up.load(Ordering::Acquire) {
            return Error::Shutdown;
        }
        Error::from_redis(err, lock, first_key)
    }

    /// The server records another layout under our prefix: this client stops working.
    pub(crate) fn refuse_layout(&self, server: String) -> Error {
        let err = self.layout.refuse(server);
        self.layout_failed(err)
    }

    /// After a failed layout check: once refused, every hold is reported lost and every waiter
    /// wakes (to fail with the mismatch). Returns `err`.
    pub(crate) fn layout_failed(&self, err: Error) -> Error {
        if self.layout.is_refused() {
            for hold in self.holds.all() {
                hold.mark_lost(LostCause::LayoutMismatch);
            }
            self.waiters.wake_all("layout mismatch");
        }
        err
    }

    /// The ARGV tail every event-emitting script takes: mode, stream cap, lock id.
    pub(crate) fn event_args(&self, keys: &LockKeys) -> Vec<Value> {
        let mut args = self.event_args_mode();
        args.push(keys.id().as_ref().into());
        args
    }

    /// Notification mode and stream cap, as script arguments.
    pub(crate) fn event_args_mode(&self) -> Vec<Value> {
        let mode = match self.config.notification {
            NotificationMode::PubSub if self.sharded_pubsub => "spubsub",
            // A cluster before Redis 7: PUBLISH reaches subscribers on every node, so the
            // count it returns (this node's) says nothing about the receiver.
            NotificationMode::PubSub if self.keyspace.clustered() => "bpubsub",
            NotificationMode::Stream if self.nomkstream => "stream6",
            other => other.as_str(),
        };
        vec![mode.into(), (self.config.stream_max_len as i64).into()]
    }

    /// `WAIT numreplicas timeout` on the node that owns `key`: how many replicas acknowledged
    /// every write this client sent to that node so far.
    pub(crate) async fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u32> {
        let slot = fred::util::redis_keyslot(key.as_bytes());
        let command = CustomCommand::new_static("WAIT", ClusterHash::Custom(slot), false);
        let args: Vec<Value> = vec![
            i64::from(replicas).into(),
            (timeout.as_millis() as i64).into(),
        ];
        let acked: i64 = self
            .redis
            .with_options(&fred::types::config::Options {
                timeout: Some(timeout + self.config.command_timeout),
                ..Default::default()
            })
            .custom(command, args)
            .await
            .map_err(|err| Error::from_redis(err, key, key))?;
        Ok(acked.clamp(0, i64::from(u32::MAX)) as u32)
    }

    /// How long a released hold remembers its last op id (answers retried releases).
    pub(crate) fn tombstone_ttl(&self) -> Duration {
        (self.config.command_timeout * 3).max(Duration::from_secs(10))
    }
}

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

fn first_key(keys: &[String]) -> &str {
    keys.first().map_or("", String::as_str)
}

/// A connection to Redis for distributed locks: the factory of lock handles.
///
/// Cheap to clone (all clones share connections and tasks). See the [crate docs](crate) for
/// an overview.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    core: Arc<Core>,
    notifiers: Vec<Client>,
    owns_command_connection: bool,
    release_tx: mpsc::UnboundedSender<ReleaseJob>,
    shutdown_tx: watch::Sender<bool>,
    tasks: StdMutex<Vec<JoinHandle<()>>>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // The last handle is gone: stop the tasks (they never block on us) and hang up.
        self.shutdown_tx.send_replace(true);
        if self.core.closed.swap(true, Ordering::AcqRel) {
            return; // shutdown() already hung up
        }
        let notifiers = self.notifiers.clone();
        let command = self
            .owns_command_connection
            .then(|| self.core.redis.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for notifier in &notifiers {
                    hang_up_notifier(notifier).await;
                }
                if let Some(command) = command {
                    let _ = command.quit().await;
                }
            });
        }
    }
}

/// Closes the notifier connection at once, interrupting a blocked `XREAD` first (a `QUIT`
/// queued behind it would otherwise wait for the block to time out).
async fn hang_up_notifier(notifier: &Client) {
    use fred::interfaces::ClientInterface;
    let _ = notifier.unblock_self(None).await;
    let _ = notifier.quit().await;
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
                hang_up_notifier(opened).await;
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

    /// Uses a fred client the service already has for commands (it must be connected). The
    /// notifier still opens its own connection with the same settings, because a blocking read
    /// must not stall the service's commands. `config.url` is ignored. Shutdown leaves the
    /// given client connected.
    pub async fn from_client(client: Client, config: Config) -> Result<LockClient> {
        config.validate()?;
        Self::start(client, false, config).await
    }

    async fn start(command: Client, owns_command: bool, config: Config) -> Result<LockClient> {
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
        let core = Arc::new(Core {
            redis: command,
            config: config.clone(),
            keyspace: keyspace.clone(),
            layout,
            sharded_pubsub,
            nomkstream,
            inbox_tag: inbox_tag.clone(),
            holds: HoldRegistry::default(),
            waiters: waiters.clone(),
            queued: QueuedWaiters::default(),
            orphans: Arc::default(),
            retried_attempts: AtomicU64::new(0),
            spanning: DashMap::new(),
            attempts: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            handed_over: AtomicU64::new(0),
            parked: ParkedHolds::default(),
            taken_over: AtomicU64::new(0),
            attempt_slots: Arc::new(tokio::sync::Semaphore::new(MAX_ATTEMPTS_IN_FLIGHT)),
            closed: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
        });
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let readers = notifiers
            .iter()
            .enumerate()
            .map(|(i, client)| crate::notify::Reader {
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
                        hang_up_notifier(notifier).await;
                    }
                    if owns_command {
                        let _ = core.redis.quit().await;
                    }
                    return Err(err);
                }
            }
        }
        let (release_tx, release_rx) = mpsc::unbounded_channel();
        tasks.extend([
            tokio::spawn(run_watchdog(core.clone(), shutdown_rx.clone())),
            tokio::spawn(run_heartbeat(core.clone(), shutdown_rx.clone())),
            tokio::spawn(crate::watch::run_watch(core.clone(), shutdown_rx.clone())),
            tokio::spawn(run_release_worker(release_rx, shutdown_rx)),
        ]);
        tracing::info!(
            url = %config.redacted_url(),
            mode = config.notification.as_str(),
            shards = config.shards,
            clustered,
            notifier_clients = notifiers.len(),
            "lock client started"
        );
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                core,
                notifiers,
                owns_command_connection: owns_command,
                release_tx,
                shutdown_tx,
                tasks: StdMutex::new(tasks),
            }),
        })
    }

    /// An exclusive reentrant lock handle, barging (see [`Mutex`]). Validates the name
    /// (non-empty, at most [`crate::MAX_NAME_LEN`] bytes); no Redis call.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        Mutex::barging(self.clone(), name)
    }

    /// A fair (strict FIFO across processes) exclusive reentrant lock handle (see
    /// [`FairMutex`]). A fair lock and a barging lock of the same name are different locks.
    /// Validates the name; no Redis call.
    pub fn fair_mutex(&self, name: &str) -> Result<FairMutex> {
        FairMutex::new(self.clone(), name)
    }

    /// A read-write lock handle (see [`RwLock`]). Validates the name; no Redis call.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        RwLock::new(self.clone(), name)
    }

    /// The configuration in use.
    pub fn config(&self) -> &Config {
        &self.inner.core.config
    }

    /// The fred client used for commands.
    pub fn redis(&self) -> &Client {
        &self.inner.core.redis
    }

    /// Counters for monitoring and tests.
    pub fn stats(&self) -> ClientStats {
        let core = &self.inner.core;
        ClientStats {
            held: core.holds.len(),
            waiting: core.waiters.waiters(),
            waiting_locks: core.waiters.queues(),
            wakeups: core.waiters.wakeups(),
            orphaned_attempts: core.orphans.load(Ordering::Acquire),
            queued_in_redis: core.queued.len(),
            retried_attempts: core.retried_attempts.load(Ordering::Relaxed),
            attempts: core.attempts.load(Ordering::Relaxed),
            granted: core.granted.load(Ordering::Relaxed),
            handed_over: core.handed_over.load(Ordering::Relaxed),
            taken_over: core.taken_over.load(Ordering::Relaxed),
            deferred_releases: core.parked.len(),
        }
    }

    /// Releases every hold, stops the tasks and closes the connections this client opened.
    /// Pending and later acquisitions fail with [`Error::Shutdown`]; guards still alive report
    /// [`LostCause::Shutdown`]. Idempotent.
    pub async fn shutdown(&self) -> Result<()> {
        let inner = &self.inner;
        if inner.core.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        tracing::info!("lock client shutting down");
        let spanning: Vec<u64> = inner.core.spanning.iter().map(|e| *e.key()).collect();
        for id in spanning {
            if let Some((_, hold)) = inner.core.spanning.remove(&id) {
                hold.release_on_shutdown().await;
            }
        }
        let mut first_error = None;
        // Deferred releases too, plainly: a hand-over to a local waiter now would give it a
        // hold after shutdown began.
        let parked = inner.core.parked.drain();
        for hold in parked.into_iter().chain(inner.core.holds.drain()) {
            let released = hold
                .driver
                .release(&hold.owner, hold.token, &crate::owner::op_id(), true)
                .await;
            hold.mark_lost(LostCause::Shutdown);
            if let Err(err) = released {
                first_error.get_or_insert(err);
            }
        }
        inner.shutdown_tx.send_replace(true);
        inner.core.waiters.wake_all("shutdown");
        let tasks = std::mem::take(&mut *inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = tokio::time::timeout(inner.core.config.command_timeout, task).await;
        }
        inner.core.hung_up.store(true, Ordering::Release);
        for notifier in &inner.notifiers {
            hang_up_notifier(notifier).await;
        }
        if inner.owns_command_connection {
            let _ = inner.core.redis.quit().await;
        }
        first_error.map_or(Ok(()), Err)
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    pub(crate) fn keyspace(&self) -> &Keyspace {
        &self.inner.core.keyspace
    }

    pub(crate) fn holds(&self) -> &HoldRegistry {
        &self.inner.core.holds
    }

    pub(crate) fn queued(&self) -> &QueuedWaiters {
        &self.inner.core.queued
    }

    pub(crate) fn orphans(&self) -> &Arc<AtomicUsize> {
        &self.inner.core.orphans
    }

    pub(crate) fn attempt_slots(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.inner.core.attempt_slots
    }

    pub(crate) fn waiters(&self) -> &Arc<WaiterTable> {
        &self.inner.core.waiters
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.inner.core.closed.load(Ordering::Acquire) {
            Err(Error::Shutdown)
        } else {
            self.inner.core.layout.check_open()
        }
    }

    pub(crate) fn release_later(&self, job: ReleaseJob) {
        if self.inner.release_tx.send(job).is_err() {
            tracing::debug!("release worker gone; the lease will expire");
        }
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("config", &self.inner.core.config)
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
    /// Barging-mutex acquisitions that took over a release this client had deferred (see
    /// [`Config::defer_release`](crate::Config::defer_release)), since start.
    pub taken_over: u64,
    /// Releases deferred right now, waiting for the releasing task to yield or a task of this client to
    /// take them over.
    pub deferred_releases: usize,
}
