//! One error type for the whole crate.
//!
//! Every failure a caller can act on has its own variant; Redis and connection failures keep the
//! underlying [`fred::error::Error`] as their source. Input is validated before any Redis call,
//! so a bad name, duration or configuration never reaches the server.

use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a release found the lock not held by the caller's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// Nobody holds the lock: the lease expired (or the lock was force-unlocked) before the release.
    Expired,
    /// Another owner, or a newer hold of the same owner, holds the lock now. It was left untouched.
    HeldByOther,
}

/// Everything that can go wrong in `fredlock`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock name is empty or longer than [`crate::MAX_NAME_LEN`] bytes.
    #[error("invalid lock name: {0}")]
    InvalidName(String),
    /// A duration is zero, negative in spirit, or beyond the supported range.
    #[error("invalid duration for {what}: {value:?} ({reason})")]
    InvalidDuration {
        /// Which parameter was rejected.
        what: &'static str,
        /// The rejected value.
        value: Duration,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The configuration is inconsistent or out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// Another client already uses the same key prefix with a different layout (shard count or
    /// notification mode). Mixing layouts would silently break mutual exclusion, so it is refused.
    #[error("layout mismatch under prefix {prefix:?}: server has {server:?}, this client wants {ours:?}")]
    LayoutMismatch {
        /// The key prefix both clients use.
        prefix: String,
        /// The layout recorded in Redis by the first client.
        server: String,
        /// The layout this client was configured with.
        ours: String,
    },
    /// [`LockClient::connect_as_recorded`](crate::LockClient::connect_as_recorded) found no
    /// layout recorded under this key prefix: no client has used it on this server.
    #[error("no fredlock layout is recorded under prefix {0:?} on this server")]
    NoLayout(String),
    /// Connecting to Redis failed or did not finish within the configured connect timeout.
    #[error("cannot connect to Redis: {0}")]
    Connect(#[source] fred::error::Error),
    /// Redis did not answer within the configured command timeout.
    #[error("Redis did not answer in time: {0}")]
    Timeout(#[source] fred::error::Error),
    /// Authentication was refused (wrong password or ACL user).
    #[error("Redis refused authentication: {0}")]
    Auth(#[source] fred::error::Error),
    /// The Redis ACL user may not run a command or touch a key the crate needs (`NOPERM`).
    /// Retrying does not help; grant the commands and keys listed in docs/design.md §10.1
    /// (a least-privilege user that `tests/acl.rs` proves sufficient).
    #[error("Redis ACL refused an operation: {0}")]
    Permission(#[source] fred::error::Error),
    /// One of the keys the lock uses (its hash, the shard's fencing counter, a queue) holds
    /// a value that fredlock did not write: another type (`WRONGTYPE`) or a non-numeric
    /// counter. The script changed nothing; the foreign value is left alone.
    #[error("a key of lock {lock:?} ({key:?} or one beside it) holds a foreign value")]
    WrongType {
        /// The lock whose key is damaged.
        lock: String,
        /// The damaged key when the script names it (the queue's, the shard's fence key), else
        /// the lock's main key: then the damaged key is this one or one of its siblings.
        key: String,
    },
    /// Redis is out of memory (`maxmemory` reached); the script changed nothing.
    #[error("Redis is out of memory (maxmemory reached); nothing was changed")]
    OutOfMemory(#[source] fred::error::Error),
    /// Any other Redis or connection failure.
    #[error("Redis error: {0}")]
    Redis(#[source] fred::error::Error),
    /// A script answered in a shape this version of the crate does not expect.
    #[error("unexpected reply from script {script}: {detail}")]
    Protocol {
        /// The script that answered.
        script: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A release or extension found the lock not held by this guard's hold.
    #[error("lock {lock:?} is not held by this guard ({reason:?})")]
    NotHeld {
        /// The lock name.
        lock: String,
        /// Why.
        reason: NotHeldReason,
    },
    /// A read-write lock owner asked for a write hold while holding a read hold (no upgrade).
    #[error("lock {0:?}: upgrading a read hold to a write hold is not supported")]
    UpgradeNotSupported(String),
    /// A [`CountDownLatch`](crate::CountDownLatch) count of 0 (a latch with a count is
    /// closed until it reaches 0; set no count to leave it open).
    #[error("invalid latch count {0}: it must be at least 1")]
    InvalidCount(u64),
    /// A [`Semaphore`](crate::Semaphore) permit count of 0 or above
    /// [`Semaphore::MAX_PERMITS`](crate::Semaphore::MAX_PERMITS).
    #[error("invalid permit count {0}: it must be 1 to {max}", max = crate::Semaphore::MAX_PERMITS)]
    InvalidPermits(u64),
    /// A [`Semaphore`](crate::Semaphore) in use (permits held or waiters queued) has another
    /// permit count than this handle: every user of a semaphore must give the same count.
    /// Nothing was changed.
    #[error("semaphore {name:?} is in use with {stored} permits, this handle has {asked}")]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The count its permits are held under.
        stored: u32,
        /// This handle's count.
        asked: u32,
    },
    /// A [`MultiLock`](crate::MultiLock) was given no lock, or the same lock twice (an
    /// acquisition would wait for its own hold).
    #[error("invalid multi-lock: {0}")]
    InvalidMultiLock(String),
    /// Fewer replicas than [`crate::Config::replica_acks`] confirmed a fresh hold in time; the
    /// hold was released again.
    #[error("lock {lock:?}: {acked} of {wanted} replicas confirmed the hold in time")]
    NotReplicated {
        /// The lock name.
        lock: String,
        /// Replicas that confirmed.
        acked: u32,
        /// Replicas required.
        wanted: u32,
    },
    /// A [`crate::Redlock`] could not reach a quorum of instances (too many unreachable).
    #[error("lock {lock:?}: only {reached} instances answered, {needed} needed")]
    NoQuorum {
        /// The lock name.
        lock: String,
        /// Instances that answered in the last attempt.
        reached: usize,
        /// The quorum.
        needed: usize,
    },
    /// The client was shut down.
    #[error("the lock client has been shut down")]
    Shutdown,
}

impl Error {
    /// Classifies a fred error; `lock` and `key` name the lock and key for `WRONGTYPE`, unless
    /// the error names the key itself (a script's check: "fredlock key <key> holds ...").
    pub(crate) fn from_redis(err: fred::error::Error, lock: &str, key: &str) -> Error {
        use fred::error::ErrorKind;
        let details = err.details();
        if details.contains("WRONGTYPE") || details.contains("not an integer") {
            let named = details
                .split_once("fredlock key ")
                .and_then(|(_, rest)| rest.split_once(" holds "))
                .map(|(named, _)| named);
            return Error::WrongType {
                lock: lock.to_owned(),
                key: named.unwrap_or(key).to_owned(),
            };
        }
        if details.contains("NOPERM") {
            return Error::Permission(err);
        }
        if details.contains("OOM ") || details.starts_with("OOM") {
            return Error::OutOfMemory(err);
        }
        if Error::is_auth_refusal(&err) {
            return Error::Auth(err);
        }
        match err.kind() {
            ErrorKind::Timeout => Error::Timeout(err),
            _ => Error::Redis(err),
        }
    }

    /// True when `err` is the server refusing the connection's credentials, in the words of
    /// any supported version: `WRONGPASS` and `NOAUTH` (fred's `ErrorKind::Auth`), Redis 5.0's
    /// `ERR invalid password`, a password sent to a server that has none (5.0: `ERR Client
    /// sent AUTH, but no password is set`; 6.0+: `ERR AUTH <password> called without any
    /// password configured ...`), and a user name sent to a server without ACLs (before 6.0,
    /// `AUTH` takes one argument).
    pub(crate) fn is_auth_refusal(err: &fred::error::Error) -> bool {
        const REFUSALS: [&str; 4] = [
            "ERR invalid password",
            "ERR Client sent AUTH, but no password is set",
            "ERR AUTH <password> called without any password configured",
            "ERR wrong number of arguments for 'auth' command",
        ];
        let details = err.details();
        matches!(err.kind(), fred::error::ErrorKind::Auth)
            || REFUSALS.iter().any(|refusal| details.starts_with(refusal))
    }

    /// True when the same attempt may succeed if repeated soon: the command timed out, the
    /// connection broke, or the server is in the middle of a failover or restart. Waiting
    /// acquisitions repeat their attempt (same op id) on these, within
    /// [`crate::Config::transient_retry`].
    pub(crate) fn is_retryable(&self) -> bool {
        use fred::error::ErrorKind;
        // Server replies during a restart or failover, and fred's own give-ups while the
        // cluster's slot map is still moving (it re-sent the command to the old master after
        // MOVED until its attempt budget ran out).
        const IN_FLUX: [&str; 8] = [
            "LOADING",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "NOREPLICAS",
            "Too many failed write attempts",
            "Too many redirections",
        ];
        match self {
            // The hold was released again; a replica may attach or catch up meanwhile.
            Error::Timeout(_) | Error::Connect(_) | Error::NotReplicated { .. } => true,
            Error::Redis(err) => {
                matches!(
                    err.kind(),
                    ErrorKind::IO
                        | ErrorKind::Timeout
                        | ErrorKind::Canceled
                        | ErrorKind::Cluster
                        | ErrorKind::Routing
                ) || IN_FLUX
                    .iter()
                    .any(|prefix| err.details().starts_with(prefix))
            }
            _ => false,
        }
    }

    /// True when retrying later may succeed (connection trouble, timeouts, OOM).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout(_)
                | Error::Redis(_)
                | Error::Connect(_)
                | Error::OutOfMemory(_)
                | Error::NotReplicated { .. }
        )
    }
}

/// The pauses between repeats of a call that failed for a transient reason
/// ([`Error::is_retryable`]): 20 ms, doubling up to 1 s. Shared by acquisitions and releases.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    /// The last pause given (zero before the first).
    last: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(20);
    const MAX: Duration = Duration::from_secs(1);

    /// The next pause.
    pub(crate) fn next_pause(&mut self) -> Duration {
        self.last = if self.last.is_zero() {
            Self::FIRST
        } else {
            (self.last * 2).min(Self::MAX)
        };
        self.last
    }

    /// The next pause, without consuming it.
    pub(crate) fn peek(&self) -> Duration {
        Backoff { last: self.last }.next_pause()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::{Error as FredError, ErrorKind};

    fn redis(kind: ErrorKind, details: &'static str) -> Error {
        Error::from_redis(FredError::new(kind, details), "lock", "key")
    }

    #[test]
    fn every_versions_auth_refusal_is_an_auth_error() {
        for refusal in [
            redis(ErrorKind::Auth, "WRONGPASS invalid username-password pair"),
            redis(ErrorKind::Auth, "NOAUTH Authentication required."),
            redis(ErrorKind::Unknown, "ERR invalid password"),
            redis(
                ErrorKind::Unknown,
                "ERR Client sent AUTH, but no password is set",
            ),
            redis(
                ErrorKind::Unknown,
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            ),
            redis(
                ErrorKind::Unknown,
                "ERR wrong number of arguments for 'auth' command",
            ),
        ] {
            assert!(matches!(refusal, Error::Auth(_)), "{refusal:?}");
        }
        for other in [
            redis(ErrorKind::Unknown, "ERR Error running script"),
            redis(
                ErrorKind::Unknown,
                "ERR wrong number of arguments for 'set' command",
            ),
        ] {
            assert!(matches!(other, Error::Redis(_)), "{other:?}");
        }
    }

    #[test]
    fn failover_and_connection_trouble_is_retryable_and_nothing_else() {
        for retryable in [
            redis(ErrorKind::IO, "Connection reset by peer"),
            redis(ErrorKind::Timeout, "Request timed out."),
            redis(ErrorKind::Routing, "Too many redirections."),
            redis(ErrorKind::Unknown, "Too many failed write attempts."),
            redis(
                ErrorKind::Unknown,
                "LOADING Redis is loading the dataset in memory",
            ),
            redis(
                ErrorKind::Unknown,
                "READONLY You can't write against a read only replica.",
            ),
            redis(ErrorKind::Unknown, "CLUSTERDOWN The cluster is down"),
        ] {
            assert!(retryable.is_retryable(), "{retryable:?}");
        }
        for fatal in [
            redis(ErrorKind::Unknown, "WRONGTYPE Operation against a key"),
            redis(ErrorKind::Unknown, "NOPERM this user has no permissions"),
            redis(ErrorKind::Unknown, "OOM command not allowed"),
            redis(ErrorKind::Auth, "WRONGPASS invalid username-password pair"),
            redis(ErrorKind::Unknown, "ERR Error running script"),
            Error::Shutdown,
        ] {
            assert!(!fatal.is_retryable(), "{fatal:?}");
        }
    }

    #[test]
    fn a_wrongtype_names_the_key_the_script_names_else_the_callers() {
        let key_of = |details: &'static str| match redis(ErrorKind::Unknown, details) {
            Error::WrongType { key, .. } => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            key_of(
                "ERR user_script:9: WRONGTYPE fredlock key {p:0}:mutex.wait:a holds a list, \
                 expected a zset script: 5e4c…"
            ),
            "{p:0}:mutex.wait:a"
        );
        assert_eq!(
            key_of("WRONGTYPE Operation against a key holding the wrong kind of value"),
            "key"
        );
    }

    #[test]
    fn backoff_doubles_from_20_ms_up_to_1_s() {
        let mut backoff = Backoff::default();
        assert_eq!(backoff.peek(), Duration::from_millis(20));
        let pauses: Vec<u64> = (0..8)
            .map(|_| backoff.next_pause().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(backoff.peek(), Duration::from_secs(1));
    }
}
