//! Stream mode: `XREAD BLOCK` over this client's inboxes on the dedicated connection.
//!
//! An inbox is a stream that only this client reads: the events for its waiters (grants, and
//! the wakeups of waiters that are only woken, see `lua/lib/notify.lua`). Its tag is new with
//! the client, so its inboxes start empty; the reader reads them from `0-0` and afterwards
//! always passes the last ID it saw, so it never skips an entry that exists, across any number
//! of reconnects. An inbox is capped (`MAXLEN ~ 100`); a grant trimmed before the reader read
//! it still holds in Redis, and its waiter's next attempt is answered that the lock is its own.
//! A read that returns as many entries as the cap may have missed some: the reader reads on
//! without blocking, and once a read comes back short (the burst is over), every waiter asks
//! at once ([`INBOX_CAP`]).
//!
//! An inbox is also the client's sign of life: a release grants the lock only to waiters whose
//! client's inbox exists. So the reader creates its inboxes before the client is returned, and
//! keeps them alive ([`INBOX_TTL`], `lua/inbox_keep.lua`); the inboxes of a client that died
//! expire.

use std::collections::HashMap;
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, EventInterface, StreamsInterface};
use fred::types::config::Options;
use fred::types::Value;
use tokio::task::JoinHandle;

use super::event::Event;
use super::{backoff, Reader};
use crate::error::{Error, Result};

const BATCH: u64 = 512;

/// The cap of an inbox (`MAXLEN ~ 100` in `lua/lib/notify.lua`). Redis trims a capped stream
/// by whole nodes and never below the cap, so the entries it keeps are newer than any it
/// trimmed: if an entry the reader had not read was trimmed, every entry left is unread, and
/// the next read returns at least this many. A read that returns fewer lost nothing.
const INBOX_CAP: usize = 100;

/// Whether a read that returned `entries` entries of one inbox may have missed some that were
/// trimmed before it (see [`INBOX_CAP`]).
fn may_have_lost_entries(entries: usize) -> bool {
    entries >= INBOX_CAP
}

/// How long an inbox outlives the last refresh by its reader, which refreshes it every third
/// of this: the time after which the waiters of a client that died without leaving its queues
/// are passed over.
pub(crate) const INBOX_TTL: Duration = Duration::from_secs(30);

/// Creates the inboxes that do not exist and refreshes the ttl of every one.
pub(crate) async fn keep_inboxes(client: &Client, inboxes: &[String]) -> Result<()> {
    let script = &crate::scripts::SCRIPTS.inbox_keep;
    let ttl = Value::from(INBOX_TTL.as_millis() as i64);
    for inbox in inboxes {
        let created = script
            .run(client, &[inbox.as_str().into()], std::slice::from_ref(&ttl))
            .await
            .map_err(|err| Error::from_redis(err, "(notifier)", inbox))?;
        if crate::scripts::int_array(script.name(), created)? != [0] {
            tracing::debug!(inbox, "inbox created");
        }
    }
    Ok(())
}

/// Creates the inboxes and spawns the reader.
pub(crate) async fn start(reader: Reader) -> Result<JoinHandle<()>> {
    let keys = reader.inbox_keys();
    keep_inboxes(&reader.client, &keys).await?;
    let ids = vec!["0-0".to_owned(); keys.len()];
    spawn_reconnect_watch(&reader);
    Ok(tokio::spawn(run(reader, keys, ids)))
}

/// Every reconnect of the notifier connection makes every local waiter re-check.
fn spawn_reconnect_watch(reader: &Reader) {
    let mut reconnects = reader.client.reconnect_rx();
    let waiters = reader.waiters.clone();
    let mut shutdown = reader.shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                event = reconnects.recv() => match event {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        waiters.wake_all("notifier reconnected");
                    }
                    Err(_) => return,
                },
                _ = shutdown.changed() => return,
            }
        }
    });
}

async fn run(mut reader: Reader, keys: Vec<String>, mut ids: Vec<String>) {
    let position: HashMap<String, usize> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| (key.clone(), i))
        .collect();
    // Wake up in time to refresh the inboxes, whatever the configured block.
    let block = reader.config.notifier_block.min(INBOX_TTL / 3);
    let options = Options {
        timeout: Some(block + reader.config.command_timeout),
        ..Options::default()
    };
    let client = reader.client.with_options(&options);
    let mut inboxes_kept = tokio::time::Instant::now();
    let mut failures = 0u32;
    // A read came back full (see `INBOX_CAP`): every waiter is woken once the burst is over.
    let mut missed = false;
    loop {
        if inboxes_kept.elapsed() >= INBOX_TTL / 3 {
            match keep_inboxes(&reader.client, &keys).await {
                Ok(()) => inboxes_kept = tokio::time::Instant::now(),
                Err(error) => tracing::warn!(%error, "could not refresh the inboxes"),
            }
        }
        // After a full read, read on without blocking until a read comes back short.
        let block_ms = (!missed).then_some(block.as_millis() as u64);
        let read = client.xread::<Value, _, _>(Some(BATCH), block_ms, keys.clone(), ids.clone());
        let reply = tokio::select! {
            reply = read => reply,
            _ = reader.shutdown.changed() => return,
        };
        match reply {
            Ok(value) => {
                failures = 0;
                let (mut malformed, mut full) = (false, false);
                for (key, entries) in streams(value) {
                    let Some(&slot) = position.get(&key) else {
                        continue;
                    };
                    full |= may_have_lost_entries(entries.len());
                    for (id, event) in entries {
                        ids[slot] = id;
                        match event {
                            Some(event) => reader.waiters.dispatch(&event.lock_id, &event.rule),
                            None => malformed = true,
                        }
                    }
                }
                if malformed {
                    tracing::warn!("malformed inbox entry: every waiter re-checks");
                    reader.waiters.wake_all("malformed event");
                } else if missed && !full {
                    // A burst filled an inbox to its cap between two reads, so events may have
                    // been trimmed unread; it is over now. Their grants still hold in Redis, and
                    // each waiter's next attempt finds its own: woken once for the whole burst
                    // (not at every full read, which would make the waiters not yet granted
                    // ask again and again), instead of sleeping until its bound.
                    reader
                        .waiters
                        .wake_all("inbox was full: events may have been trimmed");
                }
                missed = full || (missed && malformed);
                // Let the waiters just woken run before the next read: sending it wakes fred's
                // connection task, which the scheduler would otherwise run first (a woken task
                // takes the worker's next slot), delaying every hand-off by one socket write.
                // Entries that arrive meanwhile wait in the stream; nothing is missed.
                tokio::task::yield_now().await;
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, failures, "stream read failed; waiters re-check");
                reader.waiters.wake_all("stream read error");
                missed = false;
                let pause = backoff(failures, reader.config.reconnect_max_delay);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = reader.shutdown.changed() => return,
                }
            }
        }
        if *reader.shutdown.borrow() {
            return;
        }
    }
}

/// A stream entry: its id and the event it carries (None when malformed).
type Entry = (String, Option<Event>);

/// Flattens an XREAD reply (RESP2 array or RESP3 map) to (stream, entries).
fn streams(value: Value) -> Vec<(String, Vec<Entry>)> {
    let pairs: Vec<(Value, Value)> = match value {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let entries = kv.pop()?;
                    let key = kv.pop()?;
                    Some((key, entries))
                }
                _ => None,
            })
            .collect(),
        Value::Map(map) => map
            .inner()
            .into_iter()
            .map(|(key, entries)| (Value::from(key), entries))
            .collect(),
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter_map(|(key, entries)| {
            let key = key.as_string()?;
            let Value::Array(entries) = entries else {
                return None;
            };
            Some((key, entries.into_iter().filter_map(entry).collect()))
        })
        .collect()
}

/// One stream entry `[id, ["e", event]]`; the event is None when malformed.
fn entry(value: Value) -> Option<Entry> {
    let Value::Array(mut parts) = value else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let fields = parts.pop()?;
    let id = parts.pop()?.as_string()?;
    let event = match fields {
        Value::Array(fields) => match fields.as_slice() {
            [name, payload] if name.as_str().as_deref() == Some("e") => {
                payload.as_str().as_deref().and_then(Event::from_payload)
            }
            _ => None,
        },
        _ => None,
    };
    Some((id, event))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::event::{Granted, WakeRule};

    #[test]
    fn a_read_that_fills_the_cap_may_have_missed_trimmed_entries() {
        assert!(!may_have_lost_entries(0));
        assert!(!may_have_lost_entries(INBOX_CAP - 1));
        assert!(may_have_lost_entries(INBOX_CAP));
        assert!(may_have_lost_entries(BATCH as usize));
    }

    #[test]
    fn the_cap_is_the_one_the_scripts_apply() {
        let notify = include_str!("../../lua/lib/notify.lua");
        let cap = format!("'MAXLEN', '~', '{INBOX_CAP}'");
        assert_eq!(
            notify.matches(&cap).count(),
            2,
            "{cap} in lua/lib/notify.lua"
        );
    }

    fn fields(pairs: &[&str]) -> Value {
        Value::Array(pairs.iter().map(|s| Value::from(*s)).collect())
    }

    #[test]
    fn entries_carry_the_event_string() {
        let grant = Value::Array(vec![
            Value::from("7-0"),
            fields(&["e", "0|grant|w1,9,3000,0|mutex:a"]),
        ]);
        let (id, event) = entry(grant).expect("entry");
        assert_eq!(id, "7-0");
        let event = event.expect("event");
        assert_eq!(event.lock_id, "mutex:a");
        let granted = Granted {
            token: 9,
            lasts_ms: 3000,
            queued: 0,
        };
        assert_eq!(event.rule, WakeRule::Grant("w1".into(), granted));
        for broken in [
            fields(&["e", "x|one||mutex:a"]),
            fields(&["s", "5", "l", "mutex:a", "r", "one", "t", ""]),
            fields(&["e"]),
            Value::from("e"),
        ] {
            let broken = Value::Array(vec![Value::from("9-0"), broken]);
            assert_eq!(entry(broken), Some(("9-0".to_owned(), None)));
        }
    }
}
