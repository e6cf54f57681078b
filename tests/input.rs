//! Input the library refuses or must cope with before (or without) Redis being involved: lock
//! names (invalid, odd, arbitrary), leases, wait limits and extensions, configurations refused
//! before any network call, and how errors and configurations show (SPEC §5). Every test that
//! needs a server talks to its own throwaway `redis-server` (see `tests/support`).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use fredlock::{
    Config, Error, Lease, LockClient, NotHeldReason, NotificationMode, MAX_DURATION, MAX_NAME_LEN,
    MIN_LEASE,
};
use support::{
    blackhole, bounded, connect, eventually, fence_value, hold_owner, init_tracing,
    is_client_marker, is_inbox, layout_key, mutex_keys, queued_waiters, sharded_config, shown,
    shutdown, RedisServer, MODES,
};

// ---------------------------------------------------------------------------
// names, leases, wait limits
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_leases_and_timeouts_are_typed_errors() {
    support::init_tracing();
    let server = RedisServer::start();
    let prefix = "fail-input";
    let locks = connect(sharded_config(
        &server.url(),
        prefix,
        NotificationMode::Stream,
        1,
    ))
    .await;

    // Names.
    let err = locks.mutex("").expect_err("empty name");
    assert!(matches!(err, Error::InvalidName(_)), "{err:?}");
    shown(&err);
    let err = locks
        .mutex(&"x".repeat(MAX_NAME_LEN + 1))
        .expect_err("name of MAX_NAME_LEN + 1 bytes");
    assert!(matches!(err, Error::InvalidName(_)), "{err:?}");
    shown(&err);
    // The limit is in bytes, not characters.
    let err = locks
        .mutex(&"é".repeat(MAX_NAME_LEN / 2 + 1))
        .expect_err("name of MAX_NAME_LEN + 2 bytes in 2-byte chars");
    assert!(matches!(err, Error::InvalidName(_)), "{err:?}");
    let longest = locks
        .mutex(&"é".repeat(MAX_NAME_LEN / 2))
        .expect("name of exactly MAX_NAME_LEN bytes");
    let guard = bounded("lock longest name", longest.lock())
        .await
        .expect("lock longest name");
    bounded("unlock longest name", guard.unlock())
        .await
        .expect("unlock longest name");

    // Leases.
    let mutex = locks.mutex("leases").expect("mutex");
    let bad_leases = [
        Lease::fixed(Duration::ZERO),
        Lease::fixed(Duration::from_nanos(1)),
        Lease::fixed(MIN_LEASE - Duration::from_nanos(1)),
        Lease::fixed(MAX_DURATION + Duration::from_secs(1)),
        Lease::fixed(Duration::MAX),
        Lease::watchdog(Duration::ZERO),
        Lease::watchdog(Duration::from_nanos(1)),
        Lease::watchdog(MAX_DURATION + Duration::from_nanos(1)),
    ];
    for lease in bad_leases {
        let err = mutex
            .clone()
            .with_lease(lease)
            .expect_err(&format!("{lease:?} must be rejected"));
        assert!(
            matches!(err, Error::InvalidDuration { .. }),
            "{lease:?}: {err:?}"
        );
        shown(&err);
    }
    for lease in [
        Lease::fixed(MIN_LEASE),
        Lease::fixed(MAX_DURATION),
        Lease::watchdog(MAX_DURATION),
    ] {
        mutex
            .clone()
            .with_lease(lease)
            .unwrap_or_else(|e| panic!("{lease:?} must be accepted: {e}"));
    }

    // Wait limits.
    let err = bounded(
        "lock_timeout beyond MAX_DURATION",
        mutex.lock_timeout(MAX_DURATION + Duration::from_secs(1)),
    )
    .await
    .expect_err("timeout beyond MAX_DURATION");
    assert!(matches!(err, Error::InvalidDuration { .. }), "{err:?}");

    // Extensions.
    let guard = bounded("lock", mutex.lock()).await.expect("lock");
    for lease in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MAX_DURATION + Duration::from_secs(1),
    ] {
        let err = bounded("extend", guard.extend(lease))
            .await
            .expect_err(&format!("extend({lease:?}) must be rejected"));
        assert!(matches!(err, Error::InvalidDuration { .. }), "{err:?}");
    }
    let state = bounded("state", mutex.state()).await.expect("state");
    assert!(state.locked, "rejected extensions must not touch the hold");
    assert_eq!(state.fencing_token, Some(guard.fencing_token()));
    bounded("unlock", guard.unlock()).await.expect("unlock");

    // Nothing was written for the rejected names: only the layout record, this client's
    // marker and inbox, the (one) shard's fence key and events, and the two valid locks.
    let keys = server.keys(&format!("*{prefix}*"));
    let fence = mutex_keys(prefix, 1, "leases").fence;
    assert!(
        keys.iter().all(|k| k.contains("leases")
            || k.contains('é')
            || *k == layout_key(prefix)
            || is_client_marker(prefix, k)
            || is_inbox(prefix, k)
            || *k == fence
            || k.ends_with(":events")
            || k.ends_with(":seq")),
        "unexpected keys: {keys:?}"
    );
    assert!(keys.contains(&fence), "no shard fence key: {keys:?}");
    assert!(
        keys.iter().filter(|k| is_client_marker(prefix, k)).count() <= 1,
        "one client, at most one marker: {keys:?}"
    );
    assert!(
        keys.iter().filter(|k| is_inbox(prefix, k)).count() <= 1,
        "one client, at most one inbox: {keys:?}"
    );
    shutdown(&locks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_work_and_keep_their_keys_under_one_hash_tag() {
    support::init_tracing();
    let server = RedisServer::start();
    let names = [
        "a{b}c",
        "{x}",
        "}{",
        "{}",
        "line\nbreak\r\n",
        "nul\0byte",
        "all{\n\0}:*?[x]",
        "mutex.fence:a",
        "fence",
        "🔒 ünïcode",
    ];
    for mode in MODES {
        let prefix = format!("fail-odd-{}", mode.as_str());
        let shards = 16;
        let locks = connect(sharded_config(&server.url(), &prefix, mode, shards)).await;
        let rival = connect(sharded_config(&server.url(), &prefix, mode, shards)).await;
        // The last token of each shard's fence key: a take of a new lock name reads the fence
        // key, and its token is above every token the key issued.
        let mut last_tokens: HashMap<String, u64> = HashMap::new();
        for name in names {
            let keys = mutex_keys(&prefix, shards, name);
            let last_token = last_tokens.get(&keys.fence).copied().unwrap_or(0);
            let mutex = locks.mutex(name).expect("odd name is valid");
            assert_eq!(mutex.name(), name);
            let guard = bounded("lock", mutex.lock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} lock {name:?}: {e}"));
            assert_eq!(guard.name(), name);
            let token = guard.fencing_token();
            assert_eq!(
                hold_owner(&server, &keys.hold).as_deref(),
                Some(guard.owner().id()),
                "{mode:?} {name:?}: hold key {:?}",
                keys.hold
            );
            // The shard's fence key records this token as the shard's last, stamped with
            // the prefix's layout.
            let (last, stamp) = fence_value(&server, &keys.fence);
            assert_eq!(last, token, "{mode:?} {name:?}: fence key");
            assert_eq!(
                server.cmd(&["GET", &layout_key(&prefix)]).as_str(),
                Some(stamp),
                "{mode:?} {name:?}: fence key stamp"
            );
            assert!(
                token > last_token,
                "{mode:?} {name:?}: token {token} after {last_token} in the same shard"
            );

            // A waiter from another client queues in the hold (one line), and leaves the queue
            // when its patience runs out; the hold is untouched.
            let other = rival.mutex(name).expect("mutex");
            let waited = bounded(
                "lock_timeout",
                other.lock_timeout(Duration::from_millis(200)),
            )
            .await
            .expect("lock_timeout");
            assert!(waited.is_none(), "{mode:?} {name:?}: lock is held");
            assert!(
                queued_waiters(&server, &keys.hold).is_empty(),
                "{mode:?} {name:?}: the waiter stayed queued"
            );
            assert_eq!(
                hold_owner(&server, &keys.hold).as_deref(),
                Some(guard.owner().id()),
                "{mode:?} {name:?}: the hold changed"
            );

            // Every key of the lock carries the same (our) hash tag first: the hold hash (its
            // wait queue, a sorted set beside it, exists only while somebody waits).
            let all = server.keys("*");
            let ours: Vec<&String> = all
                .iter()
                .filter(|k| k.ends_with(name) && k.contains(":mutex"))
                .filter(|k| k.starts_with(&format!("{{{prefix}:")))
                .collect();
            assert_eq!(ours, [&keys.hold], "{mode:?} {name:?}");
            for key in &ours {
                assert!(
                    key.starts_with(&keys.tag),
                    "{mode:?} {name:?}: {key:?} lacks tag {}",
                    keys.tag
                );
            }

            // A waiting rival (queued in the hold) is granted the lock by the release: the next
            // token of the lock, f + 1, which leaves the shard's fence key as it was.
            let waiter = tokio::spawn({
                let other = other.clone();
                async move { other.lock().await }
            });
            eventually("rival queues", || {
                queued_waiters(&server, &keys.hold).len() == 1
            })
            .await;
            bounded("unlock", guard.unlock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} unlock {name:?}: {e}"));
            let next = bounded("rival acquires", waiter)
                .await
                .expect("join")
                .expect("rival lock");
            assert!(next.fencing_token() > token, "{mode:?} {name:?}");
            assert_eq!(fence_value(&server, &keys.fence).0, token);
            last_tokens.insert(keys.fence.clone(), token);
            bounded("unlock", next.unlock()).await.expect("unlock");
            let state = bounded("state", mutex.state()).await.expect("state");
            assert!(!state.locked, "{mode:?} {name:?}: {state:?}");
        }
        shutdown(&locks).await;
        shutdown(&rival).await;
    }
}

/// A tiny deterministic generator (xorshift), so failures are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn name(&mut self) -> String {
        const PIECES: &[&str] = &[
            "{",
            "}",
            "{}",
            ":",
            "\n",
            "\r\n",
            "\0",
            " ",
            "*",
            "?",
            "[",
            "]",
            "|",
            "\\",
            "é",
            "锁",
            "🔒",
            "a",
            "Z",
            "0",
            "-",
            "fence",
            "wait",
            "queue",
            "{fredlock:0}",
        ];
        let len = match self.next() % 10 {
            0 => 0,
            1 => MAX_NAME_LEN + 1 + (self.next() % 50) as usize,
            _ => (self.next() % 40) as usize,
        };
        let mut name = String::new();
        while name.len() < len {
            name.push_str(PIECES[(self.next() % PIECES.len() as u64) as usize]);
        }
        name
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_names_are_refused_or_work_and_never_collide() {
    init_tracing();
    let server = RedisServer::start();
    let locks = LockClient::connect(sharded_config(
        &server,
        "names",
        NotificationMode::Stream,
        1,
    ))
    .await
    .unwrap();
    let mut rng = Rng(0x5eed_f00d_dead_beef);
    let mut held = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..300 {
        let name = rng.name();
        let valid = !name.is_empty() && name.len() <= MAX_NAME_LEN;
        match locks.mutex(&name) {
            Err(Error::InvalidName(_)) => assert!(!valid, "{name:?} refused"),
            Err(other) => panic!("{name:?}: {other:?}"),
            Ok(mutex) => {
                assert!(valid, "{name:?} accepted");
                if !seen.insert(name.clone()) {
                    continue;
                }
                // Distinct names are distinct locks: every fresh name is free.
                let guard = bounded("try_lock", mutex.try_lock())
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{name:?} was not free: names collided"));
                held.push(guard);
            }
        }
    }
    assert!(
        held.len() > 100,
        "the generator should produce many valid names"
    );
    for guard in held {
        guard.unlock().await.unwrap();
    }
    // Every key is under the one hash tag of shard 0, but for the per-prefix keys: the layout
    // record, this client's marker `{names:layout}:client:<16 hex digits>`, and the events.
    for key in server.keys("*") {
        assert!(
            key.starts_with("{names:0}:")
                || key == "{names:layout}"
                || is_client_marker("names", &key)
                || key.starts_with("{names:events}"),
            "{key:?} escaped the hash tag"
        );
    }
    locks.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// configurations
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configs_are_refused_before_any_network_call() {
    support::init_tracing();
    // Were the client to connect, it would hang on the blackhole (or get a Connect/Timeout
    // error), not answer InvalidConfig / InvalidDuration.
    let (port, hole) = blackhole().await;
    let url = format!("redis://127.0.0.1:{port}");
    let base = || sharded_config(&url, "fail-config", NotificationMode::Stream, 1);

    type Tweak = fn(&mut Config);
    let invalid_config: [(&str, Tweak); 8] = [
        ("shards 0", |c| c.shards = 0),
        ("shards 1025", |c| c.shards = 1025),
        ("empty prefix", |c| c.key_prefix = String::new()),
        ("prefix with braces", |c| c.key_prefix = "a{b}".into()),
        ("prefix with open brace", |c| c.key_prefix = "a{".into()),
        ("prefix with space", |c| c.key_prefix = "a b".into()),
        ("prefix with newline", |c| c.key_prefix = "a\nb".into()),
        ("prefix of 65 chars", |c| c.key_prefix = "p".repeat(65)),
    ];
    let invalid_duration: [(&str, Tweak); 8] = [
        ("zero connect_timeout", |c| {
            c.connect_timeout = Duration::ZERO
        }),
        ("zero command_timeout", |c| {
            c.command_timeout = Duration::ZERO
        }),
        ("zero watchdog_lease", |c| c.watchdog_lease = Duration::ZERO),
        ("1 ms watchdog_lease", |c| {
            c.watchdog_lease = Duration::from_millis(1)
        }),
        ("zero reconnect_max_delay", |c| {
            c.reconnect_max_delay = Duration::ZERO
        }),
        ("zero notifier_block", |c| c.notifier_block = Duration::ZERO),
        ("huge command_timeout", |c| {
            c.command_timeout = MAX_DURATION + Duration::from_secs(1)
        }),
        ("huge watchdog_lease", |c| c.watchdog_lease = Duration::MAX),
    ];
    for (what, tweak) in invalid_config.iter().chain(invalid_duration.iter()) {
        let mut config = base();
        tweak(&mut config);
        let validated = config.validate().expect_err(what);
        let err = bounded(what, LockClient::connect(config))
            .await
            .expect_err(what);
        let ok = if invalid_config.iter().any(|(w, _)| w == what) {
            matches!(err, Error::InvalidConfig(_)) && matches!(validated, Error::InvalidConfig(_))
        } else {
            matches!(err, Error::InvalidDuration { .. })
                && matches!(validated, Error::InvalidDuration { .. })
        };
        assert!(
            ok,
            "{what}: connect gave {err:?}, validate gave {validated:?}"
        );
        shown(&err);
    }

    // A URL fred cannot parse.
    for bad_url in ["not a url", "", "redis://127.0.0.1:notaport"] {
        let mut config = base();
        config.url = bad_url.into();
        let err = bounded("bad url", LockClient::connect(config))
            .await
            .expect_err(bad_url);
        assert!(
            matches!(err, Error::InvalidConfig(_)),
            "{bad_url:?}: {err:?}"
        );
        shown(&err);
    }

    // The reference configuration itself is fine (and so the blackhole would have been hit).
    base().validate().expect("base config is valid");
    hole.abort();
}

// ---------------------------------------------------------------------------
// Display / Debug
// ---------------------------------------------------------------------------

#[test]
fn errors_display_and_config_hides_passwords() {
    use fred::error::{Error as FredError, ErrorKind};
    let fred = || FredError::new(ErrorKind::IO, "boom");
    let errors = vec![
        Error::InvalidName("the name is empty".into()),
        Error::InvalidDuration {
            what: "lease",
            value: Duration::ZERO,
            reason: "must not be zero",
        },
        Error::InvalidConfig("x".into()),
        Error::LayoutMismatch {
            prefix: "p".into(),
            server: "v1 shards=1".into(),
            ours: "v1 shards=2".into(),
        },
        Error::Connect(fred()),
        Error::Timeout(fred()),
        Error::Auth(fred()),
        Error::WrongType {
            lock: "l\0\n{}".into(),
            key: "{p:0}:mutex:l".into(),
        },
        Error::OutOfMemory(fred()),
        Error::Redis(fred()),
        Error::Protocol {
            script: "hold_acquire",
            detail: "nonsense".into(),
        },
        Error::NotHeld {
            lock: "l".into(),
            reason: NotHeldReason::Expired,
        },
        Error::NotHeld {
            lock: "l".into(),
            reason: NotHeldReason::HeldByOther,
        },
        Error::UpgradeNotSupported("l".into()),
        Error::Shutdown,
    ];
    for err in &errors {
        shown(err);
        let _ = std::error::Error::source(err).map(|s| s.to_string());
    }
    // Redis and connection failures keep their cause.
    assert!(std::error::Error::source(&Error::Connect(fred())).is_some());

    for url in [
        "redis://:hunter2@127.0.0.1:6379",
        "redis://user:hunter2@127.0.0.1:6379/3",
        "rediss://user:hunter2@example.com:6380",
        "redis://user:hunter2:with:colons@127.0.0.1",
        "redis://user:hun@ter2@127.0.0.1",
    ] {
        let config = Config::new(url);
        let debug = format!("{config:?}");
        let pretty = format!("{config:#?}");
        for shown in [&debug, &pretty, &config.redacted_url()] {
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
            assert!(!shown.contains("ter2"), "{url}: {shown}");
        }
        assert!(debug.contains("127.0.0.1") || debug.contains("example.com"));
    }
    // Without a password nothing is hidden.
    let plain = Config::new("redis://127.0.0.1:6379");
    assert!(format!("{plain:?}").contains("redis://127.0.0.1:6379"));
}
