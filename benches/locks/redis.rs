//! Redis clients and what the bench reads from the server: `INFO` sections, `CLIENT LIST`,
//! key cleanup.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::{ClusterHash, CustomCommand, InfoKind};
use fredlock::{Config, LockClient, NotificationMode};
use serde_json::{json, Value as Json};

use crate::measure::{round, round2};

/// Anything that should take well under a second; only a hang exceeds it.
pub const HANG: Duration = Duration::from_secs(30);

/// The URL with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

pub fn config(url: &str, mode: NotificationMode, prefix: &str, shards: u16) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config.shards = shards;
    config
}

/// The default shard count of the crate (the clients of S3 and fair-handoff use 1).
pub const DEFAULT_SHARDS: u16 = 16;

pub async fn connect_with(
    url: &str,
    mode: NotificationMode,
    prefix: &str,
    shards: u16,
) -> Result<LockClient, String> {
    LockClient::connect(config(url, mode, prefix, shards))
        .await
        .map_err(|err| format!("cannot connect the lock client to {}: {err}", redact(url)))
}

pub async fn connect(
    url: &str,
    mode: NotificationMode,
    prefix: &str,
) -> Result<LockClient, String> {
    connect_with(url, mode, prefix, DEFAULT_SHARDS).await
}

pub async fn shutdown(locks: &LockClient) -> Result<(), String> {
    locks
        .shutdown()
        .await
        .map_err(|err| format!("shutdown failed: {err}"))
}

/// A plain fred client (no locks), e.g. for cleanup.
pub async fn plain_client(url: &str) -> Result<Client, String> {
    let client = Client::new(
        fred::types::config::Config::from_url(url)
            .map_err(|err| format!("bad REDIS_URL {}: {err}", redact(url)))?,
        None,
        None,
        None,
    );
    client
        .init()
        .await
        .map_err(|err| format!("cannot connect a plain client: {err}"))?;
    Ok(client)
}

/// A counter key under the run's prefix, so that the cleanup finds it.
pub fn counter_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:bench}}:counter:{name}")
}

/// The hash of a fair lock of a client with `shards = 1` (see `src/keys.rs`): its field `q`
/// is the wait queue, one line per waiter (`lua/lib/hold.lua`).
pub fn fair_hold_key(prefix: &str, name: &str) -> String {
    format!("{{{prefix}:0}}:fair:{name}")
}

/// `INFO commandstats`: command name → (calls, server µs). Commands called from scripts are
/// counted too (as well as the `EVALSHA` that ran them).
#[derive(Debug, Clone, Default)]
pub struct CommandStats {
    pub commands: BTreeMap<String, (u64, u64)>,
}

impl CommandStats {
    pub fn parse(info: &str) -> CommandStats {
        let mut commands = BTreeMap::new();
        for line in info.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            commands.insert(name.to_owned(), (field("calls"), field("usec")));
        }
        CommandStats { commands }
    }

    pub fn since(&self, earlier: &CommandStats) -> CommandStats {
        let commands = self
            .commands
            .iter()
            .map(|(name, &(calls, usec))| {
                let (calls0, usec0) = earlier.commands.get(name).copied().unwrap_or((0, 0));
                (
                    name.clone(),
                    (calls.saturating_sub(calls0), usec.saturating_sub(usec0)),
                )
            })
            .filter(|(_, (calls, _))| *calls > 0)
            .collect();
        CommandStats { commands }
    }

    /// Calls of every command but those named in `except`.
    pub fn total_calls(&self, except: &[&str]) -> u64 {
        self.commands
            .iter()
            .filter(|(name, _)| !except.contains(&name.as_str()))
            .map(|(_, &(calls, _))| calls)
            .sum()
    }

    pub fn calls(&self, name: &str) -> u64 {
        self.commands.get(name).map_or(0, |&(calls, _)| calls)
    }

    /// (calls per operation, server µs per call) of one command.
    pub fn per_op(&self, name: &str, ops: u64) -> (f64, f64) {
        let (calls, usec) = self.commands.get(name).copied().unwrap_or((0, 0));
        (
            calls as f64 / ops.max(1) as f64,
            usec as f64 / calls.max(1) as f64,
        )
    }

    pub fn json(&self, ops: u64) -> Json {
        let entries: serde_json::Map<String, Json> = self
            .commands
            .iter()
            .map(|(name, &(calls, usec))| {
                let (per_op, usec_per_call) = self.per_op(name, ops);
                (
                    name.clone(),
                    json!({
                        "calls": calls,
                        "usec": usec,
                        "calls_per_op": round(per_op, 3),
                        "usec_per_call": round2(usec_per_call),
                    }),
                )
            })
            .collect();
        Json::Object(entries)
    }
}

pub async fn command_stats(client: &Client) -> Result<CommandStats, String> {
    let info: String = client
        .info(Some(InfoKind::CommandStats))
        .await
        .map_err(|err| format!("INFO commandstats failed: {err}"))?;
    Ok(CommandStats::parse(&info))
}

/// Waits until the server counted `calls` more `EVALSHA`s than in `before`: every waiter's first
/// attempt has been executed.
pub async fn wait_for_evalsha(
    client: &Client,
    before: &CommandStats,
    calls: u64,
) -> Result<(), String> {
    let deadline = Instant::now() + HANG;
    loop {
        let now = command_stats(client).await?.since(before);
        if now.calls("evalsha") >= calls {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {calls} acquire attempts reached Redis within {HANG:?}",
                now.calls("evalsha")
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The server's CPU time so far (`INFO cpu`: `used_cpu_sys` + `used_cpu_user`), in µs.
pub async fn server_cpu_us(client: &Client) -> Result<u64, String> {
    let info: String = client
        .info(Some(InfoKind::Cpu))
        .await
        .map_err(|err| format!("INFO cpu failed: {err}"))?;
    let field = |key: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    match (field("used_cpu_sys"), field("used_cpu_user")) {
        (Some(sys), Some(user)) => Ok(((sys + user) * 1e6) as u64),
        _ => Err("INFO cpu has no used_cpu_sys / used_cpu_user".into()),
    }
}

pub async fn redis_version(client: &Client) -> String {
    let info: String = client
        .info(Some(InfoKind::Server))
        .await
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_owned()
}

/// `connected_clients` from `INFO clients`.
pub async fn connected_clients(client: &Client) -> Result<u64, String> {
    let info: String = client
        .info(Some(InfoKind::Clients))
        .await
        .map_err(|err| format!("INFO clients failed: {err}"))?;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| "INFO clients has no connected_clients".to_owned())
}

/// A command fred has no typed method for (or whose interface the crate does not enable).
pub async fn raw_command<R: fred::types::FromValue>(
    client: &Client,
    name: &'static str,
    hash: ClusterHash,
    args: Vec<String>,
) -> Result<R, String> {
    client
        .custom(CustomCommand::new_static(name, hash, false), args)
        .await
        .map_err(|err| format!("{name} failed: {err}"))
}

/// How many waiters are queued for an exclusive lock: its hash's count `q` of the queue
/// (`lua/lib/hold.lua`).
pub async fn queued(client: &Client, hold: &str) -> Result<u64, String> {
    let count: Option<String> = raw_command(
        client,
        "HGET",
        ClusterHash::FirstKey,
        vec![hold.to_owned(), "q".to_owned()],
    )
    .await?;
    Ok(count.and_then(|count| count.parse().ok()).unwrap_or(0))
}

/// `CLIENT LIST`, one map of fields per connection.
pub async fn client_list(client: &Client) -> Result<Vec<BTreeMap<String, String>>, String> {
    let text: String =
        raw_command(client, "CLIENT", ClusterHash::Random, vec!["LIST".into()]).await?;
    Ok(text
        .lines()
        .map(|line| {
            line.split(' ')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect())
}

/// The notifier connection(s) that appeared since `existing` was taken (a client just
/// connected), waiting up to 5 s for them.
pub async fn new_notifiers(
    probe: &Client,
    mode: NotificationMode,
    existing: &HashSet<u64>,
) -> Result<HashSet<u64>, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let new: HashSet<u64> = notifier_ids(probe, mode)
            .await?
            .difference(existing)
            .copied()
            .collect();
        if !new.is_empty() {
            return Ok(new);
        }
        if Instant::now() > deadline {
            return Err("cannot find the new client's notifier connection".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Ids of the connections that look like a notifier of `mode`: a blocked or last `XREAD`
/// (stream), a subscription (Pub/Sub).
pub async fn notifier_ids(client: &Client, mode: NotificationMode) -> Result<HashSet<u64>, String> {
    let number = |c: &BTreeMap<String, String>, key: &str| {
        c.get(key).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
    };
    Ok(client_list(client)
        .await?
        .into_iter()
        .filter(|c| match mode {
            NotificationMode::Stream => c.get("cmd").map(String::as_str) == Some("xread"),
            _ => number(c, "sub") + number(c, "psub") + number(c, "ssub") > 0,
        })
        .filter_map(|c| c.get("id").and_then(|id| id.parse().ok()))
        .collect())
}

/// Deletes every key of one bench prefix (SCAN, never KEYS).
pub async fn delete_prefix(client: &Client, prefix: &str) -> Result<u64, String> {
    let pattern = format!("{{{prefix}*");
    let mut cursor = "0".to_owned();
    let mut deleted = 0;
    loop {
        let (next, keys): (String, Vec<String>) = client
            .scan_page(cursor, pattern.as_str(), Some(500), None)
            .await
            .map_err(|err| format!("SCAN failed: {err}"))?;
        if !keys.is_empty() {
            let n: u64 = client
                .del(keys)
                .await
                .map_err(|err| format!("DEL failed: {err}"))?;
            deleted += n;
        }
        if next == "0" {
            return Ok(deleted);
        }
        cursor = next;
    }
}
