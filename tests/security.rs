//! Security properties against a real `redis-server`: owner tokens that cannot be guessed or
//! borrowed, a least-privilege ACL user, secrets kept out of logs and `Debug` output, and TLS
//! (with `--features tls`).
//!
//! # Minimal ACL user
//!
//! A client needs only the commands below, on keys and channels under its own prefix `P`
//! (`{P:<shard>}:…` and `{P:layout}`). Every state change is a Lua script; Redis checks the
//! commands a script calls against the caller's ACL too, so they are listed as well.
//!
//! ```text
//! ACL SETUSER locker on >PASSWORD resetkeys ~{P:* resetchannels &{P:* -@all
//!     +client|id +info                        # connection setup (fred)
//!     +set +get                               # the layout record {P:layout}
//!     +evalsha +eval                          # every lock operation is a script
//!     +xread +xrevrange +client|unblock       # notifier, Stream mode
//!     +subscribe                              # notifier, Pub/Sub mode
//!     +del +exists +hdel +hexists +hget +hincrby +hmget +hset +incr +lindex +llen +lpop
//!     +lrange +lrem +pexpire +pttl +publish +rpush +time +type +xadd +zadd +zcard +zcount
//!     +zrange +zrangebyscore +zrem +zremrangebyscore +zscore   # called inside the scripts
//! ```
//!
//! Add `+ssubscribe +spublish` on a Redis Cluster in Pub/Sub mode, `+wait` with
//! `Config::replica_acks > 0`, `+select` for a database index in the URL. `AUTH`, `HELLO` and
//! `QUIT` need no grant. [`ACL_COMMANDS`] is that list; [`acl_list_covers_every_script_command`]
//! keeps it in step with `lua/`, and [`acl_user_limited_to_its_prefix_runs_every_lock_kind`]
//! proves it sufficient (the server's `ACL LOG` stays empty while every lock kind acquires,
//! waits, is woken, renews, extends, times out, force-unlocks and shuts down in both
//! notification modes).
//!
//! With such a user a client configured for another prefix fails to connect with
//! [`Error::Permission`] (the `NOPERM` reply to the layout record), and nothing outside the prefix
//! can be read or written, not even from a script.

mod support;

use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fredlock::{Config, Error, Lease, LockClient, LostCause, NotificationMode, Owner};
use support::{RedisServer, Resp};

/// Bound that only turns a hang into a failure; never a performance claim.
const HANG: Duration = Duration::from_secs(30);
/// A lease no test here waits out: a prompt hand-off can only come from a release event.
const LONG_LEASE: Duration = Duration::from_secs(120);
const MODES: [NotificationMode; 2] = [NotificationMode::Stream, NotificationMode::PubSub];

/// Commands (ACL names, lower case) a least-privilege user needs; see the module docs.
const ACL_COMMANDS: &[&str] = &[
    // connection setup: fred caches the connection id (for CLIENT UNBLOCK) and server version
    "client|id",
    "info",
    // layout record
    "set",
    "get",
    // scripts
    "evalsha",
    "eval",
    // notifier
    "xread",
    "xrevrange",
    "client|unblock",
    "subscribe",
    // inside the scripts
    "del",
    "exists",
    "hdel",
    "hexists",
    "hget",
    "hincrby",
    "hmget",
    "hset",
    "incr",
    "lindex",
    "llen",
    "lpop",
    "lrange",
    "lrem",
    "pexpire",
    "pttl",
    "publish",
    "rpush",
    "time",
    "type",
    "xadd",
    "zadd",
    "zcard",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zremrangebyscore",
    "zscore",
];

/// Commands only some deployments need (cluster Pub/Sub, replica acks, database index).
const ACL_CONDITIONAL: &[&str] = &["ssubscribe", "spublish", "wait", "select"];

fn mode_name(mode: NotificationMode) -> &'static str {
    mode.as_str()
}

fn config(url: &str, prefix: &str, mode: NotificationMode) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = prefix.to_owned();
    config.notification = mode;
    config.shards = 2;
    config
}

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{what} hung for {HANG:?}"))
}

async fn connect(config: Config) -> LockClient {
    bounded("connect", LockClient::connect(config))
        .await
        .expect("connect")
}

/// Polls `check` every 10 ms until it holds; panics after [`HANG`].
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The hold hash of lock `name` of `kind` ("mutex", "fair", "rw") under `prefix`, via SCAN.
fn hold_key(server: &RedisServer, prefix: &str, kind: &str, name: &str) -> String {
    let keys = server.keys(&format!("{{{prefix}:*}}:{kind}:{name}"));
    assert_eq!(keys.len(), 1, "one hold key for {kind}:{name}: {keys:?}");
    keys[0].clone()
}

// ---------------------------------------------------------------------------
// 1. Owner tokens
// ---------------------------------------------------------------------------

/// Owner ids are UUID v4s (122 random bits): 32 lower-case hex digits with the version and
/// variant nibbles of v4, never repeated, and never shown in full by `Debug`.
#[test]
fn owner_ids_are_unguessable_and_distinct() {
    const OWNERS: usize = 10_000;
    let mut seen = HashSet::with_capacity(OWNERS);
    for _ in 0..OWNERS {
        let owner = Owner::new();
        let id = owner.id();
        assert_eq!(id.len(), 32, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{id}"
        );
        // xxxxxxxx xxxx Mxxx Nxxx …: M = 4 (version), N in 8..=b (RFC 4122 variant).
        assert_eq!(&id[12..13], "4", "not a v4 UUID: {id}");
        assert!("89ab".contains(&id[16..17]), "not an RFC 4122 UUID: {id}");
        let shown = format!("{owner:?}");
        assert!(!shown.contains(id), "Debug shows the whole id: {shown}");
        assert!(seen.insert(id.to_owned()), "owner id repeated: {id}");
    }
    // Clones keep the identity; fresh owners never compare equal.
    let owner = Owner::new();
    assert_eq!(owner.clone(), owner);
    assert_ne!(Owner::new(), owner);
}

/// A hold taken under owner A cannot be entered by a handle bound to another owner B (no
/// re-entry, no waiting through), for every lock kind; A's own handle re-enters with the same
/// token; only the documented admin operation `force_unlock` gets B in, and A learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_entered_only_with_its_owner_token() {
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("sec-owner-{}", mode_name(mode));
        let locks = connect(config(&server.url(), &prefix, mode)).await;
        let (a, b) = (Owner::new(), Owner::new());
        // A's renewals run every 100 ms, so a force-unlock shows on its guard promptly.
        let lease = Lease::watchdog(Duration::from_millis(300));

        for (kind, fair) in [("mutex", false), ("fair", true)] {
            let name = format!("owned-{kind}");
            let handle = if fair {
                locks.fair_mutex(&name).map(fredlock::Mutex::from)
            } else {
                locks.mutex(&name)
            }
            .expect("handle");
            let mine = handle
                .clone()
                .with_owner(&a)
                .with_lease(lease)
                .expect("lease");
            let theirs = handle.clone().with_owner(&b);
            let held = bounded("lock", mine.lock()).await.expect("lock A");
            let stored = server.cmd(&["HGET", &hold_key(&server, &prefix, kind, &name), "o"]);
            assert_eq!(stored.as_str().as_deref(), Some(a.id()), "{kind}");
            assert!(
                !format!("{held:?}").contains(a.id()),
                "guard Debug leaks the id"
            );

            let tried = bounded("try B", theirs.try_lock()).await.expect("try B");
            assert!(tried.is_none(), "{mode:?} {kind}: owner B entered A's hold");
            let waited = bounded("wait B", theirs.lock_timeout(Duration::from_millis(200)))
                .await
                .expect("wait B");
            assert!(
                waited.is_none(),
                "{mode:?} {kind}: owner B got in by waiting"
            );
            let state = bounded("state", handle.state()).await.expect("state");
            assert_eq!(state.hold_count, 1, "{kind}: B changed the hold");
            assert_eq!(state.fencing_token, Some(held.fencing_token()));

            let again = bounded("re-enter A", mine.try_lock())
                .await
                .expect("re-enter A")
                .expect("A re-enters its own hold");
            assert_eq!(again.fencing_token(), held.fencing_token());
            assert_eq!(
                bounded("state", handle.state())
                    .await
                    .expect("s")
                    .hold_count,
                2
            );

            // The admin way in: A's guards learn that their hold is gone.
            assert!(bounded("force", theirs.force_unlock())
                .await
                .expect("force"));
            let taken = bounded("lock B", theirs.lock()).await.expect("lock B");
            assert!(taken.fencing_token() > held.fencing_token());
            let cause = bounded("A learns", held.lost()).await;
            assert!(
                matches!(cause, LostCause::KeyDeleted | LostCause::OwnerChanged),
                "{kind}: {cause:?}"
            );
            assert!(bounded("stale unlock", again.unlock()).await.is_err());
            drop(held);
            bounded("unlock B", taken.unlock()).await.expect("unlock B");
        }

        let rw = locks.rwlock("owned-rw").expect("rwlock");
        let mine = rw.clone().with_owner(&a).with_lease(lease).expect("lease");
        let theirs = rw.clone().with_owner(&b);
        let write = bounded("write A", mine.write()).await.expect("write A");
        assert!(bounded("try_write B", theirs.try_write())
            .await
            .expect("tw")
            .is_none());
        assert!(bounded("try_read B", theirs.try_read())
            .await
            .expect("tr")
            .is_none());
        let timed = bounded("write B", theirs.write_timeout(Duration::from_millis(200)))
            .await
            .expect("write_timeout B");
        assert!(timed.is_none(), "{mode:?}: B got a write hold beside A's");
        let nested = bounded("write A again", mine.try_write())
            .await
            .expect("tw A")
            .expect("A re-enters its write hold");
        assert_eq!(nested.fencing_token(), write.fencing_token());
        let state = bounded("state", rw.state()).await.expect("state");
        assert_eq!((state.write_hold_count, state.readers), (2, 0));
        assert!(bounded("force", theirs.force_unlock())
            .await
            .expect("force"));
        let taken = bounded("write B", theirs.write()).await.expect("write B");
        assert!(taken.fencing_token() > write.fencing_token());
        bounded("A learns", write.lost()).await;
        drop((write, nested));
        bounded("unlock B", taken.unlock()).await.expect("unlock B");
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
    }
}

// ---------------------------------------------------------------------------
// 2. ACL
// ---------------------------------------------------------------------------

/// Every command a script calls (`redis.call('X'` / `redis.pcall('X'`), lower case.
fn script_commands() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read lua dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("read script");
            for call in ["redis.call(", "redis.pcall("] {
                for (at, _) in source.match_indices(call) {
                    let rest = &source[at + call.len()..];
                    let name = rest
                        .strip_prefix('\'')
                        .or_else(|| rest.strip_prefix('"'))
                        .and_then(|r| r.split(['\'', '"']).next())
                        .unwrap_or_else(|| {
                            panic!("{}: a command name that is not a literal", path.display())
                        });
                    found.insert(name.to_ascii_lowercase());
                }
            }
        }
    }
    found
}

#[test]
fn acl_list_covers_every_script_command() {
    let granted: BTreeSet<&str> = ACL_COMMANDS
        .iter()
        .chain(ACL_CONDITIONAL)
        .copied()
        .collect();
    let called = script_commands();
    assert!(
        called.len() > 10,
        "found too few commands in lua/: {called:?}"
    );
    let missing: Vec<&String> = called
        .iter()
        .filter(|c| !granted.contains(c.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "scripts call commands the documented ACL lacks: {missing:?}"
    );
}

/// The oldest server that has everything [`acl_setuser`] needs: ACL users (6.0) with channel
/// rules (`&pattern`, 6.2).
const ACL_VERSION: (u32, u32, u32) = (6, 2, 0);
const ACL_WHY: &str = "ACL users with channel rules";

/// `ACL SETUSER` arguments for a user confined to `{prefix:*` with [`ACL_COMMANDS`].
fn acl_setuser(user: &str, password: &str, prefix: &str) -> Vec<String> {
    let mut args: Vec<String> = ["ACL", "SETUSER", user, "reset", "on"]
        .map(str::to_owned)
        .into();
    args.push(format!(">{password}"));
    args.push(format!("~{{{prefix}:*"));
    args.push(format!("&{{{prefix}:*"));
    args.push("-@all".to_owned());
    args.extend(ACL_COMMANDS.iter().map(|c| format!("+{c}")));
    args
}

fn create_acl_user(server: &RedisServer, user: &str, password: &str, prefix: &str) {
    let args = acl_setuser(user, password, prefix);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(server.cmd(&args), Resp::Simple("OK".into()), "{args:?}");
    server.cmd(&["ACL", "LOG", "RESET"]);
}

/// `ACL LOG` entries as `reason/context/object/username` strings.
fn acl_log(server: &RedisServer) -> Vec<String> {
    server
        .cmd(&["ACL", "LOG", "128"])
        .as_array()
        .iter()
        .map(|entry| {
            let fields: Vec<String> = entry
                .as_array()
                .iter()
                .map(|f| f.as_str_opt().unwrap_or_default())
                .collect();
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .map(|kv| kv[1].clone())
                    .unwrap_or_default()
            };
            format!(
                "{}/{}/{}/{}",
                field("reason"),
                field("context"),
                field("object"),
                field("username")
            )
        })
        .collect()
}

/// Holder `a` takes the lock with a long lease; `b` (another client) fails to barge, times out,
/// then waits until woken by the release event; extends and force-unlock are exercised too.
async fn mutex_handoff(a: &fredlock::Mutex, b: &fredlock::Mutex, waiting_client: &LockClient) {
    let long = a
        .clone()
        .with_lease(Lease::watchdog(LONG_LEASE))
        .expect("lease");
    let held = bounded("lock", long.lock()).await.expect("lock");
    bounded("extend", held.extend(LONG_LEASE))
        .await
        .expect("extend");
    assert!(bounded("try", b.try_lock()).await.expect("try").is_none());
    let timed_out = bounded("timeout", b.lock_timeout(Duration::from_millis(100)))
        .await
        .expect("lock_timeout");
    assert!(timed_out.is_none());
    let waiter = b.clone();
    let waiting = tokio::spawn(async move { waiter.lock().await });
    eventually("the waiter waits", || waiting_client.stats().waiting == 1).await;
    // Long enough for the fair lock's queue heartbeat (waiter_lease / 3) to run.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let token = held.fencing_token();
    bounded("unlock", held.unlock()).await.expect("unlock");
    let woken = bounded("woken by the event", waiting)
        .await
        .expect("waiter task")
        .expect("lock");
    assert!(woken.fencing_token() > token);
    drop(woken);

    // Watchdog renewals of a short lease.
    let short = a
        .clone()
        .with_lease(Lease::watchdog(Duration::from_millis(300)))
        .expect("l");
    let renewed = bounded("lock", short.lock()).await.expect("lock");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(renewed.lost_cause(), None, "renewals failed");
    assert!(bounded("force", a.force_unlock()).await.expect("force"));
    bounded("lost", renewed.lost()).await;
    assert!(!bounded("state", a.is_locked()).await.expect("state"));
}

/// Writer `a` blocks reader `b`, whose read is woken by the write release; then a writer waits
/// for that read hold.
async fn rwlock_handoff(a: &fredlock::RwLock, b: &fredlock::RwLock, waiting_client: &LockClient) {
    let long = a
        .clone()
        .with_lease(Lease::watchdog(LONG_LEASE))
        .expect("lease");
    let write = bounded("write", long.write()).await.expect("write");
    assert!(bounded("try_read", b.try_read())
        .await
        .expect("tr")
        .is_none());
    let timed_out = bounded("read_timeout", b.read_timeout(Duration::from_millis(100)))
        .await
        .expect("read_timeout");
    assert!(timed_out.is_none());
    let reader = b
        .clone()
        .with_lease(Lease::watchdog(Duration::from_millis(300)))
        .expect("l");
    let waiting = tokio::spawn(async move { reader.read().await });
    eventually("the reader waits", || waiting_client.stats().waiting == 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    bounded("unlock", write.unlock()).await.expect("unlock");
    let read = bounded("woken reader", waiting)
        .await
        .expect("reader task")
        .expect("read");
    let state = bounded("state", a.state()).await.expect("state");
    assert_eq!((state.write_locked, state.readers), (false, 1));

    let writer = a.clone();
    let waiting = tokio::spawn(async move { writer.write().await });
    // The read hold's watchdog renews it meanwhile (rw_renew).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(read.lost_cause(), None, "read renewals failed");
    bounded("read unlock", read.unlock())
        .await
        .expect("read unlock");
    let write = bounded("woken writer", waiting)
        .await
        .expect("writer task")
        .expect("write");
    drop(write);
    bounded("force", a.force_unlock()).await.expect("force");
}

/// A user granted only [`ACL_COMMANDS`] on `{acl:*` runs every lock kind through acquisition,
/// waiting, event wakeups, renewal, extension, timeouts, force-unlock and shutdown in both
/// notification modes, and the server records no permission failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_limited_to_its_prefix_runs_every_lock_kind() {
    if !support::requires(ACL_VERSION, ACL_WHY) {
        return;
    }
    let server = RedisServer::start();
    create_acl_user(&server, "locker", "pw-acl", "acl");
    let url = format!("redis://locker:pw-acl@127.0.0.1:{}", server.port());
    for mode in MODES {
        // Both prefixes are under `{acl:*`; two because a prefix fixes its notification mode.
        let prefix = format!("acl:{}", mode_name(mode));
        let mut config = config(&url, &prefix, mode);
        config.waiter_lease = Duration::from_millis(300);
        let holder = connect(config.clone()).await;
        let waiter = connect(config).await;

        for fair in [false, true] {
            let name = if fair { "acl-fair" } else { "acl-mutex" };
            let make = |client: &LockClient| {
                if fair {
                    client.fair_mutex(name).map(fredlock::Mutex::from)
                } else {
                    client.mutex(name)
                }
                .expect("mutex")
            };
            mutex_handoff(&make(&holder), &make(&waiter), &waiter).await;
        }
        rwlock_handoff(
            &holder.rwlock("acl-rw").expect("rwlock"),
            &waiter.rwlock("acl-rw").expect("rwlock"),
            &waiter,
        )
        .await;

        // A hold released by shutdown.
        let kept = bounded("lock", holder.mutex("acl-kept").expect("m").lock())
            .await
            .expect("lock");
        bounded("shutdown", holder.shutdown())
            .await
            .expect("shutdown");
        assert_eq!(kept.lost_cause(), Some(LostCause::Shutdown));
        bounded("shutdown", waiter.shutdown())
            .await
            .expect("shutdown");
        let log = acl_log(&server);
        assert!(log.is_empty(), "{mode:?}: permission failures: {log:#?}");
        assert!(!server.keys(&format!("{{{prefix}:*")).is_empty());
    }
    // Nothing outside the prefix was written.
    let outside: Vec<String> = server
        .keys("*")
        .into_iter()
        .filter(|k| !k.starts_with("{acl:"))
        .collect();
    assert!(outside.is_empty(), "keys outside the prefix: {outside:?}");
}

/// The same user cannot start a client under another prefix (typed error, nothing written),
/// nor read, write or script keys outside its prefix, nor run admin commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_refuses_other_prefixes_and_keys() {
    if !support::requires(ACL_VERSION, ACL_WHY) {
        return;
    }
    let server = RedisServer::start();
    create_acl_user(&server, "locker", "pw-acl", "acl");
    let url = format!("redis://locker:pw-acl@127.0.0.1:{}", server.port());
    server.cmd(&["SET", "outside", "untouched"]);

    for mode in MODES {
        let err = bounded("connect", LockClient::connect(config(&url, "other", mode)))
            .await
            .expect_err("a prefix outside the ACL must be refused");
        // NOPERM is not an authentication failure: the credentials are fine.
        assert!(matches!(err, Error::Permission(_)), "{mode:?}: {err:?}");
        assert!(format!("{err}").contains("NOPERM"), "{err}");
        eprintln!(
            "[{}] prefix outside the ACL: {err} / {err:?}",
            mode_name(mode)
        );
        let log = acl_log(&server);
        assert!(
            log.iter()
                .any(|e| e.contains("{other:layout}") && e.ends_with("/locker")),
            "{log:?}"
        );
        server.cmd(&["ACL", "LOG", "RESET"]);
    }
    assert!(server.keys("{other*").is_empty(), "{:?}", server.keys("*"));

    let locks = connect(config(&url, "acl", NotificationMode::Stream)).await;
    let redis = locks.redis();
    let denied = |what: &str, result: Result<fred::types::Value, fred::error::Error>| {
        let err = result.expect_err(what);
        // NOPERM for the command itself; a script's own calls fail with a script error whose
        // wording depends on the server: Redis "... can't access at least one of the keys
        // ...", Valkey 9 "ERR ACL failure in script: No permissions to access a key ...".
        let details = err.details();
        assert!(
            [
                "NOPERM",
                "can't access",
                "No permissions to access",
                "ACL failure"
            ]
            .iter()
            .any(|marker| details.contains(marker)),
            "{what}: {err:?}"
        );
    };
    denied("GET outside", redis.get("outside").await);
    denied(
        "SET outside",
        redis.set("outside", "x", None, None, false).await,
    );
    denied("DEL outside", redis.del("outside").await);
    denied(
        "a script writing outside",
        redis
            .eval(
                "return redis.call('SET', KEYS[1], 'x')",
                vec!["outside"],
                (),
            )
            .await,
    );
    denied(
        "a script with an undeclared key outside",
        redis
            .eval("return redis.call('DEL', 'outside')", vec!["{acl:0}:x"], ())
            .await,
    );
    for admin in [&["FLUSHALL"][..], &["KEYS", "*"], &["CONFIG", "GET", "*"]] {
        let (name, args) = admin.split_first().expect("command");
        let command = fred::types::CustomCommand::new(
            name.to_string(),
            fred::types::ClusterHash::Random,
            false,
        );
        let args: Vec<fred::types::Value> = args.iter().map(|a| (*a).into()).collect();
        denied(name, redis.custom(command, args).await);
    }
    assert_eq!(
        server.cmd(&["GET", "outside"]).as_str().as_deref(),
        Some("untouched")
    );
    // A lock name cannot escape the prefix: its keys stay inside `{acl:…}`.
    let guard = bounded("lock", locks.mutex("}:outside{").expect("m").lock())
        .await
        .expect("a strange name still works within the prefix");
    drop(guard);
    bounded("shutdown", locks.shutdown())
        .await
        .expect("shutdown");
    let outside: Vec<String> = server
        .keys("*")
        .into_iter()
        .filter(|k| !k.starts_with("{acl:") && k != "outside")
        .collect();
    assert!(outside.is_empty(), "{outside:?}");
}

// ---------------------------------------------------------------------------
// 3. Secrets in logs and Debug output
// ---------------------------------------------------------------------------

/// An in-memory sink for the process-wide `tracing` subscriber of this test binary.
#[derive(Clone, Default)]
struct Captured(Arc<StdMutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once) a TRACE-level subscriber for every target (fredlock, and fred through the
/// `log` bridge) writing into memory, and returns its buffer.
fn captured_logs() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let sink = Captured::default();
        let writer = sink.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("this test binary installs the only subscriber");
        sink
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_logs_or_debug_output() {
    const PASSWORD: &str = "s3cret-pw";
    const WRONG: &str = "wr0ng-pw";
    let logs = captured_logs();
    let server = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let mut shown = Vec::new();

    for mode in MODES {
        let prefix = format!("sec-pw-{}", mode_name(mode));
        let config = config(&server.url_with_password(PASSWORD), &prefix, mode);
        shown.push(format!("{config:?} {config:#?} {}", config.redacted_url()));
        let locks = connect(config.clone()).await;
        shown.push(format!("{locks:?} {locks:#?}"));
        let mutex = locks.mutex("pw-cycle").expect("mutex");
        let guard = bounded("lock", mutex.lock()).await.expect("lock");
        shown.push(format!("{guard:?} {mutex:?}"));
        let waiting = {
            let mutex = mutex.clone();
            tokio::spawn(async move { mutex.lock().await })
        };
        eventually("the waiter waits", || locks.stats().waiting == 1).await;
        bounded("unlock", guard.unlock()).await.expect("unlock");
        let next = bounded("waiter", waiting)
            .await
            .expect("task")
            .expect("lock");
        drop(next);

        let mut wrong = config.clone();
        wrong.url = server.url_with_password(WRONG);
        wrong.connect_timeout = Duration::from_secs(2);
        let err = bounded("wrong password", LockClient::connect(wrong.clone()))
            .await
            .expect_err("wrong password");
        assert!(matches!(err, Error::Auth(_)), "{err:?}");
        shown.push(format!("{wrong:?} {err} {err:?} {err:#?}"));
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            shown.push(format!("{cause} {cause:?}"));
            source = cause.source();
        }
        // An error from a closed client.
        bounded("shutdown", locks.shutdown())
            .await
            .expect("shutdown");
        let closed = bounded("after shutdown", mutex.lock())
            .await
            .expect_err("closed");
        shown.push(format!("{closed} {closed:?}"));
    }

    let logs = logs.text();
    assert!(
        logs.contains("fredlock"),
        "the subscriber captured nothing from fredlock:\n{logs}"
    );
    for (what, text) in [("logs", &logs), ("Debug/Display", &shown.join("\n"))] {
        for secret in [PASSWORD, WRONG] {
            assert!(!text.contains(secret), "{what} contain {secret:?}:\n{text}");
        }
    }
}

// ---------------------------------------------------------------------------
// 4. TLS
// ---------------------------------------------------------------------------

#[cfg(feature = "tls")]
mod tls {
    use super::*;
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::pki_types::CertificateDer;
    use fred::rustls::{ClientConfig, RootCertStore};
    use fred::types::config::{Config as FredConfig, TlsConnector};
    use std::path::Path;
    use std::process::Command;

    /// Runs `openssl` with `args` in `dir`; panics with its output on failure.
    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A throwaway CA and a server certificate for IP 127.0.0.1 signed by it (P-256 keys):
    /// `ca.crt`, `server.crt`, `server.key` in `dir`.
    fn make_certificates(dir: &Path) {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec![
            "req",
            "-x509",
            "-days",
            "2",
            "-subj",
            "/CN=fredlock test CA",
        ];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir, &ca);
        let mut csr = vec!["req", "-subj", "/CN=127.0.0.1", "-keyout", "server.key"];
        csr.extend(ec);
        csr.extend(["-out", "server.csr"]);
        openssl(dir, &csr);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write extensions");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        );
    }

    /// A server with a plain port (for the harness and assertions) and a TLS port (for the lock
    /// clients), retrying with other ports on a collision.
    fn start_tls_server(certs: &Path) -> (RedisServer, u16) {
        let file = |name: &str| certs.join(name).to_string_lossy().into_owned();
        let (cert, key, ca) = (file("server.crt"), file("server.key"), file("ca.crt"));
        let mut failures = Vec::new();
        for _ in 0..5 {
            let tls_port = support::free_port();
            let tls_port_arg = tls_port.to_string();
            let args = [
                "--tls-port",
                tls_port_arg.as_str(),
                "--tls-cert-file",
                cert.as_str(),
                "--tls-key-file",
                key.as_str(),
                "--tls-ca-cert-file",
                ca.as_str(),
                "--tls-auth-clients",
                "no",
            ];
            match RedisServer::start_on(support::free_port(), &args) {
                Ok(server) => return (server, tls_port),
                Err(err) => failures.push(err.to_string()),
            }
        }
        panic!("no TLS redis-server: {failures:?}");
    }

    /// A connected fred client for `rediss://127.0.0.1:port` trusting only the throwaway CA.
    async fn tls_client(certs: &Path, port: u16) -> fred::clients::Client {
        let mut roots = RootCertStore::empty();
        let ca = CertificateDer::from_pem_file(certs.join("ca.crt")).expect("parse ca.crt");
        roots.add(ca).expect("trust the CA");
        let rustls = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut config =
            FredConfig::from_url(&format!("rediss://127.0.0.1:{port}")).expect("rediss url");
        config.tls = Some(TlsConnector::from(rustls).into());
        let client = fred::clients::Client::new(config, None, None, None);
        bounded("TLS connect", client.init())
            .await
            .expect("TLS handshake");
        client
    }

    /// Local ports (`laddr`) of every connection but the one asking.
    fn server_side_ports(server: &RedisServer) -> Vec<String> {
        let list = server
            .cmd(&["CLIENT", "LIST"])
            .as_str()
            .expect("CLIENT LIST");
        list.lines()
            .filter(|line| !line.contains("cmd=client|list"))
            .filter_map(|line| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix("laddr="))
            })
            .filter_map(|addr| addr.rsplit(':').next().map(str::to_owned))
            .collect()
    }

    /// Lock cycle and an event wakeup over TLS in both modes; every lock connection (commands
    /// and notifier) uses the TLS port.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_lock_cycle_and_event_wakeup() {
        if !support::requires((6, 0, 0), "TLS") {
            return;
        }
        let certs = tempfile::tempdir().expect("tempdir");
        make_certificates(certs.path());
        let (server, tls_port) = start_tls_server(certs.path());
        for mode in MODES {
            let prefix = format!("sec-tls-{}", mode_name(mode));
            let config = config("redis://unused", &prefix, mode);
            let holder = bounded(
                "from_client",
                LockClient::from_client(tls_client(certs.path(), tls_port).await, config.clone()),
            )
            .await
            .expect("TLS lock client");
            let waiter = bounded(
                "from_client",
                LockClient::from_client(tls_client(certs.path(), tls_port).await, config),
            )
            .await
            .expect("TLS lock client");
            let ports = server_side_ports(&server);
            assert!(ports.len() >= 4, "{ports:?}");
            assert!(
                ports.iter().all(|p| *p == tls_port.to_string()),
                "a lock connection bypassed TLS: {ports:?} (TLS port {tls_port})"
            );

            let mutex = |client: &LockClient| client.mutex("tls-cycle").expect("mutex");
            mutex_handoff(&mutex(&holder), &mutex(&waiter), &waiter).await;
            let fair = |client: &LockClient| {
                client
                    .fair_mutex("tls-fair")
                    .map(fredlock::Mutex::from)
                    .expect("fair")
            };
            mutex_handoff(&fair(&holder), &fair(&waiter), &waiter).await;

            for client in [&holder, &waiter] {
                bounded("shutdown", client.shutdown())
                    .await
                    .expect("shutdown");
                let _ = client.redis().quit().await;
            }
        }
    }

    /// A client that does not trust the server's CA is refused with a connect error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_untrusted_certificate_is_refused() {
        if !support::requires((6, 0, 0), "TLS") {
            return;
        }
        let certs = tempfile::tempdir().expect("tempdir");
        make_certificates(certs.path());
        let (_server, tls_port) = start_tls_server(certs.path());
        let mut config = config(
            &format!("rediss://127.0.0.1:{tls_port}"),
            "sec-tls-untrusted",
            NotificationMode::Stream,
        );
        config.connect_timeout = Duration::from_secs(3);
        let err = bounded("connect", LockClient::connect(config))
            .await
            .expect_err("the throwaway CA is not a system root");
        assert!(matches!(err, Error::Connect(_)), "{err:?}");
        eprintln!("untrusted certificate: {err}");
    }
}
