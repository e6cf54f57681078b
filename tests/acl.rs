//! A least-privilege ACL user against a real `redis-server` (the other security properties:
//! `tests/security.rs`).
//!
//! # Minimal ACL user
//!
//! docs/design.md §10.1 documents the least-privilege user: the commands a client needs, on
//! keys and channels under its own prefix. [`acl_commands`] is that list, split into the
//! client's own commands and the ones its scripts call;
//! `the_documented_acl_block_grants_exactly_the_tested_commands` keeps the doc's block and
//! the list in step, `acl_list_covers_every_script_command` keeps the list in step with `lua/`,
//! and `acl_user_limited_to_its_prefix_runs_every_lock_kind` proves it sufficient (the server's
//! `ACL LOG` stays empty while every lock kind, the latch and the semaphore included, acquires,
//! waits, is woken, renews, extends, times out, force-unlocks and shuts down in both
//! notification modes).
//!
//! With such a user a client configured for another prefix fails to connect with
//! [`Error::Permission`] (the `NOPERM` reply to the layout record), and nothing outside the prefix
//! can be read or written, not even from a script.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use fred::interfaces::{ClientLike, KeysInterface, LuaInterface};
use fredlock::{Error, LockClient, LostCause, NotificationMode};
use support::{
    bounded, connect, mutex_handoff, rwlock_handoff, sharded_config, shutdown, RedisServer, Resp,
    MODES,
};

/// Commands (ACL names, lower case) a least-privilege user needs outside the scripts
/// (docs/design.md §10.1).
const ACL_CLIENT_COMMANDS: &[&str] = &[
    // connection setup: fred caches the connection id (for CLIENT UNBLOCK) and server version
    "client|id",
    "info",
    // layout record (the scripts read and write the fence key with them too)
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
    // Pub/Sub: a reply on the subscriber connection proves its SUBSCRIBE was applied
    "ping",
];

/// Commands the scripts call (besides `get` and `set`), which Redis checks against the
/// caller's ACL too.
const ACL_SCRIPT_COMMANDS: &[&str] = &[
    "del",
    "exists",
    "hdel",
    "hget",
    "hmget",
    "hset",
    "pexpire",
    "pttl",
    "publish",
    // Inspection in Pub/Sub mode: whether a waiter's client listens (`fl_listening`).
    "pubsub|numsub",
    "sadd",
    "scard",
    "smembers",
    "srandmember",
    "time",
    "type",
    "xadd",
    "xdel",
    "zadd",
    "zcard",
    "zcount",
    "zpopmin",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zrevrange",
    "zscore",
];

/// Every command a least-privilege user needs (docs/design.md §10.1).
fn acl_commands() -> impl Iterator<Item = &'static str> {
    ACL_CLIENT_COMMANDS
        .iter()
        .chain(ACL_SCRIPT_COMMANDS)
        .copied()
}

/// Commands only some deployments need (cluster Pub/Sub, replica acks, database index).
const ACL_CONDITIONAL: &[&str] = &["ssubscribe", "spublish", "wait", "select"];

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
            // `fl_queue_call(queue, 'X', ...)` (lua/lib/hold.lua) calls X on a lock's queue and
            // `fl_rw_batched('X', ...)` (lua/lib/rw.lua) X in batches; the helpers' own
            // `redis.call(command, ...)` names no command.
            for call in [
                "redis.call(",
                "redis.pcall(",
                "fl_queue_call(queue, ",
                "fl_rw_batched(",
            ] {
                for (at, _) in source.match_indices(call) {
                    let rest = &source[at + call.len()..];
                    if rest.starts_with("command,") {
                        continue;
                    }
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

/// The commands the `ACL SETUSER` block of docs/design.md §10.1 grants (`+name`), lower case.
fn documented_acl_commands() -> BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/design.md");
    let block = doc
        .split("```text\nACL SETUSER locker")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/design.md has the ACL SETUSER block");
    block
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_ascii_lowercase)
        .collect()
}

#[test]
fn the_documented_acl_block_grants_exactly_the_tested_commands() {
    let documented = documented_acl_commands();
    let tested: BTreeSet<String> = acl_commands().map(str::to_owned).collect();
    assert_eq!(
        documented, tested,
        "docs/design.md §10.1 and tests/acl.rs grant different commands"
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/design.md");
    for extra in ACL_CONDITIONAL {
        assert!(
            doc.contains(&format!("`+{extra}")) || doc.contains(&format!(" +{extra}")),
            "docs/design.md §10.1 does not mention the conditional grant +{extra}"
        );
    }
}

#[test]
fn acl_list_covers_every_script_command() {
    // A subcommand grant (`pubsub|numsub`) covers the scripts' calls of its command.
    let granted: BTreeSet<&str> = acl_commands()
        .chain(ACL_CONDITIONAL.iter().copied())
        .map(|grant| grant.split('|').next().unwrap_or(grant))
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
    // Least privilege: the list grants no script command that no script calls.
    let unused: Vec<&str> = ACL_SCRIPT_COMMANDS
        .iter()
        .copied()
        .filter(|grant| !called.contains(grant.split('|').next().unwrap_or(grant)))
        .collect();
    assert!(
        unused.is_empty(),
        "the ACL grants commands no script calls: {unused:?}"
    );
}

/// The oldest server that has everything [`acl_setuser`] needs: ACL users (6.0) with channel
/// rules (`&pattern`, 6.2).
const ACL_VERSION: (u32, u32, u32) = (6, 2, 0);
const ACL_WHY: &str = "ACL users with channel rules";

/// `ACL SETUSER` arguments for a user confined to `{prefix:*` with [`acl_commands`].
fn acl_setuser(user: &str, password: &str, prefix: &str) -> Vec<String> {
    let mut args: Vec<String> = ["ACL", "SETUSER", user, "reset", "on"]
        .map(str::to_owned)
        .into();
    args.push(format!(">{password}"));
    args.push(format!("~{{{prefix}:*"));
    args.push(format!("&{{{prefix}:*"));
    args.push("-@all".to_owned());
    args.extend(acl_commands().map(|c| format!("+{c}")));
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

/// A user granted only [`acl_commands`] on `{acl:*` runs every lock kind through acquisition,
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
        let prefix = format!("acl:{}", mode.as_str());
        let mut config = sharded_config(&url, &prefix, mode, 2);
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
        // Inspection, which asks whether a waiter's client listens (`PUBSUB NUMSUB` in
        // Pub/Sub mode).
        let held = holder
            .mutex("acl-inspect")
            .expect("mutex")
            .lock()
            .await
            .expect("lock");
        let theirs = waiter.mutex("acl-inspect").expect("mutex");
        let queued = tokio::spawn(async move { drop(theirs.lock().await.expect("lock")) });
        support::eventually("the waiter queued", || waiter.stats().queued_in_redis > 0).await;
        let seen = holder
            .inspect(fredlock::LockKind::Mutex, "acl-inspect")
            .await
            .expect("inspect");
        assert_eq!(seen.waiters.len(), 1, "{mode:?}: {seen:?}");
        assert_eq!(seen.waiters[0].listening, Some(true), "{mode:?}");
        held.unlock().await.expect("unlock");
        bounded("the inspected waiter", queued)
            .await
            .expect("waiter");

        rwlock_handoff(
            &holder.rwlock("acl-rw").expect("rwlock"),
            &waiter.rwlock("acl-rw").expect("rwlock"),
            &waiter,
        )
        .await;

        // A latch opened by the holder's client wakes the waiter's task.
        let latch = holder.count_down_latch("acl-latch").expect("latch");
        assert!(latch.try_set_count(1).await.expect("set"));
        let waiting = waiter.count_down_latch("acl-latch").expect("latch");
        let opened = tokio::spawn(async move { waiting.wait().await });
        support::eventually("the latch waiter registered", || waiter.stats().waiting > 0).await;
        assert_eq!(latch.count_down().await.expect("count down"), 0);
        bounded("the latch waiter", opened)
            .await
            .unwrap()
            .expect("wait");

        // A semaphore: a permit of the holder's client; the waiter's client times out waiting
        // (it queues, its heartbeat vouches for it, it leaves), then waits again and is
        // granted the permit by its release (an event into its inbox); a force release takes
        // the granted permit back.
        let permits = holder.semaphore("acl-sem", 1).expect("semaphore");
        let permit = bounded("a permit", permits.acquire())
            .await
            .expect("permit");
        let theirs = waiter.semaphore("acl-sem", 1).expect("semaphore");
        assert!(theirs.try_acquire().await.expect("try").is_none());
        let timed_out = theirs.acquire_timeout(Duration::from_millis(400));
        assert!(bounded("a permit", timed_out)
            .await
            .expect("wait")
            .is_none());
        let queued = waiter.stats().queued_in_redis;
        let granted = tokio::spawn(async move { theirs.acquire().await });
        support::eventually("the permit waiter queued", || {
            waiter.stats().queued_in_redis > queued
        })
        .await;
        permit.unlock().await.expect("release");
        let granted = bounded("the permit waiter", granted)
            .await
            .unwrap()
            .expect("granted");
        assert!(permits.force_release().await.expect("force release"));
        assert!(
            matches!(granted.unlock().await, Err(Error::NotHeld { .. })),
            "{mode:?}: the permit was taken back"
        );

        // A hold released by shutdown.
        let kept = bounded("lock", holder.mutex("acl-kept").expect("m").lock())
            .await
            .expect("lock");
        shutdown(&holder).await;
        assert_eq!(kept.lost_cause(), Some(LostCause::Shutdown));
        shutdown(&waiter).await;
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

/// A user whose grants predate the notifier's `PING` (docs/design.md §10.1) still runs Pub/Sub
/// mode: the `NOPERM` reply on the subscriber connection proves the subscription as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_ping_still_runs_pubsub_mode() {
    if !support::requires(ACL_VERSION, ACL_WHY) {
        return;
    }
    let server = RedisServer::start();
    let args: Vec<String> = acl_setuser("older", "pw-acl", "acl")
        .into_iter()
        .filter(|arg| arg != "+ping")
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(server.cmd(&args), Resp::Simple("OK".into()), "{args:?}");
    let url = format!("redis://older:pw-acl@127.0.0.1:{}", server.port());
    let config = sharded_config(&url, "acl:older", NotificationMode::PubSub, 2);
    let holder = connect(config.clone()).await;
    let waiter = connect(config).await;
    let mutex = |client: &LockClient| client.mutex("acl-older").expect("mutex");
    mutex_handoff(&mutex(&holder), &mutex(&waiter), &waiter).await;
    shutdown(&holder).await;
    shutdown(&waiter).await;
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
        let err = bounded(
            "connect",
            LockClient::connect(sharded_config(&url, "other", mode, 2)),
        )
        .await
        .expect_err("a prefix outside the ACL must be refused");
        // NOPERM is not an authentication failure: the credentials are fine.
        assert!(matches!(err, Error::Permission(_)), "{mode:?}: {err:?}");
        assert!(format!("{err}").contains("NOPERM"), "{err}");
        eprintln!(
            "[{}] prefix outside the ACL: {err} / {err:?}",
            mode.as_str()
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

    let locks = connect(sharded_config(&url, "acl", NotificationMode::Stream, 2)).await;
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
            .eval(
                "return redis.call('PEXPIRE', 'outside', 1)",
                vec!["{acl:0}:x"],
                (),
            )
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
    shutdown(&locks).await;
    let outside: Vec<String> = server
        .keys("*")
        .into_iter()
        .filter(|k| !k.starts_with("{acl:") && k != "outside")
        .collect();
    assert!(outside.is_empty(), "{outside:?}");
}
