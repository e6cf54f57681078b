//! Push notifications: one reader per process, one local waiter queue per lock.
//!
//! A script that grants a lock to a queued waiter (or wakes one) writes one event, atomically
//! with the state change, into the **inbox** of that waiter's client: a stream or a channel
//! beside the lock's shard, named with the client's random tag (`lua/lib/notify.lua`). No
//! event goes anywhere else, so a release wakes exactly the process it concerns. Each process
//! runs a single reader ([`stream`] or [`pubsub`]) on its own connection, over its own inboxes;
//! it turns every event into a wakeup of the *local* waiters it names, kept in [`WaiterTable`]
//! (a `DashMap` from lock id to a FIFO queue). So a process uses a fixed number of connections
//! however many tasks wait, and a waiter wakes when the lock is granted rather than when a poll
//! interval ends.
//!
//! ## No lost wakeups
//!
//! A waiter is registered in the table *before* its acquire attempt, so an event for a release
//! that happens after the attempt finds it. A read error, a reconnect, a lagging Pub/Sub receiver
//! or a malformed event wakes every local waiter to re-check at once. A grant whose event is
//! lost (an inbox trimmed behind a stalled reader, a message published while the subscriber
//! was away) is not lost with it: the hold is written in the waiter's name, and its next attempt
//! is answered that the lock is its own (`lua/hold_acquire.lua`). Finally every wait is
//! bounded by the remaining lease the attempt reported, so even an event that never comes
//! costs at most one lease. A woken waiter that is dropped before it could try passes its
//! wakeup on to the next one, and leaving the Redis queue (`hold_leave.lua`, `rw_leave.lua`)
//! passes on a hold a release granted it meanwhile.
//!
//! ## What lives where
//!
//! * [`event`]: the wire format `0|rule|target|lock id` and its parsing into an
//!   [`Event`](event::Event) with a [`WakeRule`];
//! * [`waiters`]: the [`WaiterTable`], registration, the wake rules, passing a wakeup on;
//! * [`handover`]: a release that hands the lock to a waiter of its own process (barging
//!   mutex), and the state machine that settles who releases a hold never taken up;
//! * [`stream`] and [`pubsub`]: the two readers, one per transport;
//! * here: [`Reader`], what either reader task needs, the [`backoff`] both use, and
//!   [`hang_up`], which closes a notifier connection.

mod event;
mod handover;
pub(crate) mod pubsub;
pub(crate) mod stream;
mod waiters;

use std::sync::Arc;
use std::time::Duration;

// What the rest of the crate uses, so that it need not know how this module is split.
pub(crate) use event::{Granted, WakeRule};
pub(crate) use handover::{Bid, Claim, HandedOver};
pub(crate) use waiters::{Registration, WaiterTable};

/// Everything an event reader task needs.
pub(crate) struct Reader {
    /// The dedicated notifier connection.
    pub(crate) client: fred::clients::Client,
    pub(crate) keyspace: crate::keys::Keyspace,
    /// The shards this reader covers.
    pub(crate) shards: Vec<u16>,
    /// Subscribe with `SSUBSCRIBE` (Redis Cluster) instead of `SUBSCRIBE`.
    pub(crate) sharded_pubsub: bool,
    /// This client's inbox tag: the reader reads the client's inbox of each of its shards.
    pub(crate) inbox_tag: Arc<str>,
    pub(crate) waiters: Arc<WaiterTable>,
    pub(crate) config: crate::config::Config,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Reader {
    /// This client's inboxes (streams or channels) on this reader's shards, in the order of
    /// `shards`, without repeats (without Redis Cluster, every shard shares one events key and
    /// so one inbox): every event for this client's waiters, sent to it alone.
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
