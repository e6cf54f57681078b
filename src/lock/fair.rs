//! The fair (FIFO) driver behind [`LockClient::fair_mutex`](crate::LockClient::fair_mutex).
//!
//! Waiters queue in Redis (`lua/lib/queue.lua`): a LIST gives the order, a ZSET of waiter
//! leases tells the living from the dead, a HASH of bids says what each waiter asks for. The
//! lock goes to the first live waiter: a release *grants* it to that waiter (takes the hold in
//! its name) and names it in a `grant` event sent to the inbox of the waiter's client alone
//! (the bid carries the client's inbox tag), so only it wakes, and its `lock()` returns
//! without another script call (`lua/lib/fair.lua`, the engine's grant path). Waiters keep
//! their place alive through the client's batched heartbeat ([`crate::queue`]) and leave it
//! on timeout or cancellation (freeing a grant they never took up).

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::client::LockClient;
use crate::engine::{Attempt, BoxFuture, Driver, Released};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lock::{acquire_reply, force_unlock_with, release_with, run_fenced_ints, QueueKeys};
use crate::notify::WaitKind;
use crate::owner::Owner;
use crate::scripts::{Script, SCRIPTS};

pub(crate) struct FairDriver {
    client: LockClient,
    keys: LockKeys,
    queue: QueueKeys,
    fence: String,
}

impl FairDriver {
    pub(crate) fn new(client: LockClient, keys: LockKeys) -> Self {
        FairDriver {
            queue: QueueKeys::new(&keys),
            fence: keys.fence().to_owned(),
            keys,
            client,
        }
    }

    /// The keys of the scripts that free the lock and grant it to the head: hold, queue,
    /// alive, events, seq, bids, fence.
    fn granting(&self) -> Vec<String> {
        let mut keys = self.queue.handoff(&self.keys);
        keys.push(self.fence.clone());
        keys
    }
}

impl Driver for FairDriver {
    fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn client(&self) -> &LockClient {
        &self.client
    }

    fn wait_kind(&self) -> WaitKind {
        WaitKind::Exclusive
    }

    fn try_acquire(
        self: Arc<Self>,
        owner: Owner,
        waiter: Arc<str>,
        op: String,
        lease: Duration,
        waiting: bool,
    ) -> BoxFuture<'static, Result<Attempt>> {
        Box::pin(async move {
            let core = self.client.core();
            let waiter_lease = if waiting {
                core.config.waiter_lease.as_millis() as i64
            } else {
                0
            };
            let mut args: Vec<Value> = vec![
                owner.id().into(),
                (lease.as_millis() as i64).into(),
                op.into(),
                waiter.as_ref().into(),
                waiter_lease.into(),
            ];
            args.extend(core.event_args(&self.keys));
            args.push(core.inbox_tag.as_ref().into());
            let mut keys = self.queue.handoff(&self.keys);
            keys.insert(1, self.fence.clone()); // hold, fence, queue, alive, events, seq, bids
            let script: &Script = &SCRIPTS.fair_acquire;
            let reply = run_fenced_ints(&self.client, script, self.keys.name(), keys, args).await?;
            acquire_reply(&self.client, script, &reply)
        })
    }

    fn release<'a>(
        &'a self,
        owner: &'a Owner,
        token: u64,
        op: &'a str,
        all: bool,
    ) -> BoxFuture<'a, Result<Released>> {
        let keys = self.granting();
        Box::pin(release_with(
            &self.client,
            &self.keys,
            &SCRIPTS.fair_release,
            keys,
            owner,
            token,
            op,
            all,
            vec![self.client.core().layout.fence_arg(false)],
        ))
    }

    fn force_unlock(&self) -> BoxFuture<'_, Result<bool>> {
        let keys = self.granting();
        Box::pin(force_unlock_with(
            &self.client,
            &self.keys,
            &SCRIPTS.fair_force_unlock,
            keys,
            vec![self.client.core().layout.fence_arg(false)],
        ))
    }

    fn wait_queue(&self) -> Option<(&'static Script, [String; 4])> {
        self.queue.heartbeat()
    }

    fn abandon(self: Arc<Self>, waiter: Arc<str>) -> Option<BoxFuture<'static, Result<()>>> {
        Some(
            self.queue
                .leave(self.client.clone(), self.keys.clone(), waiter),
        )
    }
}
