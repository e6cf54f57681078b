//! Client configuration: serde-deserializable, with defaults and validation.
//!
//! Every client that shares a [`Config::key_prefix`] must agree on [`Config::shards`] and
//! [`Config::notification`]: they decide where keys and events live. The client records them in
//! Redis on connect and refuses to start with a different layout ([`crate::Error::LayoutMismatch`]).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How waiters learn that a lock was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum NotificationMode {
    /// Release events go to a Redis Stream per client (its inbox; one per shard on a cluster);
    /// one reader connection per process reads them with `XREAD BLOCK`, always resuming from
    /// the last entry it saw, so nothing is lost across reconnects while the inbox still holds
    /// the entries (it keeps about the last 100).
    #[default]
    Stream,
    /// Release events are published on one channel per shard (Redisson's model). Messages sent
    /// while the subscriber reconnects are lost, so every waiter re-checks after a resubscribe.
    #[serde(alias = "pub_sub", alias = "pub-sub")]
    PubSub,
}

impl NotificationMode {
    /// The mode's name as configured: `"stream"` or `"pubsub"`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationMode::Stream => "stream",
            NotificationMode::PubSub => "pubsub",
        }
    }
}

/// Configuration of a [`crate::LockClient`].
///
/// Durations deserialize from human-readable strings such as `"30s"` or `"250ms"`.
///
/// ```
/// let config: fredlock::Config = serde_json::from_str(
///     r#"{ "url": "redis://127.0.0.1:6379", "notification": "pubsub", "watchdog_lease": "10s" }"#,
/// ).unwrap();
/// assert_eq!(config.watchdog_lease, std::time::Duration::from_secs(10));
/// config.validate().unwrap();
/// ```
#[derive(Clone, Serialize, Deserialize)]
#[serde(remote = "Self", default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// Redis URL: `redis://` (or `valkey://`) for a single server, with `-cluster` or
    /// `-sentinel` after the scheme for a cluster or Sentinel deployment
    /// (`redis-cluster://`, `redis-sentinel://`), and `rediss`/`valkeys` for TLS (with the
    /// crate feature `tls`). Any other scheme is refused. Ignored by
    /// [`crate::LockClient::from_client`].
    pub url: String,
    /// Prefix of every key, stream and channel the crate uses. Letters, digits and `_-.:/` only.
    pub key_prefix: String,
    /// How waiters are woken.
    pub notification: NotificationMode,
    /// Number of lock shards. Each shard has its own hash tag (and on a cluster each client has
    /// an inbox per shard); a lock lives in the shard its name hashes to. More shards spread
    /// locks over more cluster slots. 1 to 1024.
    pub shards: u16,
    /// Lease of watchdog-renewed holds; renewal runs every lease / 3.
    #[serde(with = "humantime_serde")]
    pub watchdog_lease: Duration,
    /// Limit on establishing the connections in [`crate::LockClient::connect`].
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Limit on every Redis command the crate sends.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// Exclusive locks: how long a hold that a release grants to a queued waiter lasts until
    /// the waiter's client takes it up and renews it to its full lease, so a grant to a process
    /// that died (and was not yet passed over) blocks the lock no longer than this. A queued
    /// waiter is passed over when its client is gone: at once in Pub/Sub mode (its connection
    /// closed), within 30 s in Stream mode (its inbox expires). Read-write lock: the lease of a
    /// waiter's place in the queue, renewed by the client's heartbeat every third of it.
    #[serde(with = "humantime_serde")]
    pub waiter_lease: Duration,
    /// Longest pause between reconnection attempts: 1 ms to 60 s. It bounds how long after a
    /// server comes back the client notices, and so how soon a hold the server lost is
    /// reported by [`LockGuard::lost`](crate::LockGuard::lost).
    #[serde(with = "humantime_serde")]
    pub reconnect_max_delay: Duration,
    /// Opt-in safety against losing a fresh hold in a failover: after each acquisition the
    /// client waits (`WAIT`) until this many replicas confirm the write, and fails the
    /// acquisition with [`crate::Error::NotReplicated`] (releasing the hold) when fewer do
    /// within [`Config::replica_ack_timeout`]. 0 (the default) turns it off; at most 64.
    pub replica_acks: u32,
    /// How long an acquisition waits for [`Config::replica_acks`] confirmations.
    #[serde(with = "humantime_serde")]
    pub replica_ack_timeout: Duration,
    /// How long one `XREAD BLOCK` of the stream reader waits before it re-issues the read. It is
    /// a liveness check of the reader connection, not a poll of lock state. 100 ms to 5 min.
    #[serde(with = "humantime_serde")]
    pub notifier_block: Duration,
    /// How long a *waiting* acquisition (`lock`, `lock_timeout`, `read`, `write`) keeps
    /// retrying its attempt after transient failures (command timeout, lost connection, a
    /// failover in progress) before it returns the error. Each retry repeats the attempt with
    /// the same op id, so an attempt that was applied but whose reply was lost is answered, not
    /// applied twice. `try_lock` never retries; zero turns retries off.
    #[serde(with = "humantime_serde")]
    pub transient_retry: Duration,
    /// Barging [`Mutex`](crate::Mutex) and the write side of an [`RwLock`](crate::RwLock):
    /// the eventual-fairness bound. A release hands the
    /// lock straight to a task of its own process (one round trip, no event, no herd) as long
    /// as no waiter of another process has waited this long; past it, the release grants the
    /// lock to the waiter queued longest (and the release of that grant may hand over once
    /// more before the next grant, unless that waiter has waited twice the bound: the queue
    /// gets every other hold, then every hold). A longer bound gives more throughput under
    /// contention and longer waits to the other processes (under 64 processes fighting for
    /// one lock, the longest wait is about four to five bounds); 20 ms by default, zero turns
    /// hand-overs (and [`Config::defer_release`]) off; at most 10 s. Within a process, a task
    /// that releases and asks again takes the lock straight back until another task of the
    /// process has waited a twentieth of the bound (1 ms by default); then the release hands
    /// that task the lock.
    #[serde(with = "humantime_serde")]
    pub handover_limit: Duration,
    /// [`Mutex`](crate::Mutex) (with a non-zero [`Config::handover_limit`]) and
    /// [`FairMutex`](crate::FairMutex), and the write side of an [`RwLock`](crate::RwLock): the
    /// release of a hold that other waiters queued behind in Redis (when it began, or since:
    /// the first waiter to queue behind a hold tells its client with one event), when no task
    /// of this client waits for the lock, is sent once the releasing task yields to the
    /// scheduler instead of at once. A task of this client that asks for the
    /// same lock before that (the usual loop: unlock, then lock again) takes it over in the
    /// release's own round trip, one script call instead of two; for a fair lock that call
    /// grants the lock to the queue and queues the task at its tail, as a release and a busy
    /// attempt would. Such an `unlock()` returns without a round trip and reports
    /// the errors known locally (a lost lease); a failure of the deferred release itself is
    /// logged, like a dropped guard's, and the lease bounds the hold. A hold that nobody waits
    /// for, as far as the client has heard, is released before `unlock()` returns.
    /// [`LockClient::shutdown`](crate::LockClient::shutdown) sends the deferred releases; a
    /// runtime that stops without it leaves them to their leases.
    pub defer_release: bool,
    /// Barging [`Mutex`](crate::Mutex) and the write side of an [`RwLock`](crate::RwLock),
    /// for acquisitions through a handle without an
    /// [`Owner`](crate::Owner) (nobody re-enters their holds): the release of a contended hold
    /// may hand the lock to another task of this client without a round trip, when that task
    /// waits for it or asks for it right after the release ([`Config::defer_release`]). The
    /// hold in Redis stays as it was (under the first task's owner and token); the new guard
    /// gets the token one above its predecessor's, the rest of its lease (topped up later, like a
    /// short grant), and the same [`lost`](crate::LockGuard::lost) watch. Such hand-overs stop
    /// a while after the hold was last written in Redis (or its grant arrived): half the
    /// [`Config::handover_limit`] when nobody else waited then, else one and a half limits
    /// shared among the waiters queued in Redis and the holder, or two while the
    /// client has made fewer than eight acquisitions on that hold (at most half a limit
    /// either way; a turn of one process so spreads the cost of the grant that ends it over
    /// several acquisitions, however many processes wait). Then a
    /// release script looks at the queue again (and may grant the lock to it), so the
    /// eventual-fairness bound still holds, about that much later. Off, every hand-over is a
    /// script call.
    pub local_handover: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            url: "redis://127.0.0.1:6379".to_owned(),
            key_prefix: "fredlock".to_owned(),
            notification: NotificationMode::Stream,
            shards: 16,
            watchdog_lease: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(5),
            waiter_lease: Duration::from_secs(3),
            reconnect_max_delay: Duration::from_millis(500),
            notifier_block: Duration::from_secs(5),
            replica_acks: 0,
            replica_ack_timeout: Duration::from_secs(1),
            transient_retry: Duration::from_secs(30),
            handover_limit: Duration::from_millis(20),
            defer_release: true,
            local_handover: true,
        }
    }
}

// serde's derive also accepts a sequence of field values for a struct, so `[]` would be a
// whole default `Config`. A configuration is a map of named fields: the derived code (above,
// as inherent functions through `remote = "Self"`) only ever sees one.
impl Serialize for Config {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        Config::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Config;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of fredlock Config fields")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Config, A::Error> {
                Config::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// Smallest lease the crate accepts: shorter leases cannot survive one round trip and a renewal.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Largest lease or timeout the crate accepts (about 30 days), far below Redis' limits.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

impl Config {
    /// A default configuration for the given URL.
    pub fn new(url: impl Into<String>) -> Self {
        Config {
            url: url.into(),
            ..Config::default()
        }
    }

    /// Checks every field; [`crate::LockClient::connect`] calls it before touching the network.
    pub fn validate(&self) -> Result<()> {
        let prefix_ok = !self.key_prefix.is_empty()
            && self.key_prefix.len() <= 64
            && self
                .key_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b));
        if !prefix_ok {
            return Err(Error::InvalidConfig(format!(
                "key_prefix {:?} must be 1-64 characters of [A-Za-z0-9_-.:/]",
                self.key_prefix
            )));
        }
        if !(1..=1024).contains(&self.shards) {
            return Err(Error::InvalidConfig(format!(
                "shards must be 1..=1024, got {}",
                self.shards
            )));
        }
        check_url(&self.url)?;
        check_count("replica_acks", u64::from(self.replica_acks), 0, 64)?;
        if self.handover_limit > Duration::from_secs(10) {
            return Err(Error::InvalidConfig(format!(
                "handover_limit must be at most 10s, got {:?}",
                self.handover_limit
            )));
        }
        check_lease("watchdog_lease", self.watchdog_lease)?;
        check_duration("waiter_lease", self.waiter_lease, Duration::from_millis(30))?;
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
            ("replica_ack_timeout", self.replica_ack_timeout),
        ] {
            check_duration(what, value, Duration::from_millis(1))?;
        }
        check_range(
            "reconnect_max_delay",
            self.reconnect_max_delay,
            Duration::from_millis(1),
            Duration::from_secs(60),
        )?;
        check_range(
            "notifier_block",
            self.notifier_block,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )?;
        if !self.transient_retry.is_zero() {
            check_duration(
                "transient_retry",
                self.transient_retry,
                Duration::from_millis(1),
            )?;
        }
        Ok(())
    }

    /// The URL with any password replaced by `***`, safe to log.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted_url())
            .field("key_prefix", &self.key_prefix)
            .field("notification", &self.notification)
            .field("shards", &self.shards)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("waiter_lease", &self.waiter_lease)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("notifier_block", &self.notifier_block)
            .field("replica_acks", &self.replica_acks)
            .field("replica_ack_timeout", &self.replica_ack_timeout)
            .field("transient_retry", &self.transient_retry)
            .field("handover_limit", &self.handover_limit)
            .field("defer_release", &self.defer_release)
            .field("local_handover", &self.local_handover)
            .finish()
    }
}

/// URL schemes fred can serve with this build: `redis`/`valkey`, optionally `-cluster` or
/// `-sentinel`, and their TLS forms with the `tls` feature.
fn check_url(url: &str) -> Result<()> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let base = scheme
        .strip_suffix("-cluster")
        .or_else(|| scheme.strip_suffix("-sentinel"))
        .unwrap_or(scheme);
    let tls = matches!(base, "rediss" | "valkeys");
    if matches!(base, "redis" | "valkey") || (tls && cfg!(feature = "tls")) {
        return Ok(());
    }
    let hint = if tls {
        " (TLS needs the crate feature `tls`)"
    } else {
        ""
    };
    Err(Error::InvalidConfig(format!(
        "url {} has an unsupported scheme {scheme:?}: expected redis://, redis-cluster://, \
         redis-sentinel:// or their rediss/valkey forms{hint}",
        redact_url(url)
    )))
}

/// Validates a count against `min..=max`.
fn check_count(what: &str, value: u64, min: u64, max: u64) -> Result<()> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidConfig(format!(
            "{what} must be {min}..={max}, got {value}"
        )))
    }
}

/// Validates a duration against `min..=max`.
fn check_range(what: &'static str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    check_duration(what, value, min)?;
    if value > max {
        return Err(Error::InvalidDuration {
            what,
            value,
            reason: "above the maximum",
        });
    }
    Ok(())
}

/// Validates a lease: at least [`MIN_LEASE`], at most [`MAX_DURATION`].
pub(crate) fn check_lease(what: &'static str, value: Duration) -> Result<()> {
    check_duration(what, value, MIN_LEASE)
}

/// Validates a duration against `min..=MAX_DURATION`.
pub(crate) fn check_duration(what: &'static str, value: Duration, min: Duration) -> Result<()> {
    if value.is_zero() {
        return Err(Error::InvalidDuration {
            what,
            value,
            reason: "must not be zero",
        });
    }
    if value < min {
        return Err(Error::InvalidDuration {
            what,
            value,
            reason: "below the minimum",
        });
    }
    if value > MAX_DURATION {
        return Err(Error::InvalidDuration {
            what,
            value,
            reason: "above the maximum of 30 days",
        });
    }
    Ok(())
}

/// Replaces the password part of `scheme://user:password@host` with `***`.
fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}://{}:***@{}", &url[..scheme_end], user, &rest[at + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn rejects_nonsense() {
        let bad = [
            Config {
                key_prefix: "".into(),
                ..Config::default()
            },
            Config {
                url: "http://127.0.0.1:6379".into(),
                ..Config::default()
            },
            Config {
                notifier_block: Duration::from_millis(1),
                ..Config::default()
            },
            Config {
                replica_acks: u32::MAX,
                ..Config::default()
            },
            Config {
                handover_limit: Duration::from_secs(11),
                ..Config::default()
            },
            Config {
                key_prefix: "a{b}".into(),
                ..Config::default()
            },
            Config {
                shards: 0,
                ..Config::default()
            },
            Config {
                watchdog_lease: Duration::ZERO,
                ..Config::default()
            },
            Config {
                watchdog_lease: Duration::from_millis(1),
                ..Config::default()
            },
            Config {
                command_timeout: Duration::from_secs(365 * 24 * 3600),
                ..Config::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?} should be rejected");
        }
    }

    #[test]
    fn only_a_map_is_a_config() {
        for text in ["[]", "[\"redis://127.0.0.1:6379\"]", "null", "7"] {
            assert!(
                serde_json::from_str::<Config>(text).is_err(),
                "{text} was taken for a Config"
            );
        }
        let config: Config = serde_json::from_str(r#"{"shards": 4}"#).unwrap();
        assert_eq!(config.shards, 4);
        let back: Config = serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
        assert_eq!(back.shards, 4);
    }

    #[test]
    fn served_url_schemes_only() {
        for url in [
            "redis://h:6379",
            "valkey://h",
            "redis-cluster://h:7000",
            "redis-sentinel://h:26379/?sentinelServiceName=m",
        ] {
            assert!(check_url(url).is_ok(), "{url}");
        }
        for url in [
            "http://h:6379",
            "h:6379",
            "",
            "redis+unix:///tmp/s",
            "memcached://h",
        ] {
            assert!(
                matches!(check_url(url), Err(Error::InvalidConfig(_))),
                "{url}"
            );
        }
        assert_eq!(check_url("rediss://h").is_ok(), cfg!(feature = "tls"));
    }

    #[test]
    fn ranges_are_inclusive_at_both_ends() {
        let with = |f: fn(&mut Config)| {
            let mut config = Config::default();
            f(&mut config);
            config.validate()
        };
        assert!(with(|c| c.replica_acks = 64).is_ok());
        assert!(with(|c| c.replica_acks = 65).is_err());
        assert!(with(|c| c.handover_limit = Duration::ZERO).is_ok());
        assert!(with(|c| c.handover_limit = Duration::from_secs(10)).is_ok());
        assert!(with(|c| c.handover_limit = Duration::from_millis(10_001)).is_err());
        assert!(with(|c| c.notifier_block = Duration::from_millis(100)).is_ok());
        assert!(with(|c| c.notifier_block = Duration::from_millis(99)).is_err());
        assert!(with(|c| c.reconnect_max_delay = Duration::from_secs(61)).is_err());
    }

    #[test]
    fn passwords_never_show() {
        let config = Config::new("redis://user:s3cret@localhost:6379/0");
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("user:***@localhost"), "{shown}");
        let bare = Config::new("redis://:s3cret@localhost");
        assert!(!format!("{bare:?}").contains("s3cret"));
    }
}
