//! The documented key layout, and reads of the keys through the assertion client: for tests
//! that check what the library wrote.

use super::{RedisServer, Resp};

/// 32-bit FNV-1a, as documented for the shard of a lock name.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The documented key names of mutex `name`.
pub struct MutexKeys {
    pub tag: String,
    pub hold: String,
    /// The fence key of the lock's shard (shared by every lock of the shard).
    pub fence: String,
}

pub fn mutex_keys(prefix: &str, shards: u16, name: &str) -> MutexKeys {
    let shard = fnv1a32(name.as_bytes()) % u32::from(shards);
    let tag = format!("{{{prefix}:{shard}}}");
    MutexKeys {
        hold: format!("{tag}:mutex:{name}"),
        fence: format!("{tag}:fence"),
        tag,
    }
}

/// The layout record of a key prefix.
pub fn layout_key(prefix: &str) -> String {
    format!("{{{prefix}:layout}}")
}

/// Whether `key` is the liveness marker of one client of `prefix`:
/// `{P:layout}:client:<16 hex digits>`.
pub fn is_client_marker(prefix: &str, key: &str) -> bool {
    key.strip_prefix(&format!("{}:client:", layout_key(prefix)))
        .is_some_and(|tag| tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A shard fence key's value, `"<last token>|<layout stamp>"`, split (panics on any other
/// shape).
pub fn fence_value(server: &RedisServer, fence: &str) -> (u64, String) {
    let value = server
        .cmd(&["GET", fence])
        .as_str()
        .unwrap_or_else(|| panic!("fence key {fence:?} missing"));
    let (last, stamp) = value
        .split_once('|')
        .unwrap_or_else(|| panic!("fence key {fence:?} holds {value:?}"));
    let last = last
        .parse()
        .unwrap_or_else(|e| panic!("fence key {fence:?} holds {value:?}: {e}"));
    (last, stamp.to_owned())
}

/// The owner field of a hold hash (None when free or only a tombstone is left).
pub fn hold_owner(server: &RedisServer, hold: &str) -> Option<String> {
    server
        .cmd(&["HGET", hold, "o"])
        .as_str()
        .filter(|owner| !owner.is_empty())
}

/// The wait queue of the exclusive lock whose hash is `hold` (same hash tag):
/// `{P:s}:mutex:N` queues in the sorted set `{P:s}:mutex.wait:N`.
pub fn queue_key(hold: &str) -> String {
    let tag_end = hold.find("}:").expect("a hash tag") + 2;
    let kind_end = tag_end + hold[tag_end..].find(':').expect("a lock kind");
    format!("{}.wait{}", &hold[..kind_end], &hold[kind_end..])
}

/// The members of an exclusive lock's wait queue ("<waiter id> <inbox tag> <owner id> <lease
/// ms> <grant ms>"), with their scores (the server clock in µs when each queued), in queue
/// order; none when the key holds no sorted set (a plain read: it changes nothing).
pub fn queue_members(server: &RedisServer, hold: &str) -> Vec<(String, i64)> {
    let members = server.cmd(&["ZRANGE", &queue_key(hold), "0", "-1", "WITHSCORES"]);
    if members.is_error() {
        return Vec::new();
    }
    members
        .as_array()
        .chunks(2)
        .map(|pair| {
            let member = pair[0].as_str().expect("a queue member");
            let score = pair[1].as_str().expect("a score");
            let score = score
                .parse()
                .unwrap_or_else(|e| panic!("the score of {member:?}: {e}"));
            (member, score)
        })
        .collect()
}

/// The waiter ids queued for an exclusive lock, in queue order.
pub fn queued_waiters(server: &RedisServer, hold: &str) -> Vec<String> {
    queue_column(server, hold, 0)
}

/// Field `n` (0: waiter id, 1: inbox tag, 2: owner, 3: lease, 4: grant ms) of every member of
/// an exclusive lock's queue, in queue order.
fn queue_column(server: &RedisServer, hold: &str, n: usize) -> Vec<String> {
    queue_members(server, hold)
        .iter()
        .filter_map(|(member, _)| member.split(' ').nth(n))
        .map(str::to_owned)
        .collect()
}

/// The hold key of exclusive lock `name` of `kind` ("mutex" or "fair"), any shard.
pub fn find_hold(server: &RedisServer, prefix: &str, kind: &str, name: &str) -> Option<String> {
    server
        .keys(&format!("{{{prefix}:*}}:{kind}:{name}"))
        .into_iter()
        .next()
}

/// The owner, count and fencing token fields of a hold hash.
pub fn hold_fields(server: &RedisServer, hold: &str) -> Vec<Option<String>> {
    server
        .cmd(&["HMGET", hold, "o", "c", "f"])
        .as_array()
        .iter()
        .map(Resp::as_str)
        .collect()
}

pub fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd(&["EXISTS", key]).as_int() == 1
}

/// One field of an `INFO` section.
pub fn info_field(server: &RedisServer, section: &str, field: &str) -> String {
    let info = server.cmd(&["INFO", section]).as_str().expect("INFO reply");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .to_owned()
}

/// The type, value and TTL of `key`, to compare before and after.
pub fn snapshot(server: &RedisServer, key: &str) -> Resp {
    let kind = server.cmd(&["TYPE", key]);
    let value = match kind.as_str().as_deref() {
        Some("string") => server.cmd(&["GET", key]),
        Some("list") => server.cmd(&["LRANGE", key, "0", "-1"]),
        Some("hash") => server.cmd(&["HGETALL", key]),
        Some("set") => server.cmd(&["SMEMBERS", key]),
        _ => Resp::Bulk(None),
    };
    let ttl = server.cmd(&["PTTL", key]);
    Resp::Array(Some(vec![kind, value, ttl]))
}

/// The inbox keys (Stream mode) of the clients of `prefix` on a single Redis:
/// `{P:events}:to:<client tag>`, sorted. In Pub/Sub modes an inbox is a channel: none.
pub fn inbox_keys(server: &RedisServer, prefix: &str) -> Vec<String> {
    server
        .keys(&format!("{{{prefix}:events}}:to:*"))
        .into_iter()
        .filter(|key| is_inbox(prefix, key))
        .collect()
}

/// Whether `key` is the inbox of one client of `prefix`: `<events key>:to:<16 hex digits>`,
/// beside the one event stream of a single Redis (`{P:events}`) or a shard's (`{P:s}:events`).
pub fn is_inbox(prefix: &str, key: &str) -> bool {
    let Some((events, tag)) = key.rsplit_once(":to:") else {
        return false;
    };
    let shard_events = events
        .strip_prefix(&format!("{{{prefix}:"))
        .and_then(|rest| rest.strip_suffix("}:events"))
        .is_some_and(|shard| !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit()));
    (events == format!("{{{prefix}:events}}") || shard_events)
        && tag.len() == 16
        && tag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The inbox tag of each waiter queued for an exclusive lock, in queue order: the client whose
/// inbox a grant goes to.
pub fn queued_inbox_tags(server: &RedisServer, hold: &str) -> Vec<String> {
    queue_column(server, hold, 1)
}
