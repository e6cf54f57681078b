//! Failure semantics (SPEC §5): bad input, unreachable / refusing / misconfigured servers,
//! foreign values in the lock's keys, script cache loss, OOM, releases of lost holds and
//! shutdown. Every test talks to its own throwaway `redis-server` (see `tests/support`).
//!
//! Bounded waits (`bounded`, `eventually`) only turn hangs into failures; no test asserts how
//! long anything took.

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use fredlock::{
    Config, Error, Lease, LockClient, LostCause, NotHeldReason, NotificationMode, Owner,
    MAX_DURATION, MAX_NAME_LEN, MIN_LEASE,
};
use support::{RedisServer, Resp};

/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(30);
const MODES: [NotificationMode; 2] = [NotificationMode::Stream, NotificationMode::PubSub];

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(HANG, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: no answer within {HANG:?} (hang)"),
    }
}

/// Polls `cond` (sync) until it holds; panics after [`HANG`].
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: condition not reached within {HANG:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mode_name(mode: NotificationMode) -> &'static str {
    mode.as_str()
}

fn config(url: &str, prefix: &str, mode: NotificationMode, shards: u16) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config.shards = shards;
    config.connect_timeout = Duration::from_secs(5);
    config.command_timeout = Duration::from_secs(5);
    config
}

async fn connect(config: Config) -> LockClient {
    let shown = format!("{config:?}");
    bounded("connect", LockClient::connect(config))
        .await
        .unwrap_or_else(|e| panic!("connect with {shown}: {e}"))
}

/// 32-bit FNV-1a, as documented for the shard of a lock name.
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &b in bytes {
        hash ^= u32::from(b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The documented key names of mutex `name`.
struct MutexKeys {
    tag: String,
    hold: String,
    /// The fence key of the lock's shard (shared by every lock of the shard).
    fence: String,
    wait: String,
}

fn mutex_keys(prefix: &str, shards: u16, name: &str) -> MutexKeys {
    let shard = fnv1a32(name.as_bytes()) % u32::from(shards);
    let tag = format!("{{{prefix}:{shard}}}");
    MutexKeys {
        hold: format!("{tag}:mutex:{name}"),
        fence: format!("{tag}:fence"),
        wait: format!("{tag}:mutex.wait:{name}"),
        tag,
    }
}

/// The layout record of a key prefix.
fn layout_key(prefix: &str) -> String {
    format!("{{{prefix}:layout}}")
}

/// Whether `key` is the liveness marker of one client of `prefix`:
/// `{P:layout}:client:<16 hex digits>`.
fn is_client_marker(prefix: &str, key: &str) -> bool {
    key.strip_prefix(&format!("{}:client:", layout_key(prefix)))
        .is_some_and(|tag| tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A shard fence key's value, `"<last token>|<layout stamp>"`, split (panics on any other
/// shape).
fn fence_value(server: &RedisServer, fence: &str) -> (u64, String) {
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
fn hold_owner(server: &RedisServer, hold: &str) -> Option<String> {
    server.cmd(&["HGET", hold, "o"]).as_str()
}

fn hold_fields(server: &RedisServer, hold: &str) -> Vec<Option<String>> {
    server
        .cmd(&["HMGET", hold, "o", "c", "f"])
        .as_array()
        .iter()
        .map(Resp::as_str)
        .collect()
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd(&["EXISTS", key]).as_int() == 1
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> String {
    let info = server.cmd(&["INFO", section]).as_str().expect("INFO reply");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
        .trim()
        .to_owned()
}

/// Display and Debug of an error must work and say something.
fn shown(err: &Error) -> String {
    let text = err.to_string();
    eprintln!("[observed] {err:?} => {text}");
    assert!(!text.is_empty(), "empty Display for {err:?}");
    assert!(!format!("{err:?}").is_empty());
    text
}

// ---------------------------------------------------------------------------
// 1. bad input
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_leases_and_timeouts_are_typed_errors() {
    support::init_tracing();
    let server = RedisServer::start();
    let prefix = "fail-input";
    let locks = connect(config(&server.url(), prefix, NotificationMode::Stream, 1)).await;

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
    // marker, the (one) shard's fence key and events, and the two valid locks.
    let keys = server.keys(&format!("*{prefix}*"));
    let fence = mutex_keys(prefix, 1, "leases").fence;
    assert!(
        keys.iter().all(|k| k.contains("leases")
            || k.contains('é')
            || *k == layout_key(prefix)
            || is_client_marker(prefix, k)
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
    bounded("shutdown", locks.shutdown())
        .await
        .expect("shutdown");
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
        let prefix = format!("fail-odd-{}", mode_name(mode));
        let shards = 16;
        let locks = connect(config(&server.url(), &prefix, mode, shards)).await;
        let rival = connect(config(&server.url(), &prefix, mode, shards)).await;
        // The last token seen per shard fence key: tokens strictly increase per shard.
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

            // A waiter from another client leaves the waiter marker.
            let other = rival.mutex(name).expect("mutex");
            let waited = bounded(
                "lock_timeout",
                other.lock_timeout(Duration::from_millis(200)),
            )
            .await
            .expect("lock_timeout");
            assert!(waited.is_none(), "{mode:?} {name:?}: lock is held");
            assert!(
                exists(&server, &keys.wait),
                "{mode:?} {name:?}: waiter marker {:?}",
                keys.wait
            );

            // Every key of the lock carries the same (our) hash tag first.
            let all = server.keys("*");
            let ours: Vec<&String> = all
                .iter()
                .filter(|k| k.ends_with(name) && k.contains(":mutex"))
                .filter(|k| k.starts_with(&format!("{{{prefix}:")))
                .collect();
            assert_eq!(ours.len(), 2, "{mode:?} {name:?}: {ours:?}");
            assert!(
                ours.contains(&&keys.hold) && ours.contains(&&keys.wait),
                "{mode:?} {name:?}: {ours:?}"
            );
            for key in &ours {
                assert!(
                    key.starts_with(&keys.tag),
                    "{mode:?} {name:?}: {key:?} lacks tag {}",
                    keys.tag
                );
            }

            // A waiting rival is woken by the release and gets the next token.
            let waiter = tokio::spawn({
                let other = other.clone();
                async move { other.lock().await }
            });
            eventually("rival waits", || rival.stats().waiting == 1).await;
            bounded("unlock", guard.unlock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} unlock {name:?}: {e}"));
            let next = bounded("rival acquires", waiter)
                .await
                .expect("join")
                .expect("rival lock");
            assert!(next.fencing_token() > token);
            assert_eq!(fence_value(&server, &keys.fence).0, next.fencing_token());
            last_tokens.insert(keys.fence.clone(), next.fencing_token());
            bounded("unlock", next.unlock()).await.expect("unlock");
            let state = bounded("state", mutex.state()).await.expect("state");
            assert!(!state.locked, "{mode:?} {name:?}: {state:?}");
        }
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        bounded("shutdown", rival.shutdown())
            .await
            .expect("shutdown");
    }
}

/// A TCP listener that accepts connections and never answers (nor closes them).
async fn blackhole() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind blackhole");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configs_are_refused_before_any_network_call() {
    support::init_tracing();
    // Were the client to connect, it would hang on the blackhole (or get a Connect/Timeout
    // error), not answer InvalidConfig / InvalidDuration.
    let (port, hole) = blackhole().await;
    let url = format!("redis://127.0.0.1:{port}");
    let base = || config(&url, "fail-config", NotificationMode::Stream, 1);

    type Tweak = fn(&mut Config);
    let invalid_config: [(&str, Tweak); 9] = [
        ("shards 0", |c| c.shards = 0),
        ("shards 1025", |c| c.shards = 1025),
        ("empty prefix", |c| c.key_prefix = String::new()),
        ("prefix with braces", |c| c.key_prefix = "a{b}".into()),
        ("prefix with open brace", |c| c.key_prefix = "a{".into()),
        ("prefix with space", |c| c.key_prefix = "a b".into()),
        ("prefix with newline", |c| c.key_prefix = "a\nb".into()),
        ("prefix of 65 chars", |c| c.key_prefix = "p".repeat(65)),
        ("stream_max_len 0", |c| c.stream_max_len = 0),
    ];
    let invalid_duration: [(&str, Tweak); 9] = [
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
        ("zero waiter_grace", |c| c.waiter_grace = Duration::ZERO),
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
// 2./3. unreachable, silent, refusing and misconfigured servers
// ---------------------------------------------------------------------------

fn quick(url: &str, prefix: &str) -> Config {
    let mut config = config(url, prefix, NotificationMode::Stream, 1);
    config.connect_timeout = Duration::from_secs(1);
    config.command_timeout = Duration::from_secs(1);
    config.reconnect_max_delay = Duration::from_millis(200);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_a_connect_error() {
    support::init_tracing();
    let port = support::free_port(); // nothing listens here
    for mode in MODES {
        let mut config = quick(&format!("redis://127.0.0.1:{port}"), "fail-unreachable");
        config.notification = mode;
        let err = bounded("connect to a closed port", LockClient::connect(config))
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, Error::Connect(_)), "{mode:?}: {err:?}");
        assert!(err.is_transient());
        shown(&err);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_server_gives_connect_or_timeout_error() {
    support::init_tracing();
    let (port, hole) = blackhole().await;
    for mode in MODES {
        let mut config = quick(&format!("redis://127.0.0.1:{port}"), "fail-blackhole");
        config.notification = mode;
        let err = bounded("connect to a blackhole", LockClient::connect(config))
            .await
            .expect_err("the blackhole never answers");
        assert!(
            matches!(err, Error::Connect(_) | Error::Timeout(_)),
            "{mode:?}: {err:?}"
        );
        shown(&err);
    }
    hole.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_speaking_server_gives_typed_error() {
    support::init_tracing();
    // Accepts, writes something that is not RESP, and closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            let _ = socket.shutdown().await;
        }
    });
    let err = bounded(
        "connect to a non-Redis server",
        LockClient::connect(quick(&format!("redis://127.0.0.1:{port}"), "fail-garbage")),
    )
    .await
    .expect_err("not a Redis server");
    assert!(
        matches!(
            err,
            Error::Connect(_) | Error::Timeout(_) | Error::Redis(_) | Error::Protocol { .. }
        ),
        "{err:?}"
    );
    shown(&err);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_an_auth_error() {
    support::init_tracing();
    let password = "s3cret-Pa55";
    let server = RedisServer::start_with(&["--requirepass", password]);
    let wrong = "not-the-Pa55word";

    for mode in MODES {
        let prefix = format!("fail-auth-{}", mode_name(mode));
        for (what, url) in [
            ("wrong password", server.url_with_password(wrong)),
            (
                "wrong user",
                format!("redis://nobody:{password}@127.0.0.1:{}", server.port()),
            ),
        ] {
            let mut config = quick(&url, &prefix);
            config.notification = mode;
            let shown_config = format!("{config:?}");
            assert!(!shown_config.contains(wrong) && !shown_config.contains(password));
            let err = bounded(what, LockClient::connect(config))
                .await
                .expect_err(what);
            assert!(matches!(err, Error::Auth(_)), "{mode:?} {what}: {err:?}");
            let text = shown(&err);
            assert!(!text.contains(wrong) && !text.contains(password), "{text}");
            assert!(!format!("{err:?}").contains(wrong));
        }

        // No password at all: the server answers NOAUTH to the first command.
        let mut config = quick(&server.url(), &prefix);
        config.notification = mode;
        let err = bounded("no password", LockClient::connect(config))
            .await
            .expect_err("no password");
        assert!(
            matches!(err, Error::Auth(_)),
            "{mode:?} no password: {err:?}"
        );
        shown(&err);

        // The right password works, and never shows in Debug output.
        let config = config_with(&server.url_with_password(password), &prefix, mode);
        let locks = connect(config).await;
        assert!(!format!("{locks:?}").contains(password));
        assert!(!format!("{:?}", locks.config()).contains(password));
        let mutex = locks.mutex("authed").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        let keys = mutex_keys(&prefix, 1, "authed");
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(guard.owner().id())
        );
        bounded("unlock", guard.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

fn config_with(url: &str, prefix: &str, mode: NotificationMode) -> Config {
    config(url, prefix, mode, 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_database_index_is_a_typed_error() {
    support::init_tracing();
    let server = RedisServer::start(); // 16 databases
    let err = bounded(
        "connect to db 99",
        LockClient::connect(quick(
            &format!("redis://127.0.0.1:{}/99", server.port()),
            "fail-db",
        )),
    )
    .await
    .expect_err("db 99 does not exist");
    assert!(
        matches!(
            err,
            Error::Connect(_) | Error::Redis(_) | Error::InvalidConfig(_)
        ),
        "{err:?}"
    );
    shown(&err);
    assert!(
        server.keys("*").is_empty(),
        "nothing may be written to db 0"
    );

    // The last database works, and the lock's keys land there.
    let locks = connect(config_with(
        &format!("redis://127.0.0.1:{}/15", server.port()),
        "fail-db",
        NotificationMode::Stream,
    ))
    .await;
    let guard = bounded("lock", locks.mutex("in-db-15").expect("mutex").lock())
        .await
        .expect("lock");
    let keys = mutex_keys("fail-db", 1, "in-db-15");
    let mut conn = server.connect().expect("connect");
    assert_eq!(
        conn.cmd(&["SELECT", "15"]).expect("select"),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        conn.cmd(&["HGET", &keys.hold, "o"])
            .expect("hget")
            .as_str()
            .as_deref(),
        Some(guard.owner().id())
    );
    assert!(!exists(&server, &keys.hold), "db 0 must stay empty");
    bounded("unlock", guard.unlock()).await.expect("unlock");
    bounded("shutdown", locks.shutdown())
        .await
        .expect("shutdown");
}

// ---------------------------------------------------------------------------
// 4. WRONGTYPE
// ---------------------------------------------------------------------------

/// Writes a foreign value of `kind` at `key` and returns a snapshot to compare later.
fn plant(server: &RedisServer, key: &str, kind: &str) -> Resp {
    server.cmd(&["DEL", key]);
    let reply = match kind {
        "string" => server.cmd(&["SET", key, "planted"]),
        // Foreign strings at a fence key: no "<digits>|" prefix.
        "hello" => server.cmd(&["SET", key, "hello"]),
        "12" => server.cmd(&["SET", key, "12"]),
        "list" => server.cmd(&["RPUSH", key, "p1", "p2"]),
        "hash" => server.cmd(&["HSET", key, "x", "y"]),
        "set" => server.cmd(&["SADD", key, "m"]),
        other => panic!("unknown kind {other}"),
    };
    assert!(!reply.is_error(), "plant {kind}: {reply:?}");
    snapshot(server, key)
}

fn snapshot(server: &RedisServer, key: &str) -> Resp {
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

fn assert_wrong_type(err: &Error, name: &str, context: &str) {
    match err {
        Error::WrongType { lock, key } => {
            assert_eq!(lock, name, "{context}");
            assert!(key.contains(name), "{context}: key {key:?}");
        }
        other => panic!("{context}: expected WrongType, got {other:?}"),
    }
    assert!(!err.is_transient(), "{context}: WRONGTYPE is not transient");
    shown(err);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_at_hold_or_fence_key_give_wrong_type() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        for (role, kind) in [
            ("hold", "string"),
            ("hold", "list"),
            ("hold", "set"),
            ("fence", "list"),
            ("fence", "hash"),
            ("fence", "hello"),
            ("fence", "12"),
        ] {
            let name = format!("wt-{role}-{kind}");
            let keys = mutex_keys(&prefix, 1, &name);
            // The fence key is the shard's: lock it once so that the fence key exists, then
            // the foreign value replaces a real one (as a clobbering writer would).
            let mutex = locks.mutex(&name).expect("mutex");
            let guard = bounded("lock", mutex.lock()).await.expect("first lock");
            bounded("unlock", guard.unlock())
                .await
                .expect("first unlock");
            assert!(exists(&server, &keys.fence), "no shard fence key");
            server.cmd(&["DEL", &keys.hold, &keys.wait]);
            let fence_before = snapshot(&server, &keys.fence);
            let key = if role == "hold" {
                &keys.hold
            } else {
                &keys.fence
            };
            let planted = plant(&server, key, kind);
            let context = format!("{mode:?} {kind} at {role} key");

            let err = bounded("try_lock", mutex.try_lock())
                .await
                .expect_err(&context);
            assert_wrong_type(&err, &name, &format!("{context}: try_lock"));
            let err = bounded("lock", mutex.lock()).await.expect_err(&context);
            assert_wrong_type(&err, &name, &format!("{context}: lock"));
            let err = bounded("lock_timeout", mutex.lock_timeout(Duration::from_secs(1)))
                .await
                .expect_err(&context);
            assert_wrong_type(&err, &name, &format!("{context}: lock_timeout"));
            if role == "hold" {
                let err = bounded("state", mutex.state()).await.expect_err(&context);
                assert_wrong_type(&err, &name, &format!("{context}: state"));
                let err = bounded("force_unlock", mutex.force_unlock())
                    .await
                    .expect_err(&context);
                assert_wrong_type(&err, &name, &format!("{context}: force_unlock"));
            }

            if role == "fence" {
                // The fence key is shared by the shard: every lock of it is refused alike.
                let sibling = format!("wt-{role}-{kind}-sibling");
                let other = locks.mutex(&sibling).expect("mutex");
                let err = bounded("try_lock", other.try_lock())
                    .await
                    .expect_err(&context);
                assert_wrong_type(&err, &sibling, &format!("{context}: sibling try_lock"));
                let sibling_keys = mutex_keys(&prefix, 1, &sibling);
                assert!(
                    !exists(&server, &sibling_keys.hold) && !exists(&server, &sibling_keys.wait),
                    "{context}: sibling keys written"
                );
            }

            assert_eq!(snapshot(&server, key), planted, "{context}: value changed");
            for other in [&keys.hold, &keys.wait] {
                if other != key {
                    assert!(!exists(&server, other), "{context}: {other:?} was written");
                }
            }
            if role == "hold" {
                // No token was issued: the shard's fence key is as it was.
                assert_eq!(
                    snapshot(&server, &keys.fence),
                    fence_before,
                    "{context}: fence key changed"
                );
            }
            assert_eq!(locks.stats().waiting, 0, "{context}: waiter left behind");
            assert_eq!(locks.stats().held, 0, "{context}: hold left behind");
            // Clean up: the shard's other locks need the fence key back (a missing one is
            // created again at the next acquisition).
            server.cmd(&["DEL", key]);
        }

        // Other locks of the same shard still work.
        let fine = locks.mutex("wt-fine").expect("mutex");
        let guard = bounded("lock", fine.lock()).await.expect("lock");
        assert!(bounded("state", fine.state()).await.expect("state").locked);
        bounded("unlock", guard.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_numeric_fence_value_is_a_typed_error_and_left_alone() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-num-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let name = "fence-not-a-number";
        let keys = mutex_keys(&prefix, 1, name);
        let mutex = locks.mutex(name).expect("mutex");
        // A first acquisition creates the shard's fence key (and records the layout).
        let guard = bounded("lock", mutex.lock()).await.expect("first lock");
        let token = guard.fencing_token();
        bounded("unlock", guard.unlock())
            .await
            .expect("first unlock");
        let (_, stamp) = fence_value(&server, &keys.fence);
        // (The release left a tombstone at the hold key; its TTL runs down.)
        let hold_before = server.cmd(&["HGETALL", &keys.hold]);
        // Strings that are not "<last token>|<layout>": foreign values, whatever the layout.
        for value in [
            "planted".to_owned(),
            "12".to_owned(),
            format!("x12|{stamp}"),
            format!("|{stamp}"),
        ] {
            server.cmd(&["SET", &keys.fence, &value]);
            let planted = snapshot(&server, &keys.fence);
            let err = bounded("try_lock", mutex.try_lock())
                .await
                .expect_err("the fence value is not a token");
            assert_wrong_type(&err, name, &format!("{mode:?} fence value {value:?}"));
            assert_eq!(
                snapshot(&server, &keys.fence),
                planted,
                "{mode:?} {value:?}"
            );
            assert_eq!(
                server.cmd(&["HGETALL", &keys.hold]),
                hold_before,
                "{mode:?}: hold half-written"
            );
            assert!(!exists(&server, &keys.wait), "{mode:?}: marker written");
        }
        // With the fence key back, the lock works again, above the shard's last token.
        server.cmd(&["SET", &keys.fence, &format!("{token}|{stamp}")]);
        let guard = bounded("lock", mutex.lock()).await.expect("lock again");
        assert!(guard.fencing_token() > token, "{mode:?}: token went back");
        bounded("unlock", guard.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_key_clobbered_while_held_gives_wrong_type_on_unlock() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-held-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let name = "clobbered";
        let keys = mutex_keys(&prefix, 1, name);
        let mutex = locks.mutex(name).expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        // Something else overwrites the hold with a string.
        let planted = plant(&server, &keys.hold, "string");
        let err = bounded("unlock", guard.unlock())
            .await
            .expect_err("the hold key is no longer a hash");
        assert_wrong_type(&err, name, &format!("{mode:?} unlock"));
        assert_eq!(snapshot(&server, &keys.hold), planted);
        server.cmd(&["DEL", &keys.hold]);
        let guard = bounded("lock", mutex.lock()).await.expect("lock again");
        bounded("unlock", guard.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

/// The waiter marker is a key of the lock too (SPEC §5: "lock key exists with another type:
/// a clear typed error"); a foreign value there should be reported like at the hold and fence
/// keys instead of being overwritten (by a waiting acquisition) or deleted (by a release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_wait_key_gives_wrong_type() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-wait-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let name = "wait-planted";
        let keys = mutex_keys(&prefix, 1, name);
        let mutex = locks.mutex(name).expect("mutex");
        let holder = bounded("lock", mutex.lock()).await.expect("lock");
        let planted = plant(&server, &keys.wait, "list");

        // A waiting acquisition must touch the marker: it has to report the foreign value.
        let waited = bounded("lock_timeout", mutex.lock_timeout(Duration::from_secs(2))).await;
        let after = snapshot(&server, &keys.wait);
        let err = waited.expect_err("a waiting acquisition must report the foreign marker");
        assert_wrong_type(&err, name, &format!("{mode:?} lock_timeout while held"));
        assert_eq!(after, planted, "{mode:?}: marker value changed");

        // Releasing must not delete the foreign value either.
        let released = bounded("unlock", holder.unlock()).await;
        assert_eq!(
            snapshot(&server, &keys.wait),
            planted,
            "{mode:?}: release deleted the foreign value ({released:?})"
        );
        server.cmd(&["DEL", &keys.wait]);
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

// ---------------------------------------------------------------------------
// 5. SCRIPT FLUSH
// ---------------------------------------------------------------------------

fn flush_scripts(server: &RedisServer) {
    assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
    assert_eq!(
        info_field(server, "memory", "number_of_cached_scripts"),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_transparent() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-flush-{}", mode_name(mode));
        let mut cfg = config_with(&server.url(), &prefix, mode);
        cfg.watchdog_lease = Duration::from_secs(6);
        let locks = connect(cfg.clone()).await;
        let other = connect(cfg).await;
        let mutex = locks.mutex("flushed").expect("mutex");
        let owner = Owner::new();
        let reentrant = mutex.clone().with_owner(&owner);

        let mut last_token = 0;
        for round in 0..10 {
            flush_scripts(&server);
            let guard = bounded("lock", mutex.lock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} round {round} lock: {e}"));
            assert!(guard.fencing_token() > last_token);
            last_token = guard.fencing_token();
            assert_ne!(
                info_field(&server, "memory", "number_of_cached_scripts"),
                "0",
                "the script was loaded again"
            );
            flush_scripts(&server);
            let state = bounded("state", mutex.state()).await.expect("state");
            assert_eq!(state.fencing_token, Some(last_token));
            flush_scripts(&server);
            assert!(
                bounded("try_lock", other.mutex("flushed").expect("m").try_lock())
                    .await
                    .expect("try_lock")
                    .is_none()
            );
            flush_scripts(&server);
            bounded("extend", guard.extend(Duration::from_secs(5)))
                .await
                .expect("extend");
            flush_scripts(&server);
            bounded("unlock", guard.unlock())
                .await
                .unwrap_or_else(|e| panic!("{mode:?} round {round} unlock: {e}"));
            flush_scripts(&server);
            let a = bounded("reenter", reentrant.lock()).await.expect("lock");
            flush_scripts(&server);
            let b = bounded("reenter", reentrant.lock())
                .await
                .expect("re-enter");
            assert_eq!(a.fencing_token(), b.fencing_token());
            last_token = a.fencing_token();
            flush_scripts(&server);
            bounded("unlock", b.unlock()).await.expect("unlock inner");
            flush_scripts(&server);
            assert_eq!(
                bounded("state", mutex.state())
                    .await
                    .expect("state")
                    .hold_count,
                1
            );
            flush_scripts(&server);
            bounded("unlock", a.unlock()).await.expect("unlock outer");
            flush_scripts(&server);
            assert!(bounded("force_unlock", mutex.force_unlock())
                .await
                .map(|removed| !removed)
                .expect("force_unlock"));
        }

        // A holder holds (renewed by the watchdog) and a waiter waits while scripts vanish.
        let holder = bounded("lock", mutex.lock()).await.expect("lock");
        let waiting = other.mutex("flushed").expect("mutex");
        let waiter = tokio::spawn(async move { waiting.lock().await });
        eventually("waiter registered", || other.stats().waiting == 1).await;
        let keys = mutex_keys(&prefix, 1, "flushed");
        // Several renewal periods (lease 6 s, renewed every 2 s) with the cache flushed
        // every half second: the hold must survive them.
        // (A renewal may load its script again between the flush and any check of the
        // cache, so this loop only flushes.)
        for _ in 0..14 {
            assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(holder.lost_cause(), None, "{mode:?}: renewal broke");
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(holder.owner().id())
        );
        assert!(!waiter.is_finished(), "{mode:?}: waiter got a held lock");
        let held_token = holder.fencing_token();
        assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
        bounded("unlock", holder.unlock()).await.expect("unlock");
        let next = bounded("waiter acquires", waiter)
            .await
            .expect("join")
            .expect("waiter lock");
        assert!(next.fencing_token() > held_token);
        assert_eq!(server.cmd(&["SCRIPT", "FLUSH"]), Resp::Simple("OK".into()));
        bounded("unlock", next.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        bounded("shutdown", other.shutdown())
            .await
            .expect("shutdown");
    }
}

// ---------------------------------------------------------------------------
// 6. OOM
// ---------------------------------------------------------------------------

/// Fills memory with a 4 MiB value, then lowers `maxmemory` 1 MiB below the memory in use
/// (policy noeviction), so that every write that needs memory is refused with OOM — with a wide
/// margin, whatever client buffers come and go.
fn fill_until_oom(server: &RedisServer, filler: &str) {
    let chunk = "x".repeat(256 * 1024);
    let mut conn = server.connect().expect("connect");
    for _ in 0..16 {
        let reply = conn.cmd(&["APPEND", filler, &chunk]).expect("append");
        assert!(!reply.is_error(), "APPEND failed: {reply:?}");
    }
    let used: u64 = info_field(server, "memory", "used_memory")
        .parse()
        .expect("used_memory");
    let limit = (used - 1024 * 1024).to_string();
    assert_eq!(
        conn.cmd(&["CONFIG", "SET", "maxmemory", &limit])
            .expect("config set"),
        Resp::Simple("OK".into())
    );
    // Writes that need memory fail now.
    for probe in [
        conn.cmd(&["SET", "oom-probe", "1"]).expect("set"),
        conn.cmd(&["APPEND", filler, "x"]).expect("append"),
    ] {
        assert!(
            probe.error_message().is_some_and(|e| e.starts_with("OOM")),
            "{probe:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_typed_and_writes_nothing() {
    support::init_tracing();
    for mode in MODES {
        let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
        let prefix = format!("fail-oom-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let rival = connect(config_with(&server.url(), &prefix, mode)).await;

        // Before OOM: a hold (with a waiter marker, so its release must emit an event), a busy
        // lock, and a free lock that took the shard's last token (one shard: every lock of the
        // prefix shares the fence key).
        let held = locks.mutex("oom-held").expect("mutex");
        let held_owner = Owner::new();
        let held_guard = bounded("lock", held.clone().with_owner(&held_owner).lock())
            .await
            .expect("lock");
        let held_inner = bounded("re-enter", held.clone().with_owner(&held_owner).lock())
            .await
            .expect("re-enter");
        let held_keys = mutex_keys(&prefix, 1, "oom-held");
        assert!(bounded(
            "lock_timeout",
            rival
                .mutex("oom-held")
                .expect("m")
                .lock_timeout(Duration::from_millis(100))
        )
        .await
        .expect("lock_timeout")
        .is_none());
        assert!(exists(&server, &held_keys.wait), "waiter marker");
        let held_before = hold_fields(&server, &held_keys.hold);

        let busy = rival.mutex("oom-busy").expect("mutex");
        let busy_guard = bounded("lock", busy.lock()).await.expect("lock");

        // A plain (not re-entered) hold with a waiter marker: its release frees the lock and
        // emits an event (XADD / PUBLISH) under OOM.
        let single = locks.mutex("oom-single").expect("mutex");
        let single_guard = bounded("lock", single.lock()).await.expect("lock");
        let single_keys = mutex_keys(&prefix, 1, "oom-single");
        assert!(bounded(
            "lock_timeout",
            rival
                .mutex("oom-single")
                .expect("m")
                .lock_timeout(Duration::from_millis(100))
        )
        .await
        .expect("lock_timeout")
        .is_none());
        assert!(exists(&server, &single_keys.wait), "waiter marker");
        let single_before = hold_fields(&server, &single_keys.hold);
        // On a single Redis one event stream and counter serve every lock of the prefix.
        let events_key = format!("{{{prefix}:events}}");
        let seq_key = format!("{{{prefix}:events}}:seq");
        let seq_before = server.cmd(&["GET", &seq_key]).as_str();

        let fresh = locks.mutex("oom-fresh").expect("mutex");
        let fresh_keys = mutex_keys(&prefix, 1, "oom-fresh");
        let g = bounded("lock", fresh.lock()).await.expect("lock");
        let fresh_token = g.fencing_token();
        for earlier in [
            held_guard.fencing_token(),
            busy_guard.fencing_token(),
            single_guard.fencing_token(),
        ] {
            assert!(
                fresh_token > earlier,
                "{mode:?}: {fresh_token} after {earlier}"
            );
        }
        bounded("unlock", g.unlock()).await.expect("unlock");
        assert_eq!(fence_value(&server, &fresh_keys.fence).0, fresh_token);
        let fence_before = snapshot(&server, &fresh_keys.fence);

        // Fill memory.
        fill_until_oom(&server, "oom-filler");

        // Acquisitions that must write fail with OutOfMemory and leave nothing behind.
        for attempt in 0..3 {
            let err = bounded("lock", fresh.lock())
                .await
                .expect_err("lock under OOM");
            assert!(
                matches!(err, Error::OutOfMemory(_)),
                "{mode:?} attempt {attempt}: {err:?}"
            );
            assert!(err.is_transient());
            shown(&err);
            let err = bounded("try_lock", fresh.try_lock())
                .await
                .expect_err("try_lock under OOM");
            assert!(matches!(err, Error::OutOfMemory(_)), "{mode:?}: {err:?}");
        }
        assert_eq!(hold_owner(&server, &fresh_keys.hold), None);
        assert_eq!(
            snapshot(&server, &fresh_keys.fence),
            fence_before,
            "{mode:?}: a failed attempt took a token"
        );
        assert!(!exists(&server, &fresh_keys.wait));
        assert_eq!(
            locks.stats().held,
            2,
            "{mode:?}: only oom-held/single are held"
        );
        assert_eq!(locks.stats().waiting, 0);

        // A busy lock: try_lock only reads (None), lock() must write its marker.
        let busy_keys = mutex_keys(&prefix, 1, "oom-busy");
        let other_busy = locks.mutex("oom-busy").expect("mutex");
        match bounded("try_lock busy", other_busy.try_lock()).await {
            Ok(None) | Err(Error::OutOfMemory(_)) => {}
            other => panic!("{mode:?}: try_lock of a busy lock under OOM: {other:?}"),
        }
        match bounded("lock busy", other_busy.lock()).await {
            Err(Error::OutOfMemory(_)) => {}
            other => panic!("{mode:?}: lock of a busy lock under OOM: {other:?}"),
        }
        assert_eq!(
            hold_owner(&server, &busy_keys.hold).as_deref(),
            Some(busy_guard.owner().id())
        );
        assert!(!exists(&server, &busy_keys.wait));
        let state = bounded("state", held.state()).await.expect("reads work");
        assert_eq!(state.hold_count, 2);

        // The hold taken before OOM: each release either happens completely or not at all.
        let inner = bounded("unlock inner", held_inner.unlock()).await;
        let after_inner = hold_fields(&server, &held_keys.hold);
        match &inner {
            Ok(()) => assert_eq!(
                after_inner,
                vec![
                    held_before[0].clone(),
                    Some("1".into()),
                    held_before[2].clone()
                ],
                "{mode:?}"
            ),
            Err(Error::OutOfMemory(_)) => assert_eq!(after_inner, held_before, "{mode:?}"),
            Err(other) => panic!("{mode:?}: inner unlock under OOM: {other:?}"),
        }
        let outer = bounded("unlock outer", held_guard.unlock()).await;
        let after_outer = hold_fields(&server, &held_keys.hold);
        match &outer {
            Ok(()) => {
                assert_eq!(after_outer, vec![None, None, None], "{mode:?}");
                assert!(!exists(&server, &held_keys.wait), "marker consumed");
            }
            Err(Error::OutOfMemory(_)) => {
                assert_eq!(after_outer, after_inner, "{mode:?}");
            }
            Err(other) => panic!("{mode:?}: outer unlock under OOM: {other:?}"),
        }

        // The plain hold: freed completely (marker consumed, one event) or left intact.
        let stream_len = |server: &RedisServer| match mode {
            NotificationMode::Stream => server.cmd(&["XLEN", &events_key]).as_int(),
            _ => 0,
        };
        let events_before = stream_len(&server);
        let released = bounded("unlock single", single_guard.unlock()).await;
        let seq_after = server.cmd(&["GET", &seq_key]).as_str();
        match &released {
            Ok(()) => {
                assert_eq!(hold_owner(&server, &single_keys.hold), None, "{mode:?}");
                assert!(!exists(&server, &single_keys.wait), "{mode:?}: marker");
                assert_ne!(seq_after, seq_before, "{mode:?}: no event counted");
                if mode == NotificationMode::Stream {
                    assert_eq!(stream_len(&server), events_before + 1, "{mode:?}: no XADD");
                }
            }
            Err(Error::OutOfMemory(_)) => {
                assert_eq!(hold_fields(&server, &single_keys.hold), single_before);
                assert!(exists(&server, &single_keys.wait), "{mode:?}: marker");
                assert_eq!(seq_after, seq_before, "{mode:?}: half-written event");
                assert_eq!(stream_len(&server), events_before);
            }
            Err(other) => panic!("{mode:?}: unlock under OOM: {other:?}"),
        }
        eprintln!("[observed] {mode:?} OOM releases: re-entered {inner:?} / {outer:?}, plain {released:?}");

        // Free the memory: everything works again, and the failed attempts used no token.
        server.cmd(&["DEL", "oom-filler"]);
        server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        // (No release under OOM hands a lock over: the shard issued no token meanwhile.)
        assert_eq!(
            snapshot(&server, &fresh_keys.fence),
            fence_before,
            "{mode:?}: a release under OOM took a token"
        );
        let g = bounded("lock", fresh.lock()).await.expect("lock after OOM");
        assert!(
            g.fencing_token() > fresh_token,
            "{mode:?}: token {} after {fresh_token}",
            g.fencing_token()
        );
        assert_eq!(fence_value(&server, &fresh_keys.fence).0, g.fencing_token());
        bounded("unlock", g.unlock()).await.expect("unlock");
        bounded("unlock busy", busy_guard.unlock())
            .await
            .expect("unlock");
        let g = bounded("lock busy", other_busy.lock()).await.expect("lock");
        bounded("unlock", g.unlock()).await.expect("unlock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        bounded("shutdown", rival.shutdown())
            .await
            .expect("shutdown");
    }
}

// ---------------------------------------------------------------------------
// 7. release semantics
// ---------------------------------------------------------------------------

async fn wait_until_free(mutex: &fredlock::Mutex) {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let state = bounded("state", mutex.state()).await.expect("state");
        if !state.locked {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease never expired: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_lost_hold_is_typed_and_leaves_the_new_holder_alone() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-release-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let rival = connect(config_with(&server.url(), &prefix, mode)).await;
        let name = "expiring";
        let keys = mutex_keys(&prefix, 1, name);
        let mutex = locks.mutex(name).expect("mutex");
        let short = mutex
            .clone()
            .with_lease(Lease::fixed(Duration::from_millis(300)))
            .expect("lease");

        // Expired, then taken by another owner: HeldByOther, new hold untouched.
        let old = bounded("lock", short.lock()).await.expect("lock");
        let lost = old.lost();
        wait_until_free(&mutex).await;
        assert_eq!(bounded("lost", lost).await, LostCause::Expired);
        let new = bounded("lock", rival.mutex(name).expect("m").lock())
            .await
            .expect("lock");
        assert!(new.fencing_token() > old.fencing_token());
        let before = bounded("state", mutex.state()).await.expect("state");
        let fields_before = hold_fields(&server, &keys.hold);
        let err = bounded("stale extend", old.extend(Duration::from_secs(5)))
            .await
            .expect_err("stale extend");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::HeldByOther,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let err = bounded("stale unlock", old.unlock())
            .await
            .expect_err("stale unlock");
        match &err {
            Error::NotHeld { lock, reason } => {
                assert_eq!(lock, name);
                assert_eq!(*reason, NotHeldReason::HeldByOther, "{mode:?}");
            }
            other => panic!("{mode:?}: expected NotHeld, got {other:?}"),
        }
        assert!(!err.is_transient());
        shown(&err);
        let after = bounded("state", mutex.state()).await.expect("state");
        assert_eq!(after.locked, before.locked);
        assert_eq!(after.hold_count, before.hold_count);
        assert_eq!(after.fencing_token, before.fencing_token);
        assert_eq!(after.fencing_token, Some(new.fencing_token()));
        assert_eq!(hold_fields(&server, &keys.hold), fields_before);
        assert_eq!(new.lost_cause(), None);
        bounded("unlock", new.unlock())
            .await
            .expect("new holder unlocks");
        assert!(!bounded("state", mutex.state()).await.expect("state").locked);

        // Expired with nobody holding: Expired.
        let old = bounded("lock", short.lock()).await.expect("lock");
        wait_until_free(&mutex).await;
        let err = bounded("extend", old.extend(Duration::from_secs(5)))
            .await
            .expect_err("extend after expiry");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::Expired,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let err = bounded("unlock", old.unlock()).await.expect_err("expired");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::Expired,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        assert_eq!(hold_owner(&server, &keys.hold), None);

        // A newer hold of the *same* owner is not released by the stale guard.
        let owner = Owner::new();
        let mine = short.clone().with_owner(&owner);
        let stale = bounded("lock", mine.lock()).await.expect("lock");
        wait_until_free(&mutex).await;
        let fresh = bounded("lock", mutex.clone().with_owner(&owner).lock())
            .await
            .expect("lock");
        assert!(fresh.fencing_token() > stale.fencing_token());
        let err = bounded("stale unlock", stale.unlock())
            .await
            .expect_err("stale hold of the same owner");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::HeldByOther,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let state = bounded("state", mutex.state()).await.expect("state");
        assert_eq!(state.hold_count, 1);
        assert_eq!(state.fencing_token, Some(fresh.fencing_token()));
        bounded("unlock", fresh.unlock()).await.expect("unlock");

        // Force-unlocked under a guard: Expired; then re-taken by another: HeldByOther.
        let victim = bounded("lock", mutex.lock()).await.expect("lock");
        assert!(bounded("force", mutex.force_unlock()).await.expect("force"));
        let err = bounded("extend", victim.extend(Duration::from_secs(5)))
            .await
            .expect_err("force-unlocked");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::Expired,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let thief = bounded("lock", rival.mutex(name).expect("m").lock())
            .await
            .expect("lock");
        let err = bounded("unlock", victim.unlock())
            .await
            .expect_err("force-unlocked and re-taken");
        assert!(
            matches!(
                err,
                Error::NotHeld {
                    reason: NotHeldReason::HeldByOther,
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        assert_eq!(
            hold_owner(&server, &keys.hold).as_deref(),
            Some(thief.owner().id())
        );
        bounded("unlock", thief.unlock()).await.expect("unlock");

        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        bounded("shutdown", rival.shutdown())
            .await
            .expect("shutdown");
    }
}

// ---------------------------------------------------------------------------
// 8. shutdown
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_fails_waiters_and_releases_holds() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-shutdown-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let other = connect(config_with(&server.url(), &prefix, mode)).await;

        // Holds of the client being shut down: one re-entered twice, one plain.
        let owner = Owner::new();
        let held = locks.mutex("sd-held").expect("mutex").with_owner(&owner);
        let outer = bounded("lock", held.lock()).await.expect("lock");
        let inner = bounded("re-enter", held.lock()).await.expect("re-enter");
        let plain = locks.mutex("sd-plain").expect("mutex");
        let plain_guard = bounded("lock", plain.lock()).await.expect("lock");
        // A lock held by the other client, and local waiters on it.
        let foreign = other.mutex("sd-foreign").expect("mutex");
        let foreign_guard = bounded("lock", foreign.lock()).await.expect("lock");
        let waiting = locks.mutex("sd-foreign").expect("mutex");
        let waiter_a = tokio::spawn({
            let waiting = waiting.clone();
            async move { waiting.lock().await }
        });
        let waiter_b = tokio::spawn({
            let waiting = waiting.clone();
            async move { waiting.lock_timeout(Duration::from_secs(3600)).await }
        });
        eventually("two waiters", || locks.stats().waiting == 2).await;

        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");

        let a = bounded("waiter a", waiter_a).await.expect("join");
        assert!(matches!(a, Err(Error::Shutdown)), "{mode:?}: {a:?}");
        let b = bounded("waiter b", waiter_b).await.expect("join");
        assert!(matches!(b, Err(Error::Shutdown)), "{mode:?}: {b:?}");
        if let Err(err) = &a {
            shown(err);
        }

        // Every hold of the client was released (re-entered ones completely).
        for name in ["sd-held", "sd-plain"] {
            let keys = mutex_keys(&prefix, 1, name);
            assert_eq!(
                hold_owner(&server, &keys.hold),
                None,
                "{mode:?}: {name} still held"
            );
        }
        assert_eq!(outer.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(inner.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(plain_guard.lost_cause(), Some(LostCause::Shutdown));
        assert_eq!(
            bounded("lost", plain_guard.lost()).await,
            LostCause::Shutdown
        );
        // The other client's hold is untouched and nobody got it.
        let foreign_keys = mutex_keys(&prefix, 1, "sd-foreign");
        assert_eq!(
            hold_owner(&server, &foreign_keys.hold).as_deref(),
            Some(foreign_guard.owner().id())
        );

        // Existing and new handles refuse to acquire.
        for result in [
            bounded("lock", held.lock()).await.map(|_| ()),
            bounded("try_lock", plain.try_lock()).await.map(|_| ()),
            bounded("lock_timeout", plain.lock_timeout(Duration::from_secs(5)))
                .await
                .map(|_| ()),
            bounded(
                "new handle",
                locks.mutex("sd-new").expect("names still validate").lock(),
            )
            .await
            .map(|_| ()),
        ] {
            assert!(
                matches!(result, Err(Error::Shutdown)),
                "{mode:?}: {result:?}"
            );
        }
        assert!(!exists(&server, &mutex_keys(&prefix, 1, "sd-new").hold));
        // Shutdown is idempotent; stale guards neither hang nor panic.
        bounded("second shutdown", locks.shutdown())
            .await
            .expect("idempotent");
        let late = bounded("unlock after shutdown", inner.unlock()).await;
        if let Err(err) = &late {
            shown(err);
        }
        drop(outer);
        drop(plain_guard);

        // The other client is unaffected.
        bounded("unlock", foreign_guard.unlock())
            .await
            .expect("unlock");
        let g = bounded("lock", plain_of(&other, "sd-plain").lock())
            .await
            .expect("lock");
        bounded("unlock", g.unlock()).await.expect("unlock");
        bounded("shutdown", other.shutdown())
            .await
            .expect("shutdown");
    }
}

fn plain_of(locks: &LockClient, name: &str) -> fredlock::Mutex {
    locks.mutex(name).expect("mutex")
}

// ---------------------------------------------------------------------------
// 9. Display / Debug
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
            script: "mutex_acquire",
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

/// After `shutdown()` the client's connections are closed on purpose: every operation that
/// would need them should say so (`Error::Shutdown`, not transient) instead of waiting for the
/// command timeout and reporting a (transient, retryable) `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_after_shutdown_fail_with_shutdown() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-after-sd-{}", mode_name(mode));
        let locks = connect(config_with(&server.url(), &prefix, mode)).await;
        let mutex = locks.mutex("after").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        let extended = bounded("lock", locks.mutex("after-2").expect("m").lock())
            .await
            .expect("lock");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        let keys = mutex_keys(&prefix, 1, "after");
        assert_eq!(
            hold_owner(&server, &keys.hold),
            None,
            "released by shutdown"
        );

        let results = [
            ("state", bounded("state", mutex.state()).await.map(|_| ())),
            (
                "is_locked",
                bounded("is_locked", mutex.is_locked()).await.map(|_| ()),
            ),
            (
                "force_unlock",
                bounded("force_unlock", mutex.force_unlock())
                    .await
                    .map(|_| ()),
            ),
            (
                "extend",
                bounded("extend", extended.extend(Duration::from_secs(5))).await,
            ),
            ("unlock", bounded("unlock", guard.unlock()).await),
        ];
        let wrong: Vec<String> = results
            .iter()
            .filter(|(_, result)| !matches!(result, Err(Error::Shutdown)))
            .map(|(what, result)| format!("{what}: {result:?}"))
            .collect();
        assert!(wrong.is_empty(), "{mode:?} after shutdown: {wrong:#?}");
    }
}

/// A server that stops answering (SIGSTOP, longer than the command timeout) while a task
/// waits: the waiting `lock()` repeats its timed-out attempt with the same op id instead of
/// failing, and once the server answers again it holds the lock exactly once (the timed-out
/// call, executed by the server after it resumed, is answered by the retry, not applied
/// twice). `try_lock` never retries: it reports the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_acquisitions_retry_through_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("retry-{}", mode_name(mode));
        let holder = LockClient::connect(config(&server.url(), &prefix, mode, 4))
            .await
            .unwrap();
        let mut waiting_config = config(&server.url(), &prefix, mode, 4);
        waiting_config.command_timeout = Duration::from_millis(300);
        let waiter = LockClient::connect(waiting_config).await.unwrap();

        let name = "frozen-job";
        // A short fixed lease: the waiter's next attempt comes when it runs out, i.e. while
        // the server is frozen.
        let held = holder
            .mutex(name)
            .unwrap()
            .with_lease(Lease::fixed(Duration::from_millis(500)))
            .unwrap()
            .lock()
            .await
            .unwrap();
        let mutex = waiter.mutex(name).unwrap();
        let task = tokio::spawn(async move { mutex.lock().await });
        eventually("waiter registered", || waiter.stats().waiting == 1).await;

        server.stop_signal();
        eventually("a retried attempt", || waiter.stats().retried_attempts > 0).await;
        // try_lock on the frozen server: one attempt, a typed transient error, no retry.
        let try_result = waiter.mutex("other").unwrap().try_lock().await;
        server.cont_signal();
        match try_result {
            Err(error) => assert!(error.is_transient(), "{mode:?}: {error}"),
            Ok(_) => panic!("{mode:?}: try_lock answered by a frozen server"),
        }

        let guard = bounded("lock after the server resumed", task)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{mode:?}: waiting lock() failed: {e}"));
        let state = waiter.mutex(name).unwrap().state().await.unwrap();
        assert_eq!(
            state.hold_count, 1,
            "{mode:?}: the retried attempt was applied twice"
        );
        assert_eq!(state.fencing_token, Some(guard.fencing_token()));
        guard.unlock().await.unwrap();
        assert!(
            !waiter.mutex(name).unwrap().is_locked().await.unwrap(),
            "{mode:?}: a re-entry left behind after the only unlock"
        );
        // The holder's hold expired meanwhile: its release is typed, not a success.
        assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
        holder.shutdown().await.unwrap();
        waiter.shutdown().await.unwrap();
    }
}

/// A client with a short command timeout holding `name` under a fixed 120 s lease, for the
/// tests that freeze the server (SIGSTOP) past that timeout while a release is under way.
async fn hold_with_short_timeouts(
    server: &RedisServer,
    mode: NotificationMode,
    prefix: &str,
    name: &str,
) -> (LockClient, fredlock::Mutex, fredlock::MutexGuard) {
    let mut cfg = config(&server.url(), prefix, mode, 4);
    cfg.command_timeout = Duration::from_millis(300);
    let locks = LockClient::connect(cfg).await.unwrap();
    let mutex = locks
        .mutex(name)
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap();
    let guard = mutex.lock().await.unwrap();
    (locks, mutex, guard)
}

/// Longer than the command timeout of [`hold_with_short_timeouts`]: the first release attempt
/// made while the server is frozen times out.
const FROZEN: Duration = Duration::from_millis(800);

/// A guard dropped while the server does not answer: the release worker retries the release
/// with the same op id once the server is back, so the lock is free long before its 120 s
/// lease would have ended (the bound below is 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_drop_survives_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("dropretry-{}", mode_name(mode));
        let (locks, mutex, guard) =
            hold_with_short_timeouts(&server, mode, &prefix, "frozen-release").await;
        server.stop_signal();
        drop(guard);
        tokio::time::sleep(FROZEN).await;
        server.cont_signal();
        bounded("the dropped guard's release retried", async {
            while mutex.is_locked().await.unwrap_or(true) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        locks.shutdown().await.unwrap();
    }
}

/// `unlock()` while the server does not answer retries with the same op id and succeeds once
/// the server is back, instead of reporting a timeout for a lock that then stays held until
/// its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_rides_out_an_unresponsive_server() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("unlockretry-{}", mode_name(mode));
        let (locks, mutex, guard) =
            hold_with_short_timeouts(&server, mode, &prefix, "frozen-unlock").await;
        server.stop_signal();
        let unlocking = tokio::spawn(guard.unlock());
        tokio::time::sleep(FROZEN).await;
        server.cont_signal();
        bounded("unlock after the server resumed", unlocking)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{mode:?}: unlock failed: {e}"));
        assert!(!mutex.is_locked().await.unwrap(), "{mode:?}: still locked");
        locks.shutdown().await.unwrap();
    }
}
