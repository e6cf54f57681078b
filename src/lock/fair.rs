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

use crate::client::LockClient;
use crate::engine::{Attempt, BoxFuture, Driver, Released};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lock::{
    acquire_reply, force_unlock_with, leave_queue, release_call, release_with, run_call,
};
use crate::notify::WaitKind;
use crate::owner::Owner;
use crate::scripts::{Key, Script, ScriptArgs, ScriptKeys, SCRIPTS};

/// The fair lock's own key (`KEYS[2]` of its scripts): the waiters' bids.
const OWN: &str = "bids";

pub(crate) struct FairDriver {
    client: LockClient,
    keys: LockKeys,
}

impl FairDriver {
    pub(crate) fn new(client: LockClient, keys: LockKeys) -> Self {
        FairDriver { keys, client }
    }

    fn script_keys(&self) -> ScriptKeys<'_> {
        ScriptKeys::new(&self.keys, OWN)
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
            let args = ScriptArgs::acquire(
                owner.id(),
                lease.as_millis() as i64,
                &op,
                &waiter,
                waiter_lease,
            )
            .events(core.event_args(&self.keys))
            .extra([core.inbox_tag.as_ref().into()]);
            let keys = self.script_keys().through(Key::Alive);
            let script: &Script = &SCRIPTS.fair_acquire;
            let reply = run_call(&self.client, &self.keys, script, keys, args).await?;
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
        let args = release_call(&self.client, owner, token, op, all)
            .events(self.client.core().event_args(&self.keys));
        let keys = self.script_keys().through(Key::Alive);
        Box::pin(release_with(
            &self.client,
            &self.keys,
            &SCRIPTS.fair_release,
            keys,
            args,
        ))
    }

    fn force_unlock(&self) -> BoxFuture<'_, Result<bool>> {
        let keys = self.script_keys().through(Key::Alive);
        Box::pin(force_unlock_with(
            &self.client,
            &self.keys,
            &SCRIPTS.fair_force_unlock,
            keys,
            vec![],
        ))
    }

    fn wait_queue(&self) -> Option<ScriptKeys<'_>> {
        Some(self.script_keys())
    }

    fn abandon(self: Arc<Self>, waiter: Arc<str>) -> Option<BoxFuture<'static, Result<()>>> {
        Some(leave_queue(
            self.client.clone(),
            self.keys.clone(),
            OWN,
            waiter,
        ))
    }
}
