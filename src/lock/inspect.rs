//! Inspection: who holds what, and who waits, read from Redis without changing anything.
//!
//! Operators need to answer "why is this lock stuck?" without attaching a debugger to every
//! service: `inspect` reads one lock's holders (owner ids, hold counts, fencing tokens, leases
//! left) and its wait queue in one atomic script call that changes nothing
//! (`lua/hold_describe.lua`, `lua/rw_describe.lua`, `lua/latch_describe.lua`), and `list` finds
//! every lock under the key prefix with `SCAN` on every master. A [`LockClient`] offers both to
//! a service; an [`Inspector`] offers them to a tool, over one connection that never writes
//! (no layout record, no marker key, no notifier): the `fredlock` command's `list` and `show`.
//!
//! [`LockClient`]: crate::LockClient

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use fred::interfaces::{ClientLike, ClusterInterface, KeysInterface};
use fred::types::Value;
use serde::{Serialize, Serializer};

use crate::config::Config;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::scripts::{Script, ScriptArgs, ScriptKeys, SCRIPTS};

/// How many holders and waiters an inspection lists at most (each; the totals are exact).
pub const INSPECT_LIMIT: usize = 100;

/// The kinds of synchronizer a client keeps in Redis, by the handle that makes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// [`Mutex`](crate::Mutex).
    Mutex,
    /// [`FairMutex`](crate::FairMutex).
    FairMutex,
    /// [`RwLock`](crate::RwLock).
    RwLock,
    /// [`Semaphore`](crate::Semaphore).
    Semaphore,
    /// [`CountDownLatch`](crate::CountDownLatch).
    Latch,
}

impl LockKind {
    /// Every kind.
    pub const ALL: [LockKind; 5] = [
        LockKind::Mutex,
        LockKind::FairMutex,
        LockKind::RwLock,
        LockKind::Semaphore,
        LockKind::Latch,
    ];

    /// The kind's name in keys and on the command line: `mutex`, `fair`, `rw`, `sem`, `latch`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::FairMutex => "fair",
            LockKind::RwLock => "rw",
            LockKind::Semaphore => "sem",
            LockKind::Latch => "latch",
        }
    }

    /// The kind named `name` (see [`as_str`](LockKind::as_str)).
    pub fn parse(name: &str) -> Option<LockKind> {
        LockKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl Serialize for LockKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which hold a holder has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HoldSide {
    /// The hold of an exclusive lock, or the write hold of a read-write lock.
    Exclusive,
    /// A read hold of a read-write lock, or a permit of a semaphore.
    Shared,
}

/// One holder found by [`LockClient::inspect`](crate::LockClient::inspect).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holder {
    /// The owner id the hold is taken under (see [`Owner`](crate::Owner)).
    pub owner: String,
    /// Exclusive (write) or shared (read, permit).
    pub side: HoldSide,
    /// Re-entry depth.
    pub hold_count: u64,
    /// The hold's fencing token in Redis. A barging [`Mutex`](crate::Mutex) may pass its hold
    /// between tasks of one client without a call (`Config::local_handover`): the holder is
    /// then that client's task with a token above this one, under the same owner id shown.
    pub fencing_token: u64,
    /// Time until its lease ends, unless the watchdog renews it first (in JSON: `remaining_ms`).
    #[serde(rename = "remaining_ms", serialize_with = "as_ms")]
    pub remaining: Option<Duration>,
}

/// One waiter queued in Redis, found by [`LockClient::inspect`](crate::LockClient::inspect).
/// The barging [`Mutex`](crate::Mutex) queues only waiters of other processes than the
/// holder's, and a latch lists one waiter per waiting client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Waiter {
    /// The acquisition's waiter id ("" for a latch).
    pub waiter: String,
    /// The owner id it asks under ("" for a latch).
    pub owner: String,
    /// The inbox tag of its client: waiters with the same tag are tasks of one client.
    pub client: String,
    /// How long it has waited (exclusive locks only; in JSON: `waited_ms`).
    #[serde(rename = "waited_ms", serialize_with = "as_ms")]
    pub waited: Option<Duration>,
    /// Whether its client is still there to hear a grant or wake-up: in Stream mode its inbox
    /// exists (a client that died leaves it to expire, within 30 s), in Pub/Sub mode a
    /// subscriber listens on its inbox channel. A waiter whose client is gone stays queued
    /// until a release passes it over (or its entry expires). `None` on a Redis Cluster,
    /// where the server cannot tell.
    pub listening: Option<bool>,
}

/// One lock as [`LockClient::inspect`](crate::LockClient::inspect) found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockReport {
    /// The kind.
    pub kind: LockKind,
    /// The name.
    pub name: String,
    /// The holders, at most [`INSPECT_LIMIT`] (a write holder first).
    pub holders: Vec<Holder>,
    /// Live holds in all.
    pub held: u64,
    /// The waiters queued in Redis, head first, at most [`INSPECT_LIMIT`].
    pub waiters: Vec<Waiter>,
    /// Waiters queued in all.
    pub queued: u64,
    /// The last fencing token the lock issued, if its state is still in Redis.
    pub last_token: Option<u64>,
    /// A semaphore's permit count, as its users gave it.
    pub permits: Option<u32>,
    /// A latch's count (0: open).
    pub count: Option<u64>,
}

/// A duration as whole milliseconds (JSON).
fn as_ms<S: Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => {
            serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
        }
        None => serializer.serialize_none(),
    }
}

impl LockReport {
    fn new(kind: LockKind, name: &str) -> LockReport {
        LockReport {
            kind,
            name: name.to_owned(),
            holders: Vec::new(),
            held: 0,
            waiters: Vec::new(),
            queued: 0,
            last_token: None,
            permits: None,
            count: None,
        }
    }
}

/// A read-only view of the locks under one key prefix, for tools: [`Inspector::inspect`] and
/// [`Inspector::list`] as on a [`LockClient`](crate::LockClient), over one command connection
/// and nothing else. It takes the shard count and notification mode that the services recorded
/// under the prefix, and never writes to Redis. Made by [`Inspector::connect`].
pub struct Inspector {
    pub(crate) ctx: Context,
}

impl Inspector {
    /// One lock's holders and waiters, read in one atomic call (see [`LockReport`]).
    pub async fn inspect(&self, kind: LockKind, name: &str) -> Result<LockReport> {
        inspect(&self.ctx, kind, name).await
    }

    /// Every lock under the prefix that has state in Redis, by kind and name, sorted (`SCAN`
    /// on every master).
    pub async fn list(&self) -> Result<Vec<(LockKind, String)>> {
        list(&self.ctx).await
    }

    /// The configuration in use, with the recorded layout.
    pub fn config(&self) -> &Config {
        &self.ctx.config
    }

    /// Closes the connection.
    pub async fn close(self) -> Result<()> {
        use fred::interfaces::ClientLike as _;
        self.ctx
            .redis
            .quit()
            .await
            .map_err(|err| Error::from_redis(err, "(close)", ""))
    }
}

impl fmt::Debug for Inspector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inspector")
            .field("prefix", &self.ctx.config.key_prefix)
            .finish()
    }
}

/// Reads one lock (see [`LockReport`]).
pub(crate) async fn inspect(ctx: &Context, kind: LockKind, name: &str) -> Result<LockReport> {
    let keys = ctx.keyspace.lock(kind.as_str(), name)?;
    let mut report = LockReport::new(kind, name);
    match kind {
        LockKind::Mutex | LockKind::FairMutex => describe_hold(ctx, &keys, &mut report).await?,
        LockKind::RwLock | LockKind::Semaphore => describe_rw(ctx, &keys, &mut report).await?,
        LockKind::Latch => describe_latch(ctx, &keys, &mut report).await?,
    }
    Ok(report)
}

/// Runs a describe script: the lock's keys through the shard's events key (the base of the
/// inboxes, whose clients it checks), the event arguments, and the listing limit.
async fn describe(ctx: &Context, keys: &LockKeys, script: &Script) -> Result<Reply> {
    let limit = Value::from(INSPECT_LIMIT as i64);
    let args = ScriptArgs::no_call()
        .events(ctx.event_args(keys))
        .extra([limit]);
    let script_keys = ScriptKeys::new(keys).for_script(script);
    let value = ctx
        .run(script, keys.name(), script_keys, args.into_vec())
        .await?;
    match value {
        Value::Array(items) => Ok(Reply {
            script: script.name(),
            items: items.into_iter(),
        }),
        other => Err(Error::Protocol {
            script: script.name(),
            detail: format!("expected an array, got {other:?}"),
        }),
    }
}

/// `lua/hold_describe.lua`.
async fn describe_hold(ctx: &Context, keys: &LockKeys, report: &mut LockReport) -> Result<()> {
    let mut reply = describe(ctx, keys, &SCRIPTS.hold_describe).await?;
    let owner = reply.text()?;
    let hold_count = reply.number()?;
    report.last_token = reply.token()?;
    let remaining = reply.ms()?;
    report.queued = reply.number()?;
    if !owner.is_empty() {
        report.held = 1;
        report.holders.push(Holder {
            owner,
            side: HoldSide::Exclusive,
            hold_count,
            fencing_token: report.last_token.unwrap_or(0),
            remaining,
        });
    }
    while !reply.is_done() {
        let member = reply.text()?;
        let waited = reply.ms()?;
        let listening = reply.listening()?;
        let mut words = member.split(' ');
        let (Some(waiter), Some(client), Some(owner)) = (words.next(), words.next(), words.next())
        else {
            return Err(reply.bad(format!("queue member {member:?}")));
        };
        report.waiters.push(Waiter {
            waiter: waiter.to_owned(),
            owner: owner.to_owned(),
            client: client.to_owned(),
            waited,
            listening,
        });
    }
    Ok(())
}

/// `lua/rw_describe.lua`.
async fn describe_rw(ctx: &Context, keys: &LockKeys, report: &mut LockReport) -> Result<()> {
    let mut reply = describe(ctx, keys, &SCRIPTS.rw_describe).await?;
    let writer = reply.text()?;
    let write_count = reply.number()?;
    report.last_token = reply.token()?;
    let write_remaining = reply.ms()?;
    let permits = reply.number()?;
    let readers = reply.number()?;
    let listed = reply.number()?;
    report.queued = reply.number()?;
    report.permits = (permits > 0).then(|| u32::try_from(permits).unwrap_or(u32::MAX));
    report.held = readers + u64::from(!writer.is_empty());
    if !writer.is_empty() {
        report.holders.push(Holder {
            owner: writer,
            side: HoldSide::Exclusive,
            hold_count: write_count,
            fencing_token: report.last_token.unwrap_or(0),
            remaining: write_remaining,
        });
    }
    for _ in 0..listed {
        report.holders.push(Holder {
            owner: reply.text()?,
            side: HoldSide::Shared,
            hold_count: reply.number()?,
            fencing_token: reply.token()?.unwrap_or(0),
            remaining: reply.ms()?,
        });
    }
    while !reply.is_done() {
        report.waiters.push(Waiter {
            waiter: reply.text()?,
            client: reply.text()?,
            owner: reply.text()?,
            waited: None,
            listening: reply.listening()?,
        });
    }
    Ok(())
}

/// `lua/latch_describe.lua`: a latch has no holders, and lists its waiting clients.
async fn describe_latch(ctx: &Context, keys: &LockKeys, report: &mut LockReport) -> Result<()> {
    let mut reply = describe(ctx, keys, &SCRIPTS.latch_describe).await?;
    report.count = Some(reply.number()?);
    report.queued = reply.number()?;
    while !reply.is_done() {
        report.waiters.push(Waiter {
            waiter: String::new(),
            owner: String::new(),
            client: reply.text()?,
            waited: None,
            listening: reply.listening()?,
        });
    }
    Ok(())
}

/// The reply of a describe script, read item by item.
struct Reply {
    script: &'static str,
    items: std::vec::IntoIter<Value>,
}

impl Reply {
    fn bad(&self, detail: String) -> Error {
        Error::Protocol {
            script: self.script,
            detail,
        }
    }

    fn is_done(&self) -> bool {
        self.items.len() == 0
    }

    fn next(&mut self) -> Result<Value> {
        let script = self.script;
        self.items.next().ok_or_else(|| Error::Protocol {
            script,
            detail: "the reply is too short".into(),
        })
    }

    fn text(&mut self) -> Result<String> {
        match self.next()? {
            Value::String(text) => Ok(text.to_string()),
            Value::Bytes(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::Null => Ok(String::new()),
            other => Err(self.bad(format!("expected text, got {other:?}"))),
        }
    }

    fn integer(&mut self) -> Result<i64> {
        match self.next()? {
            Value::Integer(number) => Ok(number),
            other => Err(self.bad(format!("expected a number, got {other:?}"))),
        }
    }

    fn number(&mut self) -> Result<u64> {
        Ok(self.integer()?.max(0) as u64)
    }

    /// A duration in ms; negative: none.
    fn ms(&mut self) -> Result<Option<Duration>> {
        let ms = self.integer()?;
        Ok((ms >= 0).then(|| Duration::from_millis(ms as u64)))
    }

    /// Whether a waiter's client listens (`fl_listening` in `lua/lib/notify.lua`): 1, 0, or
    /// -1 when the server cannot tell.
    fn listening(&mut self) -> Result<Option<bool>> {
        match self.integer()? {
            1 => Ok(Some(true)),
            0 => Ok(Some(false)),
            -1 => Ok(None),
            other => Err(self.bad(format!("expected 1, 0 or -1, got {other}"))),
        }
    }

    /// A fencing token as the decimal text the script read; "": none.
    fn token(&mut self) -> Result<Option<u64>> {
        let text = self.text()?;
        if text.is_empty() {
            return Ok(None);
        }
        text.parse()
            .map(Some)
            .map_err(|_| self.bad(format!("expected a token, got {text:?}")))
    }
}

/// Every lock under the client's key prefix that has state in Redis (a hold, a tombstone, a
/// queue or a count), by kind and name, sorted. `SCAN` on every master (a cluster) or on the
/// one server: it reads the whole keyspace in pages, so run it as an operator's tool, not on a
/// hot path.
pub(crate) async fn list(ctx: &Context) -> Result<Vec<(LockKind, String)>> {
    let redis = &ctx.redis;
    let prefix = &ctx.config.key_prefix;
    let pattern = format!("{{{}:*", glob_escaped(prefix));
    let mut found = BTreeSet::new();
    if redis.is_clustered() {
        // Every master of the slot map, reachable or not: one that cannot be scanned fails
        // the listing rather than leaving its locks out.
        let masters = redis
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default();
        if masters.is_empty() {
            return Err(Error::Protocol {
                script: "SCAN",
                detail: "no cluster slot map".into(),
            });
        }
        for server in masters {
            let node = redis.with_cluster_node(server);
            scan_into(&node, &pattern, prefix, &mut found).await?;
        }
    } else {
        scan_into(redis, &pattern, prefix, &mut found).await?;
    }
    Ok(found.into_iter().collect())
}

async fn scan_into<C: KeysInterface + Sync>(
    redis: &C,
    pattern: &str,
    prefix: &str,
    found: &mut BTreeSet<(LockKind, String)>,
) -> Result<()> {
    let mut cursor = String::from("0");
    loop {
        let page: Value = redis
            .scan_page(cursor.as_str(), pattern, Some(1000), None)
            .await
            .map_err(|err| Error::from_redis(err, "(list)", pattern))?;
        let (next, keys) = scan_reply(page)?;
        found.extend(keys.iter().filter_map(|key| lock_of_key(prefix, key)));
        if next == "0" {
            return Ok(());
        }
        cursor = next;
    }
}

/// `[cursor, [key, ...]]`.
fn scan_reply(page: Value) -> Result<(String, Vec<String>)> {
    let protocol = |detail: String| Error::Protocol {
        script: "SCAN",
        detail,
    };
    let Value::Array(mut parts) = page else {
        return Err(protocol(format!("expected an array, got {page:?}")));
    };
    if parts.len() != 2 {
        return Err(protocol(format!("expected two parts, got {parts:?}")));
    }
    let keys = match parts.pop() {
        Some(Value::Array(keys)) => keys
            .into_iter()
            // A key that is not UTF-8 text is no lock's: every name is a `&str`. Such a key
            // under the prefix was written by someone else, and must not hide every lock.
            .filter_map(Value::into_string)
            .collect(),
        Some(Value::Null) => Vec::new(),
        other => return Err(protocol(format!("expected a list of keys, got {other:?}"))),
    };
    match parts.pop().and_then(Value::into_string) {
        Some(cursor) => Ok((cursor, keys)),
        None => Err(protocol("unreadable cursor".into())),
    }
}

/// The lock a key belongs to: `{<prefix>:<shard>}:<kind>:<name>` or
/// `{<prefix>:<shard>}:<kind>.wait:<name>` (see `src/keys.rs`); None for other keys (fence,
/// events, inboxes, the layout record).
fn lock_of_key(prefix: &str, key: &str) -> Option<(LockKind, String)> {
    let rest = key
        .strip_prefix('{')?
        .strip_prefix(prefix)?
        .strip_prefix(':')?;
    let (shard, rest) = rest.split_once("}:")?;
    if shard.is_empty() || !shard.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (role, name) = rest.split_once(':')?;
    let kind = LockKind::parse(role.strip_suffix(".wait").unwrap_or(role))?;
    Some((kind, name.to_owned()))
}

/// `text` with the glob characters of `SCAN MATCH` escaped.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_lock() {
        let of = |key: &str| lock_of_key("app", key);
        assert_eq!(
            of("{app:7}:mutex:orders"),
            Some((LockKind::Mutex, "orders".into()))
        );
        assert_eq!(
            of("{app:0}:fair.wait:a:b"),
            Some((LockKind::FairMutex, "a:b".into()))
        );
        assert_eq!(
            of("{app:3}:sem:pool"),
            Some((LockKind::Semaphore, "pool".into()))
        );
        assert_eq!(
            of("{app:3}:latch.wait:gate"),
            Some((LockKind::Latch, "gate".into()))
        );
        assert_eq!(
            of("{app:3}:latch.op:gate"),
            None,
            "a latch's record of its calls"
        );
        assert_eq!(of("{app:3}:fence"), None);
        assert_eq!(of("{app:events}:to:abc"), None);
        assert_eq!(of("{app:1}:events:to:abc"), None);
        assert_eq!(of("{apple:1}:mutex:x"), None);
        assert_eq!(of("{app:layout}"), None);
    }

    #[test]
    fn a_key_that_is_not_text_is_left_out_of_a_page() {
        let page = Value::Array(vec![
            Value::from("17"),
            Value::Array(vec![
                Value::from("{app:1}:mutex:a"),
                Value::Bytes(b"{app:1}:mutex:\xff".to_vec().into()),
            ]),
        ]);
        let (cursor, keys) = scan_reply(page).unwrap();
        assert_eq!(
            (cursor.as_str(), keys),
            ("17", vec!["{app:1}:mutex:a".to_owned()])
        );
        assert!(scan_reply(Value::Array(vec![Value::from("0"), Value::Integer(1)])).is_err());
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn kinds_parse_their_names() {
        for kind in LockKind::ALL {
            assert_eq!(LockKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(LockKind::parse("lock"), None);
    }
}
