//! The engine under every lock type: the acquire-and-wait loop, the [`Driver`] trait a lock
//! type implements, every release (hand-over and deferred releases included), and the state
//! they share ([`Core`], reached by lock handles and guards through an [`Engine`]).
//!
//! A lock type is a small [`Driver`]: it knows its keys and scripts and answers "did I get the
//! lock, and if not, for how long may the holder keep it". What only some lock types do is an
//! optional capability: handing the lock straight to a waiter of this process on release
//! ([`HandOver`]: the barging mutex and the read-write lock's writers), taking over a
//! deferred release with one call ([`Driver::take_over`]: those and the fair mutex) and
//! queueing waiters in Redis
//! ([`RedisQueue`], which the heartbeat watches). Everything else lives here, once:
//!
//! * [`acquire`](mod@acquire): the wait loop, taking up a hold that a release granted or handed
//!   over, cancellation ([`Finish`]), the optional replica acknowledgement;
//! * [`release`](mod@release): `unlock()`, the release worker behind a dropped guard, the local
//!   hand-over's release side and deferred releases;
//! * `parked`: the deferred releases' states (parked, releasing, gone) and the acquisitions
//!   that ask for them;
//! * [`cohort`](mod@cohort): hand-overs within the process without a call (the barging
//!   mutex and the read-write lock's writers, for acquisitions of handles without an owner);
//! * `envoy`: one waiting task per process asks Redis for a barging lock held elsewhere and
//!   queues there; the others wait behind it, so that the lock passes among them without a
//!   call once it reaches the process;
//! * [`contention`]: which locks the client has seen contended lately, which picks between an
//!   exclusive lock's fast and full scripts.
//!
//! The engine sits above the lease, queue, watch and notify modules, whose registries it
//! gathers in [`Core`] and whose tasks it starts, and below the lock types and the client.

pub(crate) mod acquire;
mod cohort;
pub(crate) mod contention;
mod envoy;
mod parked;
pub(crate) mod release;

use std::ops::Deref;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::context::{BoxFuture, Context, Table};
use crate::error::{NotHeldReason, Result};
use crate::lease::{run_watchdog, Hold, HoldKind, HoldRegistry, LostCause};
use crate::notify::{hang_up, Bid, WaiterTable};
use crate::owner::{op_id, Owner};
use crate::queue::{run_heartbeat, QueuedWaiters, RedisQueue};
use crate::watch::run_watch;

pub(crate) use acquire::{acquire, Finish, Patience, TransientRetry};

/// Acquire attempts one client has in flight at once; further attempts wait locally, in FIFO
/// order, for a slot. All of them share one connection, so a deeper pipeline would not be
/// faster, but each in-flight script call costs several KiB of client memory: without a bound,
/// 10 000 tasks calling `lock()` at once would allocate tens of MiB at once, and the allocator
/// keeps that memory long after the calls are done.
pub(crate) const MAX_ATTEMPTS_IN_FLIGHT: usize = 128;

/// The answer of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Acquired (or re-entered) with this fencing token. `lasts`: the hold expires sooner
    /// than the requested lease (a release granted it, `lua/lib/hold.lua`).
    Acquired { token: u64, lasts: Option<Duration> },
    /// Someone else holds the lock for at most `ttl` more (None: unknown), under the fencing
    /// token `token` (if the script says: a grant read later with a token not above it was
    /// made before this attempt ran).
    Busy {
        ttl: Option<Duration>,
        token: Option<u64>,
    },
}

/// The answer of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Released; `remaining` holds of the owner are left (0: the hold is gone); `successor`:
    /// what became of the successor the release named (barging mutex).
    Yes {
        remaining: u64,
        successor: Successor,
    },
    /// The hold was not there.
    NotHeld(NotHeldReason),
}

/// What a release did for the successor it named (a task of the releasing process, see
/// [`release`](mod@release)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Successor {
    /// Nothing: no successor, the lock is still held (re-entry), or it went to the queue.
    Passed,
    /// The successor holds the lock now, with this fencing token; `queued`: waiters stay
    /// queued in Redis behind it; `quiet`: none of them is due for a grant before this long
    /// after the release was sent (`lua/hold_release.lua`), so the successor's client may
    /// hand the hold on within itself until then (`cohort`).
    HandedOver {
        token: u64,
        queued: u32,
        quiet: Option<Duration>,
    },
    /// The lock went to the queue, and the successor (a take-over) joined the queue behind
    /// the waiter granted it: like a busy attempt, the new holder's bound and token.
    Queued { ttl: Duration, token: u64 },
}

/// What every lock type answers to the engine; its holds' needs (keys, role, renewal) come
/// from [`HoldKind`]. Optional capabilities: [`Driver::handover`], [`Driver::redis_queue`].
pub(crate) trait Driver: HoldKind {
    /// The engine the lock belongs to (its client's shared state).
    fn engine(&self) -> &Arc<Engine>;
    /// A new waiter id for one acquisition (unique; never contains `,`, `|`, a space or a
    /// newline). The read-write lock's tell readers from writers, and name the client's inbox.
    fn waiter_id(&self) -> Arc<str> {
        op_id().into()
    }
    /// One acquire attempt by the acquisition `waiter`. `waiting` tells the script that the
    /// caller will wait on failure (so it should join the queue).
    fn try_acquire(
        self: Arc<Self>,
        owner: Owner,
        waiter: Arc<str>,
        op: String,
        lease: Duration,
        waiting: bool,
    ) -> BoxFuture<'static, Result<Attempt>>;
    /// Releases one hold (or, with `all`, every re-entered hold) of `owner` with `token`.
    fn release<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        op: &'a str,
        all: bool,
    ) -> BoxFuture<'a, Result<Released>>;
    /// Whether a release may hand the lock straight to a waiter of this process (barging
    /// mutex, read-write lock's writers): its waiters then register a [`Bid`] and a release
    /// goes through [`HandOver::release_to`]. Default: never.
    fn handover(&self) -> Option<&dyn HandOver> {
        None
    }
    /// Whether the release of a contended hold may be deferred for a task of this process that
    /// asks for the lock right after it, which then takes the hold over with one release call
    /// naming it (see [`release`](mod@release)): the capability that sends such a call.
    /// Default: the hand-over capability.
    fn take_over(&self) -> Option<&dyn HandOver> {
        self.handover()
    }
    /// Whether this client defers the releases of this lock's contended holds: the
    /// configuration allows it and the lock can take a deferred release over. Such a lock's
    /// takes ask Redis to tell the client of a hold's first waiter (the `held` notice).
    fn defers_releases(&self) -> bool {
        self.engine().ctx.config.defer_release && self.take_over().is_some()
    }
    /// For locks whose waiting attempts join a queue in Redis, which the client's heartbeat
    /// watches and which a waiter must leave when it gives up. Default: none.
    fn redis_queue(self: Arc<Self>) -> Option<Arc<dyn RedisQueue>> {
        None
    }
}

/// The capability of a lock whose release may hand it to a waiting task of this process.
pub(crate) trait HandOver: Send + Sync {
    /// Releases one hold of `owner`; when that frees the lock, it may hand it to `successor`
    /// (its waiter id and bid) instead. `floor`: the highest token this client issued for the
    /// hold within the process ([`cohort`](mod@cohort)), if it handed it over there; the
    /// lock's next token goes above it.
    fn release_to<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        floor: Option<u64>,
        op: &'a str,
        successor: Option<(&'a str, &'a Bid)>,
    ) -> BoxFuture<'a, Result<Released>>;
    /// Whether a release may hand the hold to a task of this process without a call
    /// ([`cohort`](mod@cohort)). Default: never.
    fn hands_over_locally(&self) -> bool {
        false
    }
}

/// A hold of one of the engine's drivers.
pub(crate) type DriverHold = Hold<dyn Driver>;

/// A hold that spans several clients (a [`Redlock`](crate::Redlock) hold, one per instance),
/// so no single client's [`HoldRegistry`] tracks it. Each of its clients keeps it in
/// [`Core::spanning`] until it is released; a client that shuts down first releases it.
pub(crate) trait SpanningHold: Send + Sync {
    /// Releases the hold everywhere (once) and tells its guard ([`LostCause::Shutdown`]).
    fn release_on_shutdown(self: Arc<Self>) -> BoxFuture<'static, ()>;
}

/// The state shared by a client's lock handles, guards and background tasks: the context and
/// the registries of holds and waiters.
pub(crate) struct Core {
    pub(crate) ctx: Arc<Context>,
    pub(crate) holds: HoldRegistry<dyn Driver>,
    pub(crate) waiters: Arc<WaiterTable>,
    pub(crate) queued: QueuedWaiters,
    /// Holds whose release is deferred (see [`release`](mod@release)).
    pub(crate) parked: parked::ParkedHolds,
    /// Holds that span several clients (Redlock), by id: released when this client shuts down.
    pub(crate) spanning: Table<u64, Arc<dyn SpanningHold>>,
    /// Bounds the acquire attempts in flight at once (see [`MAX_ATTEMPTS_IN_FLIGHT`]).
    pub(crate) attempt_slots: Arc<tokio::sync::Semaphore>,
    /// Which locks this client has seen contended lately (see [`contention`]).
    pub(crate) contention: contention::ContentionHints,
    /// The waiting task of each lock that asks Redis for the process (see `envoy`).
    pub(crate) envoys: envoy::Envoys,
}

impl Core {
    /// The state over `ctx` and the waiter table its event readers wake; a refused layout
    /// reports every hold lost and wakes every waiter.
    pub(crate) fn new(ctx: Arc<Context>, waiters: Arc<WaiterTable>) -> Arc<Core> {
        let core = Arc::new(Core {
            ctx,
            holds: HoldRegistry::default(),
            waiters,
            queued: QueuedWaiters::default(),
            parked: parked::ParkedHolds::default(),
            spanning: Table::default(),
            attempt_slots: Arc::new(tokio::sync::Semaphore::new(MAX_ATTEMPTS_IN_FLIGHT)),
            contention: contention::ContentionHints::default(),
            envoys: envoy::Envoys::default(),
        });
        let weak = Arc::downgrade(&core);
        core.waiters.on_queued_behind(move |lock_id, token| {
            if let Some(core) = weak.upgrade() {
                core.contention.contended(lock_id);
                core.holds.queued_behind(lock_id, token);
            }
        });
        let weak = Arc::downgrade(&core);
        core.ctx.on_layout_refused(move || {
            if let Some(core) = weak.upgrade() {
                for hold in core.holds.all() {
                    hold.mark_lost(LostCause::LayoutMismatch);
                }
                core.waiters.wake_all("layout mismatch");
            }
        });
        core
    }

    /// Starts the background tasks over this state: the watchdog, the waiter heartbeat, the
    /// data-loss watch and the release worker (fed by `releases`). Each holds the core (never
    /// the [`Engine`]) and stops on `shutdown`, or once the engine's end of it is gone.
    pub(crate) fn start_tasks(
        self: &Arc<Core>,
        releases: mpsc::UnboundedReceiver<Arc<DriverHold>>,
        shutdown: watch::Receiver<bool>,
    ) -> [JoinHandle<()>; 4] {
        let (watchdog, heartbeat, watcher) = (self.clone(), self.clone(), self.clone());
        let (shutdown_1, shutdown_2, shutdown_3) =
            (shutdown.clone(), shutdown.clone(), shutdown.clone());
        [
            tokio::spawn(async move {
                let core = &watchdog;
                run_watchdog(core.ctx.clone(), &core.holds, shutdown_1).await
            }),
            tokio::spawn(async move {
                let core = &heartbeat;
                let waiters = core.waiters.clone();
                run_heartbeat(core.ctx.clone(), &core.queued, waiters, shutdown_2).await
            }),
            tokio::spawn(async move {
                let core = &watcher;
                run_watch(core.ctx.clone(), &core.holds, &core.waiters, shutdown_3).await
            }),
            tokio::spawn(release::run_release_worker(releases, shutdown)),
        ]
    }
}

/// A running client: the shared [`Core`], the notifier connections, and the client's ends of
/// the channels to its background tasks. The client, every lock handle, driver and guard hold
/// it; the tasks hold the core alone, so once the last of those is gone the engine is dropped,
/// which stops the tasks and hangs up ([`LockClient::shutdown`](crate::LockClient::shutdown)
/// does the same on demand, releasing every hold first).
pub(crate) struct Engine {
    core: Arc<Core>,
    notifiers: Vec<Client>,
    owns_command_connection: bool,
    release_tx: mpsc::UnboundedSender<Arc<DriverHold>>,
    shutdown_tx: watch::Sender<bool>,
    tasks: StdMutex<Vec<JoinHandle<()>>>,
}

impl Engine {
    /// The engine of a started client: `shutdown_tx` stops its `tasks`, `release_tx` feeds
    /// its release worker; `owns_command_connection`: whether shutdown closes the command
    /// connection (not when the service gave its own client).
    pub(crate) fn new(
        core: Arc<Core>,
        notifiers: Vec<Client>,
        owns_command_connection: bool,
        release_tx: mpsc::UnboundedSender<Arc<DriverHold>>,
        shutdown_tx: watch::Sender<bool>,
        tasks: Vec<JoinHandle<()>>,
    ) -> Arc<Engine> {
        Arc::new(Engine {
            core,
            notifiers,
            owns_command_connection,
            release_tx,
            shutdown_tx,
            tasks: StdMutex::new(tasks),
        })
    }

    /// Hands the release of a dropped guard's hold to the release worker.
    pub(crate) fn release_later(&self, hold: Arc<DriverHold>) {
        if self.release_tx.send(hold).is_err() {
            tracing::debug!("release worker gone; the lease will expire");
        }
    }

    /// Releases every hold, stops the tasks and closes the connections the client opened
    /// (see [`LockClient::shutdown`](crate::LockClient::shutdown)). Idempotent.
    pub(crate) async fn shutdown(&self) -> Result<()> {
        let core = &self.core;
        if core.ctx.close() {
            return Ok(());
        }
        tracing::info!("lock client shutting down");
        let spanning: Vec<u64> = core.spanning.iter().map(|e| *e.key()).collect();
        for id in spanning {
            if let Some((_, hold)) = core.spanning.remove(&id) {
                hold.release_on_shutdown().await;
            }
        }
        let mut first_error = None;
        // Deferred releases too, plainly: a hand-over to a local waiter now would give it a
        // hold after shutdown began.
        let parked = core.parked.drain();
        for hold in parked.into_iter().chain(core.holds.drain()) {
            let released = release::release_hold_in_redis(&hold, &op_id(), true).await;
            hold.mark_lost(LostCause::Shutdown);
            if let Err(err) = released {
                first_error.get_or_insert(err);
            }
        }
        self.shutdown_tx.send_replace(true);
        core.waiters.wake_all("shutdown");
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = tokio::time::timeout(core.ctx.config.command_timeout, task).await;
        }
        // Deferred releases whose task had started before the drain above are on their way:
        // they need the connection that hang_up closes.
        let deadline = tokio::time::Instant::now() + core.ctx.config.command_timeout;
        core.parked.settled(deadline).await;
        core.ctx.hang_up();
        for notifier in &self.notifiers {
            hang_up(notifier).await;
        }
        if self.owns_command_connection {
            let _ = core.ctx.redis.quit().await;
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The last handle is gone: stop the tasks (they never block on us) and hang up.
        self.shutdown_tx.send_replace(true);
        if self.core.ctx.close() {
            return; // shutdown() already hung up
        }
        let notifiers = self.notifiers.clone();
        let command = self
            .owns_command_connection
            .then(|| self.core.ctx.redis.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for notifier in &notifiers {
                    hang_up(notifier).await;
                }
                if let Some(command) = command {
                    let _ = command.quit().await;
                }
            });
        }
    }
}

/// An engine is a handle on its [`Core`].
impl Deref for Engine {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}
