//! The script registry: every `lua/*.lua` file, loaded once per server and run with `EVALSHA`.
//!
//! Scripts are compiled into the binary with `include_str!`. Those that emit release events get
//! the shared prelude `lua/notify.lua` prepended, so the event format is written once. The SHA1
//! of each final body is computed at first use; a `NOSCRIPT` reply (after `SCRIPT FLUSH`, a
//! restart or a failover to a node that never saw the script) is answered by one `EVAL` of the
//! full body, which also caches the script on that node again.

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
    fn new(name: &'static str, source: &str, emits_events: bool) -> Script {
        let body = if emits_events {
            format!("{NOTIFY_PRELUDE}\n{source}")
        } else {
            source.to_owned()
        };
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

const NOTIFY_PRELUDE: &str = include_str!("../lua/notify.lua");

/// Every script of the crate.
pub(crate) struct Scripts {
    pub(crate) mutex_acquire: Script,
    pub(crate) mutex_release: Script,
    pub(crate) mutex_force_unlock: Script,
    pub(crate) hold_renew: Script,
    pub(crate) hold_inspect: Script,
}

/// The registry, built on first use.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    mutex_acquire: Script::new(
        "mutex_acquire",
        include_str!("../lua/mutex_acquire.lua"),
        false,
    ),
    mutex_release: Script::new(
        "mutex_release",
        include_str!("../lua/mutex_release.lua"),
        true,
    ),
    mutex_force_unlock: Script::new(
        "mutex_force_unlock",
        include_str!("../lua/mutex_force_unlock.lua"),
        true,
    ),
    hold_renew: Script::new("hold_renew", include_str!("../lua/hold_renew.lua"), false),
    hold_inspect: Script::new(
        "hold_inspect",
        include_str!("../lua/hold_inspect.lua"),
        false,
    ),
});

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
        for (file, source) in [
            ("notify", NOTIFY_PRELUDE),
            ("mutex_acquire", include_str!("../lua/mutex_acquire.lua")),
            ("mutex_release", include_str!("../lua/mutex_release.lua")),
            (
                "mutex_force_unlock",
                include_str!("../lua/mutex_force_unlock.lua"),
            ),
            ("hold_renew", include_str!("../lua/hold_renew.lua")),
            ("hold_inspect", include_str!("../lua/hold_inspect.lua")),
        ] {
            assert!(
                source.starts_with(&format!("-- {file}.lua")),
                "{file}: header"
            );
            if file != "notify" {
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
            "'GET')",
            "COPY",
            "LMOVE",
            "EXPIRETIME",
        ];
        for script in [
            &SCRIPTS.mutex_acquire,
            &SCRIPTS.mutex_release,
            &SCRIPTS.mutex_force_unlock,
            &SCRIPTS.hold_renew,
            &SCRIPTS.hold_inspect,
        ] {
            for word in banned {
                assert!(!script.body.contains(word), "{} uses {word}", script.name);
            }
            assert_eq!(script.sha.len(), 40);
        }
    }
}
