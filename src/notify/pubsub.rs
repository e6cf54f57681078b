//! Pub/Sub mode: a subscription to this client's inbox channels on the dedicated connection.
//!
//! An inbox channel carries the events for this client's waiters alone (grants, and the wakeups
//! of waiters that are only woken, see `lua/lib/notify.lua`). Messages published while the
//! subscriber is disconnected are gone, so after every reconnect the reader subscribes again
//! itself (it does not rely on fred's automatic resubscription, which can stop silently when its
//! buffer overflows) and then wakes every local waiter to re-check; a lagging receiver (fred's
//! broadcast buffer overflowed) does the same. A grant whose message is lost still holds in
//! Redis: its waiter's next attempt is answered that the lock is its own.

use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::event::Event;
use super::Reader;
use crate::error::{Error, Result};

/// Subscribes to this client's inbox channels and spawns the reader.
pub(crate) async fn start(reader: Reader) -> Result<JoinHandle<()>> {
    let channels = reader.inbox_keys();
    let messages = reader.client.message_rx();
    let reconnects = reader.client.reconnect_rx();
    subscribe(&reader, &channels).await?;
    Ok(tokio::spawn(run(reader, channels, messages, reconnects)))
}

/// Subscribes, and returns once the server has applied it. fred resolves a `SUBSCRIBE` when it
/// is written (its confirmation comes out of band), so a `PING` on the same connection follows
/// it: the server answers the commands of one connection in order, so the reply means that the
/// subscription is in place. Without it, an event published right after `connect` returns (a
/// grant, or the `held` notice of a hold taken at once) could reach the server first and be
/// lost. (fred awaits an `SSUBSCRIBE`'s own reply.)
async fn subscribe(reader: &Reader, channels: &[String]) -> Result<()> {
    send_subscribe(reader, channels).await?;
    if reader.sharded_pubsub {
        return Ok(());
    }
    // In a cluster, fred sends `SUBSCRIBE` to the node of its client id's slot: so does this.
    let slot = fred::util::redis_keyslot(reader.client.id().as_bytes());
    let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
    match reader.client.custom::<Value, Value>(ping, Vec::new()).await {
        Ok(_) => Ok(()),
        Err(err) => match Error::from_redis(err, "(notifier)", "PING") {
            // A user whose ACL predates the `PING` (docs/design.md §10.1): the refusal is a
            // reply too, in order after the subscription.
            Error::Permission(_) => Ok(()),
            err => Err(err),
        },
    }
}

async fn send_subscribe(reader: &Reader, channels: &[String]) -> Result<()> {
    let map = |err| Error::from_redis(err, "(notifier)", "SUBSCRIBE");
    if reader.sharded_pubsub {
        // One SSUBSCRIBE per channel: the inboxes of different shards live in different slots.
        for channel in channels {
            reader
                .client
                .ssubscribe(channel.as_str())
                .await
                .map_err(map)?;
        }
        Ok(())
    } else {
        reader
            .client
            .subscribe(channels.to_vec())
            .await
            .map_err(map)
    }
}

async fn run(
    mut reader: Reader,
    channels: Vec<String>,
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    mut reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
) {
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Ok(message) => {
                    if !channels.iter().any(|channel| **channel == *message.channel) {
                        continue;
                    }
                    let Some(event) = message.value.as_string().as_deref().and_then(Event::from_payload) else {
                        tracing::warn!(channel = &*message.channel, "malformed event; waiters re-check");
                        reader.waiters.wake_all("malformed event");
                        continue;
                    };
                    reader.waiters.dispatch(&event.lock_id, &event.rule);
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "pub/sub receiver lagged; waiters re-check");
                    reader.waiters.wake_all("pub/sub lag");
                }
                Err(RecvError::Closed) => return,
            },
            reconnect = reconnects.recv() => {
                if matches!(reconnect, Err(RecvError::Closed)) {
                    return;
                }
                resubscribe(&mut reader, &channels).await;
                reader.waiters.wake_all("notifier reconnected");
            }
            _ = reader.shutdown.changed() => return,
        }
        if *reader.shutdown.borrow() {
            return;
        }
    }
}

/// Subscribes again after a reconnect, retrying until it works or the client shuts down.
async fn resubscribe(reader: &mut Reader, channels: &[String]) {
    let mut failures = 0;
    loop {
        match subscribe(reader, channels).await {
            Ok(()) => return,
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, failures, "resubscribe failed");
                let pause = super::backoff(failures, reader.config.reconnect_max_delay);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = reader.shutdown.changed() => return,
                }
            }
        }
    }
}
