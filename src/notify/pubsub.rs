//! Pub/Sub mode: one subscription per shard channel on the dedicated connection.
//!
//! Messages published while the subscriber is disconnected are gone, so after every
//! reconnect the reader subscribes again itself (it does not rely on fred's automatic
//! resubscription, which can stop silently when its buffer overflows) and then wakes every
//! local waiter to re-check. A lagging receiver (fred's broadcast buffer overflowed) and a
//! jump in a shard's sequence numbers do the same.
//!
//! The reader also subscribes to this client's inbox channel of each shard (fair grants sent
//! to this client alone, see `lua/lib/notify.lua`); each inbox numbers its messages itself.

use std::collections::HashMap;

use fred::interfaces::{EventInterface, PubsubInterface};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::event::Event;
use super::sequence::{Sequences, Source};
use super::Reader;
use crate::error::{Error, Result};

/// Subscribes to every shard channel and spawns the reader.
pub(crate) async fn start(reader: Reader) -> Result<JoinHandle<()>> {
    let mut channels = reader.event_keys();
    channels.extend(reader.inbox_keys());
    let messages = reader.client.message_rx();
    let reconnects = reader.client.reconnect_rx();
    subscribe(&reader, &channels).await?;
    Ok(tokio::spawn(run(reader, channels, messages, reconnects)))
}

async fn subscribe(reader: &Reader, channels: &[String]) -> Result<()> {
    let map = |err| Error::from_redis(err, "(notifier)", "SUBSCRIBE");
    if reader.sharded_pubsub {
        // One SSUBSCRIBE per channel: the channels of different shards live in different slots.
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
    let sources: HashMap<String, Source> = reader.sources();
    let mut seq = Sequences::new(&reader);
    loop {
        tokio::select! {
            message = messages.recv() => match message {
                Ok(message) => {
                    let Some(&source) = sources.get(&*message.channel) else { continue };
                    let Some(event) = message.value.as_string().as_deref().and_then(Event::from_payload) else {
                        tracing::warn!(channel = &*message.channel, "malformed event; waiters re-check");
                        reader.waiters.wake_all("malformed event");
                        continue;
                    };
                    if seq.gap(source, event.seq) {
                        reader.waiters.wake_all("pub/sub gap");
                    }
                    reader.waiters.dispatch(&event.lock_id, &event.rule);
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "pub/sub receiver lagged; waiters re-check");
                    seq.reset();
                    reader.waiters.wake_all("pub/sub lag");
                }
                Err(RecvError::Closed) => return,
            },
            reconnect = reconnects.recv() => {
                if matches!(reconnect, Err(RecvError::Closed)) {
                    return;
                }
                resubscribe(&mut reader, &channels).await;
                seq.reset();
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
