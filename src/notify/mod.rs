//! Push notifications: one reader per process, one local waiter queue per lock.
//!
//! Scripts that free a lock while someone may be waiting emit one event (see `lua/lib/notify.lua`)
//! into their shard's stream or channel, atomically with the state change. Each process runs a
//! single reader ([`stream`] or [`pubsub`]) on its own connection; it turns every event into a
//! wakeup of the *local* waiters of that lock, kept in [`WaiterTable`] (a `DashMap` from lock id
//! to a FIFO queue). So a process uses a fixed number of connections however many tasks wait,
//! and a waiter wakes when the lock is freed rather than when a poll interval ends.
//!
//! ## No lost wakeups
//!
//! A waiter is registered in the table *before* its acquire attempt, so an event for a release
//! that happens after the attempt finds it. Readers never skip events silently: every event
//! carries its shard's sequence number, and a jump (trimmed stream, dropped message), a read
//! error or a reconnect wakes every local waiter to re-check at once. Finally every wait is
//! bounded by the remaining lease the attempt reported, so even an event that never comes
//! costs at most one lease. A woken waiter that is dropped before it could try passes its
//! wakeup on to the next one, and leaving the Redis queue (`hold_leave.lua`, `rw_leave.lua`)
//! passes on a hold a release granted it meanwhile.
//!
//! ## What lives where
//!
//! * [`event`]: the wire format `seq|rule|target|lock id` and its parsing into an
//!   [`Event`](event::Event) with a [`WakeRule`];
//! * [`sequence`]: the sequence numbers of each shard and inbox, and the gaps in them;
//! * [`waiters`]: the [`WaiterTable`], registration, the wake rules, passing a wakeup on;
//! * [`handover`]: a release that hands the lock to a waiter of its own process (barging
//!   mutex), and the state machine that settles who releases a hold never taken up;
//! * [`stream`] and [`pubsub`]: the two readers, one per transport;
//! * here: [`Reader`], what either reader task needs, the [`backoff`] both use, and
//!   [`hang_up`], which closes a notifier connection.

mod event;
mod handover;
pub(crate) mod pubsub;
mod sequence;
pub(crate) mod stream;
mod waiters;

use std::sync::Arc;
use std::time::Duration;

// What the rest of the crate uses, so that it need not know how this module is split.
pub(crate) use event::{Granted, WakeRule};
pub(crate) use handover::{Bid, Claim, HandedOver};
pub(crate) use waiters::{Registration, WaiterTable};

use sequence::Source;

/// Everything an event reader task needs.
pub(crate) struct Reader {
    /// The dedicated notifier connection.
    pub(crate) client: fred::clients::Client,
    pub(crate) keyspace: crate::keys::Keyspace,
    /// The shards this reader covers.
    pub(crate) shards: Vec<u16>,
    /// Subscribe with `SSUBSCRIBE` (Redis Cluster) instead of `SUBSCRIBE`.
    pub(crate) sharded_pubsub: bool,
    /// This client's inbox tag: the reader also reads the client's inbox of each of its shards.
    pub(crate) inbox_tag: Arc<str>,
    pub(crate) waiters: Arc<WaiterTable>,
    pub(crate) config: crate::config::Config,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Reader {
    /// The event keys (streams or channels) of this reader's shards, in the order of `shards`.
    pub(crate) fn event_keys(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|&shard| self.keyspace.events(shard))
            .collect()
    }

    /// This client's inboxes (streams or channels) on this reader's shards, in the order of
    /// `shards`, without repeats (without Redis Cluster, every shard shares one events key and
    /// one inbox): the grants for its waiters, sent to it alone.
    pub(crate) fn inbox_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for &shard in &self.shards {
            let key = self.keyspace.inbox(shard, &self.inbox_tag);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// Maps every key (stream or channel) this reader reads to where its events come from.
    pub(crate) fn sources(&self) -> std::collections::HashMap<String, Source> {
        let shards = self.shards.iter().map(|&shard| {
            (
                self.keyspace.events(shard),
                Source::Shard(usize::from(shard)),
            )
        });
        let inboxes = self
            .inbox_keys()
            .into_iter()
            .map(|inbox| (inbox, Source::Inbox));
        shards.chain(inboxes).collect()
    }
}

/// Closes a notifier connection at once, interrupting a blocked `XREAD` first (a `QUIT`
/// queued behind it would otherwise wait for the block to time out).
pub(crate) async fn hang_up(notifier: &fred::clients::Client) {
    use fred::interfaces::{ClientInterface, ClientLike};
    let _ = notifier.unblock_self(None).await;
    let _ = notifier.quit().await;
}

/// Backoff between failed reads: 50 ms doubling up to the configured reconnect delay.
pub(crate) fn backoff(failures: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(50).saturating_mul(1 << failures.min(10));
    base.min(max)
}
