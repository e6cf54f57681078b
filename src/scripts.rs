//! The script registry: every `lua/*.lua` file, loaded once per server and run with `EVALSHA`.
//!
//! Scripts are compiled into the binary with `include_str!`. Shared Lua functions live in the
//! library preludes of `lua/lib/` (hold bookkeeping, the wait queue, event emission); each
//! script lists the libraries it uses and gets them prepended, so each rule is written once.
//! The SHA1 of each final body is computed at first use; a `NOSCRIPT` reply (after `SCRIPT
//! FLUSH`, a restart or a failover to a node that never saw the script) is answered by one
//! `EVAL` of the full body, which also caches the script on that node again.

use std::sync::LazyLock;

use fred::clients::Client;
use fred::interfaces::LuaInterface;
use fred::types::Value;

/// One Lua script.
pub(crate) struct Script {
    name: &'static str,
    body: String,
    sha: String,
}

impl Script {
    /// A script made of the type checks, the given library preludes and its own source.
    fn new(name: &'static str, source: &str, libraries: &[&str]) -> Script {
        let mut body = String::from(CHECK);
        body.push('\n');
        for library in libraries {
            body.push_str(library);
            body.push('\n');
        }
        body.push_str(source);
        let sha = fred::util::sha1_hash(&body);
        Script { name, body, sha }
    }

    /// The script's file name without extension (for errors and traces).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the script with `EVALSHA`, falling back to `EVAL` once when the server lost it.
    pub(crate) async fn run(
        &self,
        client: &Client,
        keys: Vec<String>,
        args: Vec<Value>,
    ) -> Result<Value, fred::error::Error> {
        match client
            .evalsha::<Value, _, _, _>(self.sha.as_str(), keys.clone(), args.clone())
            .await
        {
            Err(err) if err.details().starts_with("NOSCRIPT") => {
                tracing::debug!(
                    script = self.name,
                    "script not cached on the server, reloading"
                );
                client.eval(self.body.as_str(), keys, args).await
            }
            other => other,
        }
    }
}

/// Library preludes (`lua/lib/`): shared Lua functions, written once.
const CHECK: &str = include_str!("../lua/lib/check.lua");
const NOTIFY: &str = include_str!("../lua/lib/notify.lua");
const HOLD: &str = include_str!("../lua/lib/hold.lua");
const QUEUE: &str = include_str!("../lua/lib/queue.lua");
const RW: &str = include_str!("../lua/lib/rw.lua");
const FAIR: &str = include_str!("../lua/lib/fair.lua");
const FENCE: &str = include_str!("../lua/lib/fence.lua");

macro_rules! scripts {
    ($($field:ident: [$($lib:ident),*]),* $(,)?) => {
        /// Every script of the crate, one per state change (plus read-only inspection).
        pub(crate) struct Scripts {
            $(pub(crate) $field: Script,)*
        }

        /// The registry, built on first use.
        pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $($field: Script::new(
                stringify!($field),
                include_str!(concat!("../lua/", stringify!($field), ".lua")),
                &[$($lib),*],
            ),)*
        });

        /// (file name, source) of every script, for the header checks.
        #[cfg(test)]
        const SOURCES: &[(&str, &str)] = &[
            $((stringify!($field), include_str!(concat!("../lua/", stringify!($field), ".lua"))),)*
            ("check", CHECK),
            ("notify", NOTIFY),
            ("hold", HOLD),
            ("queue", QUEUE),
            ("rw", RW),
            ("fair", FAIR),
            ("fence", FENCE),
        ];

        impl Scripts {
            #[cfg(test)]
            fn all(&self) -> Vec<&Script> {
                vec![$(&self.$field),*]
            }
        }
    };
}

scripts! {
    mutex_acquire: [HOLD, FENCE],
    mutex_release: [HOLD, FENCE, NOTIFY],
    mutex_force_unlock: [HOLD, NOTIFY],
    fair_acquire: [HOLD, FENCE, QUEUE, NOTIFY, FAIR],
    fair_release: [HOLD, FENCE, QUEUE, NOTIFY, FAIR],
    fair_leave: [QUEUE, NOTIFY, RW],
    fair_heartbeat: [QUEUE, NOTIFY, RW],
    fair_force_unlock: [HOLD, FENCE, QUEUE, NOTIFY, FAIR],
    rw_acquire: [FENCE, QUEUE, NOTIFY, RW],
    rw_release: [QUEUE, NOTIFY, RW],
    rw_renew: [QUEUE, NOTIFY, RW],
    rw_inspect: [QUEUE],
    rw_force_unlock: [QUEUE, NOTIFY, RW],
    hold_renew: [],
    hold_inspect: [],
}

/// Reads a script reply that must be an array of integers.
pub(crate) fn int_array(script: &'static str, value: Value) -> crate::Result<Vec<i64>> {
    let protocol = |detail: String| crate::Error::Protocol { script, detail };
    match value {
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Integer(i) => Ok(i),
                other => Err(protocol(format!("expected integers, got {other:?}"))),
            })
            .collect(),
        other => Err(protocol(format!("expected an array, got {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_documents_keys_argv_and_return() {
        for (file, source) in SOURCES {
            assert!(
                source.starts_with(&format!("-- {file}.lua")),
                "{file}: header"
            );
            let library =
                ["check", "notify", "hold", "queue", "rw", "fair", "fence"].contains(file);
            if !library {
                for word in ["KEYS", "ARGV", "Returns"] {
                    assert!(source.contains(word), "{file}: header lacks {word}");
                }
            }
        }
    }

    #[test]
    fn scripts_use_only_redis_5_commands() {
        let banned = [
            "GETDEL",
            "LPOS",
            "XAUTOCLAIM",
            "MINID",
            "'GT'",
            "'LT'",
            "COPY",
            "LMOVE",
            "EXPIRETIME",
            "ZRANGESTORE",
            "'KEEPTTL'",
        ];
        for script in SCRIPTS.all() {
            for word in banned {
                assert!(!script.body.contains(word), "{} uses {word}", script.name);
            }
            assert_eq!(script.sha.len(), 40);
        }
    }
}
