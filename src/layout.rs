//! The layout of a key prefix, and how a client makes sure it never works on a prefix laid out
//! differently from its own.
//!
//! The shard count and the notification mode decide where a lock's keys and events live: two
//! clients that disagree on them would each see only their own holds of the same name. So the
//! first client of a prefix records its layout in `{P:layout}`, and a client configured
//! differently is refused ([`Error::LayoutMismatch`]).
//!
//! A record in Redis can be lost with the rest of the data (a restart without persistence,
//! `FLUSHALL`, a failover to an empty replica), and then the next client would record its own,
//! different layout. Two things close that gap:
//!
//! * every shard's fence key carries the layout as a stamp (`lua/lib/fence.lua`), so a script
//!   refuses a client whose layout differs from the stamp;
//! * a script that finds the fence key *missing* (the trace of a data loss, or the shard's
//!   first use) issues no token: it asks its client to check the record first
//!   ([`Layout::verify`], which records it again when it is gone), and only then creates the
//!   key. After a loss, the first client back records the layout; any client laid out
//!   differently is refused at its first token, whichever of them connects first.
//!
//! A client that finds another layout recorded stops working: every hold it keeps is reported
//! lost, and every acquisition fails with [`Error::LayoutMismatch`].

use std::sync::{Arc, OnceLock};

use fred::clients::Client;
use fred::interfaces::KeysInterface;
use fred::types::{SetOptions, Value};

use crate::config::{Config, NotificationMode};
use crate::error::{Error, Result};
use crate::keys::Keyspace;

/// Version of the key layout; part of the record, so clients of another layout version are
/// refused too.
const VERSION: &str = "v12";

/// One client's layout and what it knows of the server's.
#[derive(Debug)]
pub(crate) struct Layout {
    prefix: String,
    key: String,
    ours: Arc<str>,
    /// [`Layout::fence_arg`] of `false` and `true`, built once (a token-issuing script takes
    /// it on every call).
    fence_args: [Value; 2],
    /// The layout the server recorded, once it differs from ours: the client is then refused.
    refused: OnceLock<String>,
}

impl Layout {
    pub(crate) fn new(config: &Config, keyspace: &Keyspace) -> Layout {
        let ours: Arc<str> = format!(
            "{VERSION} shards={} notification={}",
            keyspace.shards(),
            config.notification.as_str()
        )
        .into();
        Layout {
            prefix: config.key_prefix.clone(),
            key: keyspace.layout(),
            fence_args: [0, 1].map(|verified| format!("{verified}{ours}").into()),
            ours,
            refused: OnceLock::new(),
        }
    }

    /// The record's key, `{P:layout}`.
    /// The record this client writes (and expects) under the prefix.
    pub(crate) fn text(&self) -> &str {
        &self.ours
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The fence argument of a token-issuing script: `"<0|1><layout>"`, 1 when the caller has
    /// just verified the record, so that a missing fence key may be created.
    pub(crate) fn fence_arg(&self, verified: bool) -> Value {
        self.fence_args[usize::from(verified)].clone()
    }

    /// Records our layout if the prefix has none, and checks the recorded one. A mismatch
    /// refuses this client for good (see [`Layout::refuse`]); the caller then stops its holds.
    pub(crate) async fn verify(&self, redis: &Client) -> Result<()> {
        self.check_open()?;
        let map = |err| Error::from_redis(err, "(layout)", &self.key);
        let _: Value = redis
            .set(
                self.key.as_str(),
                self.ours.as_ref(),
                None,
                Some(SetOptions::NX),
                false,
            )
            .await
            .map_err(map)?;
        let server: Option<String> = redis.get(self.key.as_str()).await.map_err(map)?;
        match server {
            Some(server) if *server != *self.ours => Err(self.refuse(server)),
            _ => Ok(()),
        }
    }

    /// Marks this client refused: the server's layout is `server`. Returns the error to report.
    pub(crate) fn refuse(&self, server: String) -> Error {
        if self.refused.set(server).is_ok() {
            tracing::error!(
                prefix = %self.prefix,
                server = %self.refused.get().map_or("", String::as_str),
                ours = %self.ours,
                "another layout is recorded under this prefix; this client stops"
            );
        }
        self.mismatch()
    }

    /// Whether this client was refused.
    pub(crate) fn is_refused(&self) -> bool {
        self.refused.get().is_some()
    }

    /// `Err(LayoutMismatch)` once this client was refused.
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.is_refused() {
            Err(self.mismatch())
        } else {
            Ok(())
        }
    }

    fn mismatch(&self) -> Error {
        Error::LayoutMismatch {
            prefix: self.prefix.clone(),
            server: self.refused.get().cloned().unwrap_or_default(),
            ours: self.ours.to_string(),
        }
    }
}

/// The shard count and notification mode of a layout record (`Layout`'s text: `"<version>
/// shards=<n> notification=<mode>"`) of this version; None for another version's record or
/// text that is no record.
pub(crate) fn recorded_layout(text: &str) -> Option<(u16, NotificationMode)> {
    let mut words = text.split(' ');
    if words.next()? != VERSION {
        return None;
    }
    let shards = words.next()?.strip_prefix("shards=")?.parse().ok()?;
    let notification = match words.next()?.strip_prefix("notification=")? {
        "stream" => NotificationMode::Stream,
        "pubsub" => NotificationMode::PubSub,
        _ => return None,
    };
    words.next().is_none().then_some((shards, notification))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keyspace;

    #[test]
    fn a_record_gives_back_its_layout() {
        for (shards, mode) in [
            (1, NotificationMode::Stream),
            (16, NotificationMode::PubSub),
        ] {
            let mut config = Config::new("redis://127.0.0.1:1");
            config.shards = shards;
            config.notification = mode;
            let layout = Layout::new(&config, &Keyspace::new("p", shards, false));
            assert_eq!(recorded_layout(&layout.ours), Some((shards, mode)));
        }
        for foreign in [
            "",
            "v11 shards=1 notification=stream",
            "v12 shards=x notification=stream",
            "v12 shards=1 notification=poll",
            "v12 shards=1 notification=stream extra",
        ] {
            assert_eq!(recorded_layout(foreign), None, "{foreign:?}");
        }
    }
}
