//! The fair (FIFO) driver behind [`LockClient::fair_mutex`](crate::LockClient::fair_mutex).
//!
//! Waiters queue in Redis (`lua/lib/queue.lua`): a LIST gives the order, a ZSET of waiter
//! leases tells the living from the dead. The lock goes to the first live waiter; a release
//! names that waiter in its event, so only it wakes. Waiters keep their place alive through the
//! client's batched heartbeat ([`crate::queue`]) and leave it on timeout or cancellation.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;

use crate::client::LockClient;
use crate::engine::{Attempt, BoxFuture, Driver, Released};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lock::{acquire_reply, flag_reply, release_args, release_reply, run_ints};
use crate::notify::WaitKind;
use crate::owner::Owner;
use crate::scripts::{Script, SCRIPTS};

pub(crate) struct FairDriver {
    client: LockClient,
    keys: LockKeys,
    hold: String,
    fence: String,
    queue: String,
    alive: String,
}

impl FairDriver {
    pub(crate) fn new(client: LockClient, keys: LockKeys) -> Self {
        FairDriver {
            hold: keys.key(""),
            fence: keys.key("fence"),
            queue: keys.key("queue"),
            alive: keys.key("alive"),
            keys,
            client,
        }
    }

    /// hold, queue, alive, events, seq: the keys of every script that may hand the turn on.
    fn handoff_keys(&self) -> Vec<String> {
        vec![
            self.hold.clone(),
            self.queue.clone(),
            self.alive.clone(),
            self.keys.events().to_owned(),
            self.keys.seq().to_owned(),
        ]
    }

    async fn run(&self, script: &Script, keys: Vec<String>, args: Vec<Value>) -> Result<Vec<i64>> {
        run_ints(&self.client, script, self.keys.name(), keys, args).await
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
            let keys = vec![
                self.hold.clone(),
                self.fence.clone(),
                self.queue.clone(),
                self.alive.clone(),
                self.keys.events().to_owned(),
                self.keys.seq().to_owned(),
            ];
            let script = &SCRIPTS.fair_acquire;
            let reply = self.run(script, keys, args).await?;
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
        Box::pin(async move {
            let mut args = release_args(&self.client, owner, token, op, all);
            args.extend(self.client.core().event_args(&self.keys));
            let script = &SCRIPTS.fair_release;
            let reply = self.run(script, self.handoff_keys(), args).await?;
            release_reply(script, &reply)
        })
    }

    fn force_unlock(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let script = &SCRIPTS.fair_force_unlock;
            let args = self.client.core().event_args(&self.keys);
            let reply = self.run(script, self.handoff_keys(), args).await?;
            flag_reply(script, &reply)
        })
    }

    fn renew_script(&self) -> &'static Script {
        &SCRIPTS.hold_renew
    }

    fn renew_keys(&self) -> Vec<String> {
        vec![self.hold.clone()]
    }

    fn wait_queue(&self) -> Option<(&'static Script, [String; 3])> {
        Some((
            &SCRIPTS.fair_heartbeat,
            [self.hold.clone(), self.queue.clone(), self.alive.clone()],
        ))
    }

    fn abandon(self: Arc<Self>, waiter: Arc<str>) -> Option<BoxFuture<'static, Result<()>>> {
        Some(Box::pin(async move {
            let mut args: Vec<Value> = vec![waiter.as_ref().into()];
            args.extend(self.client.core().event_args(&self.keys));
            let script = &SCRIPTS.fair_leave;
            let reply = self.run(script, self.handoff_keys(), args).await?;
            let left = flag_reply(script, &reply)?;
            tracing::debug!(lock = self.keys.name(), left, "left the wait queue");
            Ok(())
        }))
    }
}
