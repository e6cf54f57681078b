//! The only place that builds key, stream and channel names.
//!
//! A lock named `N` of kind `K` lives in shard `s = fnv1a(N) % shards`. Every key of the lock,
//! and the shard's event stream (or channel), start with the same hash tag
//! `{<prefix>:<s>}`, so every script touches a single cluster slot and can write the event in
//! the same atomic step as the state change:
//!
//! ```text
//! {fredlock:7}:mutex:orders          the lock's hash: hold, retry records, wait queue
//!                                    (`lua/lib/hold.lua`, `lua/lib/rw.lua` for `rw`; expires
//!                                    with the last hold)
//! {fredlock:7}:fence                 the shard's last fencing token and layout stamp (never
//!                                    expires; every lock kind of the shard shares it)
//! {fredlock:7}:events                the shard's event stream / channel (Redis Cluster)
//! {fredlock:events}                  the one stream / channel of a single Redis
//! <events key>:to:<client tag>       one client's inbox: the grants and wake-ups for its
//!                                    waiters
//! ```
//!
//! The role (`mutex`, `rw.wait`, ...) always stands before the name, so no lock name can
//! produce another lock's key, and braces inside a name are harmless: Redis takes the hash tag
//! from the first `{...}`, which is always ours.

use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Key naming for one key prefix and shard count.
#[derive(Debug, Clone)]
pub(crate) struct Keyspace {
    prefix: Arc<str>,
    shards: u16,
    /// One event stream per shard (Redis Cluster) or one for all (a single Redis).
    sharded_events: bool,
    /// Per shard: its hash tag, event stream and event counter, built once and shared by
    /// every lock of the shard (a lock handle then owns one string: its id).
    names: Arc<[ShardNames]>,
}

#[derive(Debug)]
struct ShardNames {
    tag: Arc<str>,
    fence: Arc<str>,
    events: Arc<str>,
}

impl Keyspace {
    /// `sharded_events`: true on a Redis Cluster, where a script may only write the event into
    /// its lock's own slot. On a single Redis (or behind Sentinel) one stream serves every lock,
    /// so each reader issues `XREAD` on one key instead of one per shard.
    pub(crate) fn new(prefix: &str, shards: u16, sharded_events: bool) -> Self {
        let mut keyspace = Keyspace {
            prefix: prefix.into(),
            shards: shards.max(1),
            sharded_events,
            names: Arc::new([]),
        };
        keyspace.names = (0..keyspace.shards)
            .map(|shard| {
                let events = keyspace.event_shard_of(shard);
                ShardNames {
                    tag: keyspace.tag(shard).into(),
                    fence: keyspace.fence(shard).into(),
                    events: keyspace.events(events).into(),
                }
            })
            .collect();
        keyspace
    }

    pub(crate) fn shards(&self) -> u16 {
        self.shards
    }

    /// Whether the keys are spread over a Redis Cluster (one event stream per shard).
    pub(crate) fn clustered(&self) -> bool {
        self.sharded_events
    }

    /// How many event streams (or channels) there are: `shards` on a cluster, else 1.
    pub(crate) fn event_shards(&self) -> u16 {
        if self.sharded_events {
            self.shards
        } else {
            1
        }
    }

    /// The event stream (or channel) number that serves lock shard `shard`.
    fn event_shard_of(&self, shard: u16) -> u16 {
        if self.sharded_events {
            shard
        } else {
            0
        }
    }

    /// The hash tag of shard `shard`, braces included.
    pub(crate) fn tag(&self, shard: u16) -> String {
        format!("{{{}:{}}}", self.prefix, shard)
    }

    /// The fence key of shard `shard`: its last fencing token and the layout stamp
    /// (`lua/lib/fence.lua`). Tokens are counted per shard, so no key per lock name outlives
    /// its lock.
    pub(crate) fn fence(&self, shard: u16) -> String {
        format!("{}:fence", self.tag(shard))
    }

    /// The shard a lock name belongs to (stable across processes, versions and platforms).
    pub(crate) fn shard_of(&self, name: &str) -> u16 {
        (fnv1a(name.as_bytes()) % u32::from(self.shards)) as u16
    }

    /// Event stream (or channel) number `n` (see [`Keyspace::event_shards`]).
    pub(crate) fn events(&self, n: u16) -> String {
        if self.sharded_events {
            format!("{}:events", self.tag(n))
        } else {
            format!("{{{}:events}}", self.prefix)
        }
    }

    /// The inbox (stream or channel) beside event stream `n` of the client with this tag: the
    /// grants for that client's waiters go there alone (`fl_grant_next` in `lua/lib/hold.lua`
    /// builds the same name).
    pub(crate) fn inbox(&self, n: u16, tag: &str) -> String {
        format!("{}:to:{tag}", self.events(n))
    }

    /// Where the layout (shards, notification mode) of this prefix is recorded.
    pub(crate) fn layout(&self) -> String {
        format!("{{{}:layout}}", self.prefix)
    }

    /// The keys of one lock. Validates the name.
    pub(crate) fn lock(&self, kind: &'static str, name: &str) -> Result<LockKeys> {
        validate_name(name)?;
        let shard = self.shard_of(name);
        let names = &self.names[usize::from(shard)];
        Ok(LockKeys {
            id: format!("{kind}:{name}").into(),
            kind,
            shard,
            tag: names.tag.clone(),
            fence: names.fence.clone(),
            events: names.events.clone(),
        })
    }
}

/// Checks a lock name: non-empty and at most [`MAX_NAME_LEN`] bytes. Any other content (braces,
/// colons, newlines, NUL) is allowed.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName("the name is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName(format!(
            "the name is {} bytes long, the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    Ok(())
}

/// Names of everything one lock uses.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    /// `"<kind>:<name>"`; the name is its tail.
    id: Arc<str>,
    kind: &'static str,
    shard: u16,
    tag: Arc<str>,
    fence: Arc<str>,
    events: Arc<str>,
}

impl LockKeys {
    /// The user's lock name.
    pub(crate) fn name(&self) -> &str {
        &self.id[self.kind.len() + 1..]
    }

    /// `"<kind>:<name>"`: identifies the lock in events and in the local waiter table.
    pub(crate) fn id(&self) -> &Arc<str> {
        &self.id
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    pub(crate) fn shard(&self) -> u16 {
        self.shard
    }

    /// A key of this lock with the given role; `""` is the main (hold) key.
    pub(crate) fn key(&self, role: &str) -> String {
        // By hand rather than `format!`: it runs for every key of every script call.
        let name = self.name();
        let size = self.tag.len() + self.kind.len() + role.len() + name.len() + 3;
        let mut key = String::with_capacity(size);
        key.push_str(&self.tag);
        key.push(':');
        key.push_str(self.kind);
        if !role.is_empty() {
            key.push('.');
            key.push_str(role);
        }
        key.push(':');
        key.push_str(name);
        key
    }

    /// The shard's fence key (see [`Keyspace::fence`]).
    pub(crate) fn fence(&self) -> &str {
        &self.fence
    }

    pub(crate) fn events(&self) -> &str {
        &self.events
    }
}

/// 32-bit FNV-1a: tiny, stable and well distributed for short keys.
fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_and_roles_never_collide() {
        let ks = Keyspace::new("fl", 16, true);
        let a = ks.lock("mutex", "a:w{x}").unwrap();
        let tag = ks.tag(a.shard());
        for key in [a.key(""), a.fence().to_owned(), a.key("wait")] {
            assert!(key.starts_with(&tag), "{key}");
        }
        assert!(a.events().starts_with(&tag));
        // A name that looks like a role suffix cannot alias another lock's key.
        let b = ks.lock("mutex", "a").unwrap();
        assert_ne!(a.key(""), b.key("wait"));
        assert_ne!(b.key("wait"), ks.lock("mutex", "wait:a").unwrap().key(""));
    }

    #[test]
    fn shard_is_stable() {
        let ks = Keyspace::new("fl", 16, true);
        // Published FNV-1a 32 test vectors: the shard of a name must never change.
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
        assert_eq!(ks.shard_of("orders"), ks.shard_of("orders"));
        let spread: std::collections::HashSet<u16> = (0..200)
            .map(|i| ks.shard_of(&format!("lock-{i}")))
            .collect();
        assert_eq!(spread.len(), 16, "200 names should cover all 16 shards");
    }

    #[test]
    fn names_are_validated() {
        let ks = Keyspace::new("fl", 4, true);
        assert!(matches!(ks.lock("mutex", ""), Err(Error::InvalidName(_))));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            ks.lock("mutex", &long),
            Err(Error::InvalidName(_))
        ));
        assert!(ks.lock("mutex", &"x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(ks.lock("mutex", "nul\0and\nnewline{}").is_ok());
    }
}
