//! Noticing that the server lost data, and telling the holds at once.
//!
//! No script runs when Redis loses its data (a restart without persistence, `FLUSHALL`, a
//! failover to a replica that missed the last writes). A hold that vanished would only be
//! found at its next renewal (a third of a watchdog lease later; for a fixed lease, never
//! before its deadline) while another client may already hold the lock. So each client
//! watches for the traces a loss leaves:
//!
//! * a **reconnect** of its command connection (a restart, a failover, a broken link): fred
//!   reports it, and the client checks at once;
//! * its **marker key gone** (`FLUSHALL`, or a loss without a reconnect): each client keeps
//!   a key of its own, `{P:layout}:client:<tag>`, that expires [`MARKER_TTL`] after the last
//!   probe. While the client keeps holds, it probes every [`PROBE_PERIOD`] (one `PEXPIRE`,
//!   answered from memory; nothing while it holds nothing): a marker that is gone means the
//!   server lost data. The marker is the client's own, so another client that noticed the
//!   loss first cannot hide it by writing it again (as it does with the layout record). On a
//!   cluster the client also checks the fence key of every shard it holds locks in, since each
//!   master loses its data on its own.
//!
//! A check then records the layout again (which refuses this client if another layout took
//! the prefix meanwhile, see [`crate::layout`]), checks every hold against Redis in one script
//! call per shard ([`verify_holds`]): each hold that is gone fires its lost signal; and wakes
//! every local waiter, whose wait may be bounded by a hold that no longer exists.
//!
//! This is a health check of the server, not a poll of lock state: waiters are still woken by
//! release events alone.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{EventInterface, KeysInterface};
use fred::types::{Expiration, Value};
use tokio::sync::watch;

use crate::config::NotificationMode;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::lease::{verify_holds, HoldKind, HoldRegistry};
use crate::notify::{stream, WaiterTable};

/// What a check needs: the context, the client's holds and its waiters.
struct Watched<'a, K: ?Sized + HoldKind> {
    ctx: &'a Context,
    holds: &'a HoldRegistry<K>,
    waiters: &'a WaiterTable,
}

/// How often a client that keeps holds probes its marker key.
pub(crate) const PROBE_PERIOD: Duration = Duration::from_millis(250);

/// How long a client's marker key outlives its last probe.
pub(crate) const MARKER_TTL: Duration = Duration::from_secs(600);

/// The watch task of one client: runs until shutdown.
pub(crate) async fn run_watch<K: ?Sized + HoldKind>(
    ctx: Arc<Context>,
    holds: &HoldRegistry<K>,
    waiters: &WaiterTable,
    mut shutdown: watch::Receiver<bool>,
) {
    let watched = Watched {
        ctx: &ctx,
        holds,
        waiters,
    };
    let mut reconnects = ctx.redis.reconnect_rx();
    if let Err(error) = set_marker(&ctx).await {
        tracing::debug!(%error, "cannot write the marker key yet");
    }
    let mut probe = tokio::time::interval(PROBE_PERIOD);
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let reason = tokio::select! {
            _ = shutdown.changed() => return,
            event = reconnects.recv() => match event {
                Ok(server) => {
                    tracing::info!(%server, "command connection re-established; checking the holds");
                    Some("reconnect")
                }
                // Missed notifications: still a reconnect.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some("reconnect"),
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    reconnects = ctx.redis.reconnect_rx();
                    None
                }
            },
            _ = probe.tick() => {
                if holds.len() == 0 {
                    None
                } else {
                    match data_lost(&watched).await {
                        Ok(true) => Some("data loss"),
                        Ok(false) => None,
                        Err(error) => {
                            tracing::debug!(%error, "server probe failed");
                            None
                        }
                    }
                }
            }
        };
        if *shutdown.borrow() {
            return;
        }
        if let Some(reason) = reason {
            check_after_loss(&watched, reason).await;
        }
    }
}

/// The client's marker key.
fn marker(ctx: &Context) -> String {
    format!("{}:client:{}", ctx.layout.key(), ctx.inbox_tag)
}

async fn set_marker(ctx: &Context) -> Result<()> {
    let key = marker(ctx);
    let expiry = Expiration::PX(MARKER_TTL.as_millis() as i64);
    let _: Value = ctx
        .redis
        .set(key.as_str(), "1", Some(expiry), None, false)
        .await
        .map_err(|err| Error::from_redis(err, "(marker)", &key))?;
    Ok(())
}

/// Whether the server shows a trace of a data loss: the client's marker key, or (on a
/// cluster) the fence key of a shard this client holds a lock in, is gone.
async fn data_lost<K: ?Sized + HoldKind>(watched: &Watched<'_, K>) -> Result<bool> {
    let ctx = watched.ctx;
    let key = marker(ctx);
    let kept: bool = ctx
        .redis
        .pexpire(key.as_str(), MARKER_TTL.as_millis() as i64, None)
        .await
        .map_err(|err| Error::from_redis(err, "(marker)", &key))?;
    if !kept {
        return Ok(true);
    }
    if ctx.keyspace.event_shards() == 1 {
        return Ok(false);
    }
    let mut shards: Vec<u16> = watched
        .holds
        .all()
        .iter()
        .map(|hold| hold.lock.keys().shard())
        .collect();
    shards.sort_unstable();
    shards.dedup();
    for shard in shards {
        let fence = ctx.keyspace.fence(shard);
        let exists: i64 = ctx
            .redis
            .exists(fence.as_str())
            .await
            .map_err(|err| Error::from_redis(err, "(fence)", &fence))?;
        if exists == 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Records the layout again, checks every hold and wakes every waiter.
async fn check_after_loss<K: ?Sized + HoldKind>(watched: &Watched<'_, K>, reason: &'static str) {
    let ctx = watched.ctx;
    if ctx.layout.is_refused() {
        return;
    }
    if let Err(error) = ctx.layout.verify(&ctx.redis).await {
        tracing::warn!(%error, reason, "layout check failed");
        ctx.layout_failed(error);
        if ctx.layout.is_refused() {
            return;
        }
    }
    if let Err(error) = set_marker(ctx).await {
        tracing::debug!(%error, "cannot write the marker key");
    }
    if ctx.config.notification == NotificationMode::Stream {
        // The loss took the inboxes too: without them no release grants this client a lock.
        let inboxes: Vec<String> = (0..ctx.keyspace.event_shards())
            .map(|shard| ctx.keyspace.inbox(shard, &ctx.inbox_tag))
            .collect();
        if let Err(error) = stream::keep_inboxes(&ctx.redis, &inboxes).await {
            tracing::warn!(%error, "could not create the inboxes again");
        }
    }
    let holds = watched.holds.len();
    verify_holds(ctx, watched.holds).await;
    tracing::debug!(reason, holds, "holds checked");
    watched.waiters.wake_all(reason);
}
