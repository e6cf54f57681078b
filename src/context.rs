//! The shared context at the bottom of the crate: what every layer above needs to talk to Redis
//! for one client, and nothing that knows about locks, holds or waiters.
//!
//! A [`Context`] holds the command connection (a fred `Client`), the configuration, the key
//! space and layout, the client's inbox tag, what the server can do (sharded Pub/Sub,
//! `XADD NOMKSTREAM`), whether the client is closed or hung up, the diagnostic counters, and
//! [`Context::run`], the one way scripts are called (with the fencing-token retry of
//! `lua/lib/fence.lua`). The lease, queue, watch and notify modules work over it; the engine
//! adds the registries of holds and waiters on top (`crate::engine::Core`).
//!
//! It imports only the leaf modules (`config`, `error`, `keys`, `layout`, `scripts`), so the
//! crate's modules import one way: from the client down to here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Key, Value};

use crate::config::{Config, NotificationMode};
use crate::error::{Error, Result};
use crate::keys::{Keyspace, LockKeys};
use crate::layout::Layout;
use crate::scripts::Script;

/// A boxed, sendable future (drivers and queued locks are used as trait objects).
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The concurrent map of every per-lock table of a client (waiters, holds, deferred releases,
/// envoys, Redis-side queues). Keyed by lock ids and hold keys, it is looked up several times
/// per acquisition: foldhash (randomly seeded per map) hashes such a key in a fraction of the
/// instructions that the standard library's SipHash takes.
pub(crate) type Table<K, V> = dashmap::DashMap<K, V, foldhash::fast::RandomState>;

/// What the layers above do once this client's layout is refused (every hold reported lost,
/// every waiter woken): set once by the layer that keeps the holds and waiters.
type RefusalHook = Box<dyn Fn() + Send + Sync>;

/// The state every layer shares: connection, configuration, naming, capabilities, flags,
/// counters, and the script runner.
pub(crate) struct Context {
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
    /// Acquire calls whose caller went away and that are being finished in the background.
    pub(crate) orphans: Arc<AtomicUsize>,
    /// Attempts repeated after a transient failure (diagnostics).
    pub(crate) retried_attempts: AtomicU64,
    /// Acquire script calls (diagnostics).
    pub(crate) attempts: AtomicU64,
    /// Acquisitions completed by a grant event, without a script call (diagnostics).
    pub(crate) granted: AtomicU64,
    /// Acquisitions handed over by a release of this client (diagnostics).
    pub(crate) handed_over: AtomicU64,
    /// Acquisitions that took over a deferred release (diagnostics).
    pub(crate) taken_over: AtomicU64,
    /// Releases deferred lazily (see `crate::engine::parked`), since start.
    pub(crate) deferred_lazily: AtomicU64,
    /// Acquisitions handed a hold within this client without a call (diagnostics).
    pub(crate) handed_locally: AtomicU64,
    /// Takes and releases answered by an exclusive lock's fast path (diagnostics).
    pub(crate) fast_paths: AtomicU64,
    /// No new acquisitions (shutdown started).
    closed: AtomicBool,
    /// Connections closed: every command fails at once with [`Error::Shutdown`].
    hung_up: AtomicBool,
    /// See [`RefusalHook`].
    on_refused: OnceLock<RefusalHook>,
}

impl Context {
    pub(crate) fn new(
        redis: Client,
        config: Config,
        keyspace: Keyspace,
        layout: Layout,
        sharded_pubsub: bool,
        nomkstream: bool,
        inbox_tag: Arc<str>,
    ) -> Context {
        Context {
            redis,
            config,
            keyspace,
            layout,
            sharded_pubsub,
            nomkstream,
            inbox_tag,
            orphans: Arc::default(),
            retried_attempts: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            fast_paths: AtomicU64::new(0),
            handed_over: AtomicU64::new(0),
            taken_over: AtomicU64::new(0),
            deferred_lazily: AtomicU64::new(0),
            handed_locally: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
            on_refused: OnceLock::new(),
        }
    }

    /// Sets what a refused layout does to the layers above (once; later calls are ignored).
    pub(crate) fn on_layout_refused(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_refused.set(Box::new(hook));
    }

    /// Whether shutdown has begun (no new acquisitions).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Begins shutdown; returns whether it had begun already.
    pub(crate) fn close(&self) -> bool {
        self.closed.swap(true, Ordering::AcqRel)
    }

    /// The connections are closed: every later command fails with [`Error::Shutdown`].
    pub(crate) fn hang_up(&self) {
        self.hung_up.store(true, Ordering::Release);
    }

    /// [`Error::Shutdown`] once shutdown began, the layout's refusal once refused.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::Shutdown)
        } else {
            self.layout.check_open()
        }
    }

    /// Runs a script on the command connection, mapping errors to [`Error`].
    pub(crate) async fn run(
        &self,
        script: &Script,
        lock: &str,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value> {
        self.run_with(script, lock, keys, args, false).await
    }

    /// [`run`](Self::run) for a script that must not run twice (a latch's count-down, which
    /// has no op id to answer a second delivery with): fred does not re-send it after a
    /// broken connection, so a call whose reply was lost fails, applied or not. Not for a
    /// script that issues tokens.
    pub(crate) async fn run_once(
        &self,
        script: &Script,
        lock: &str,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value> {
        debug_assert!(!script.issues_tokens());
        self.run_with(script, lock, keys, args, true).await
    }

    /// [`run`](Self::run); `once`: see [`run_once`](Self::run_once).
    async fn run_with(
        &self,
        script: &Script,
        lock: &str,
        keys: Vec<String>,
        args: Vec<Value>,
        once: bool,
    ) -> Result<Value> {
        // fred's keys take the strings over without a copy; the calls below borrow them.
        let keys: Vec<Key> = keys.into_iter().map(Key::from).collect();
        if script.issues_tokens() {
            return self.run_fenced(script, lock, &keys, args).await;
        }
        self.call(script, &keys, &args, once)
            .await
            .map_err(|err| self.script_error(err, lock, first_key(&keys)))
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
        keys: &[Key],
        mut args: Vec<Value>,
    ) -> Result<Value> {
        self.layout.check_open()?;
        args.push(self.layout.fence_arg(false));
        let refusal = match self.call(script, keys, &args, false).await {
            Err(err) if err.details().contains("FLFENCE") => err.details().to_owned(),
            other => return other.map_err(|err| self.script_error(err, lock, first_key(keys))),
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
        match self.call(script, keys, &args, false).await {
            Err(err) if err.details().contains("FLFENCE layout ") => {
                let server = err.details().split("FLFENCE layout ").nth(1).unwrap_or("");
                Err(self.refuse_layout(server.trim().to_owned()))
            }
            other => other.map_err(|err| self.script_error(err, lock, first_key(keys))),
        }
    }

    /// Runs a script without mapping its error; `once`: written at most once (fred re-sends
    /// a command whose connection broke before its reply otherwise).
    async fn call(
        &self,
        script: &Script,
        keys: &[Key],
        args: &[Value],
        once: bool,
    ) -> std::result::Result<Value, fred::error::Error> {
        if self.hung_up.load(Ordering::Acquire) {
            return Err(fred::error::Error::new(
                fred::error::ErrorKind::Canceled,
                "client shut down",
            ));
        }
        if once {
            return script.run_once(&self.redis, keys, args).await;
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
    /// wakes (to fail with the mismatch), through the hook of [`Context::on_layout_refused`].
    /// Returns `err`.
    pub(crate) fn layout_failed(&self, err: Error) -> Error {
        if self.layout.is_refused() {
            if let Some(refused) = self.on_refused.get() {
                refused();
            }
        }
        err
    }

    /// The ARGV tail every event-emitting script takes: mode, the reserved `maxlen` position,
    /// lock id.
    pub(crate) fn event_args(&self, keys: &LockKeys) -> Vec<Value> {
        let mut args = self.event_args_mode();
        args.push(keys.id().as_ref().into());
        args
    }

    /// Notification mode and the reserved `maxlen` position (empty: no script reads it, the
    /// inboxes are capped by `lua/lib/notify.lua`), as script arguments.
    pub(crate) fn event_args_mode(&self) -> Vec<Value> {
        let mode = match self.config.notification {
            NotificationMode::PubSub if self.sharded_pubsub => "spubsub",
            // A cluster before Redis 7: PUBLISH reaches subscribers on every node, so the
            // count it returns (this node's) says nothing about the receiver.
            NotificationMode::PubSub if self.keyspace.clustered() => "bpubsub",
            NotificationMode::Stream if self.nomkstream => "stream6",
            other => other.as_str(),
        };
        vec![mode.into(), "".into()]
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

fn first_key(keys: &[Key]) -> &str {
    keys.first().and_then(Key::as_str).unwrap_or("")
}
