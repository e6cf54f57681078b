//! Foreign values in the lock's keys (SPEC §5: "lock key exists with another type: a clear
//! typed error"): values of another type or shape planted under the keys the crate uses. Each
//! call must give a typed error or behave correctly: never a panic, a hang, a changed foreign
//! value, or damage to another lock. Every test talks to its own throwaway `redis-server`
//! (see `tests/support`).

mod support;

use std::time::Duration;

use fredlock::NotificationMode;
use fredlock::{Error, LockClient, LockGuard};
use support::{
    bounded, connect, eventually, exists, fence_value, inbox_keys, init_tracing, mutex_keys,
    queue_key, queued_inbox_tags, queued_waiters, sharded_config, shown, shutdown, snapshot,
    RedisServer, Resp, MODES,
};

// ---------------------------------------------------------------------------
// the mutex: typed WRONGTYPE errors, value left alone
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

fn assert_wrong_type(err: &Error, name: &str, context: &str) {
    match err {
        Error::WrongType { lock, key } => {
            assert_eq!(lock, name, "{context}");
            // The key the foreign value is at: one of the lock's, or its shard's fence key.
            assert!(
                key.contains(name) || key.ends_with("}:fence"),
                "{context}: key {key:?}"
            );
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
        let prefix = format!("fail-wt-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
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
            // The unlock left a tombstone, which a take continues without reading the fence
            // key: remove it (as its ttl would), so that the next take reads the fence key.
            server.cmd(&["DEL", &keys.hold]);
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
                    !exists(&server, &sibling_keys.hold),
                    "{context}: sibling hold written"
                );
            }

            assert_eq!(snapshot(&server, key), planted, "{context}: value changed");
            if key != &keys.hold {
                assert!(
                    !exists(&server, &keys.hold),
                    "{context}: the hold was written"
                );
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
        shutdown(&locks).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_numeric_fence_value_is_a_typed_error_and_left_alone() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-num-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
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
        // The release left a tombstone at the hold key: a take continues its token without
        // reading the fence key, so a foreign value there is neither read nor changed.
        server.cmd(&["SET", &keys.fence, "planted"]);
        let planted = snapshot(&server, &keys.fence);
        let guard = bounded("try_lock", mutex.try_lock())
            .await
            .expect("a take from the tombstone")
            .expect("the lock is free");
        let continued = guard.fencing_token();
        assert!(continued > token, "{mode:?}: the token went back");
        bounded("unlock", guard.unlock()).await.expect("unlock");
        assert_eq!(snapshot(&server, &keys.fence), planted, "{mode:?}");
        // With the hash gone (its ttl ran out), a take reads the fence key.
        server.cmd(&["DEL", &keys.hold]);
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
            assert!(!exists(&server, &keys.hold), "{mode:?}: hold half-written");
        }
        // With the fence key back, the lock works again, above the shard's last token (and
        // above the lock's last one: the server clock has passed the chain of f + 1 steps).
        server.cmd(&["SET", &keys.fence, &format!("{token}|{stamp}")]);
        let guard = bounded("lock", mutex.lock()).await.expect("lock again");
        assert!(
            guard.fencing_token() > continued,
            "{mode:?}: token went back"
        );
        bounded("unlock", guard.unlock()).await.expect("unlock");
        shutdown(&locks).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_key_clobbered_while_held_gives_wrong_type_on_unlock() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-held-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
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
        shutdown(&locks).await;
    }
}

/// Two clients of `prefix`, one to hold a lock and one to wait for it, on one shard (so the
/// test can name the lock's keys).
async fn holder_and_waiter(
    server: &RedisServer,
    prefix: &str,
    mode: NotificationMode,
) -> (LockClient, LockClient) {
    // The holder's unlock() is sent before it returns: a hold with a waiter behind it would
    // have its release deferred, and a deferred release reports only what the client knows
    // (`Config::defer_release`), so the foreign value would be logged instead.
    let mut holder_config = sharded_config(&server.url(), prefix, mode, 1);
    holder_config.defer_release = false;
    let holding = connect(holder_config).await;
    let waiting = connect(sharded_config(&server.url(), prefix, mode, 1)).await;
    (holding, waiting)
}

/// Once the foreign value at `key` is deleted, lock `name` works again for `waiting`; then
/// both clients shut down.
async fn cleared_the_lock_works_again(
    server: &RedisServer,
    key: &str,
    name: &str,
    (holding, waiting): (LockClient, LockClient),
) {
    server.cmd(&["DEL", key]);
    let guard = bounded("lock", waiting.mutex(name).expect("mutex").lock())
        .await
        .expect("lock again");
    bounded("unlock", guard.unlock()).await.expect("unlock");
    shutdown(&holding).await;
    shutdown(&waiting).await;
}

/// A foreign value planted at the hold key while a waiter waits (replacing the hash, as a
/// clobbering writer would) is reported by the waiter's next attempt and by the holder's
/// unlock, and neither changes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_the_hold_key_of_a_waited_lock_gives_wrong_type() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-wait-{}", mode.as_str());
        let (holding, waiting) = holder_and_waiter(&server, &prefix, mode).await;
        let name = "wait-planted";
        let keys = mutex_keys(&prefix, 1, name);
        let holder = bounded("lock", holding.mutex(name).expect("mutex").lock())
            .await
            .expect("lock");
        let waiter = tokio::spawn({
            let mutex = waiting.mutex(name).expect("mutex");
            async move { mutex.lock_timeout(Duration::from_secs(2)).await }
        });
        eventually("the waiter queues", || {
            queued_waiters(&server, &keys.hold).len() == 1
        })
        .await;
        let planted = plant(&server, &keys.hold, "string");

        // The waiter's next attempt (at the latest when its patience runs out) reports it.
        let waited = bounded("lock_timeout", waiter).await.expect("join");
        let err = waited.expect_err("a waiting acquisition must report the foreign hold");
        assert_wrong_type(&err, name, &format!("{mode:?} lock_timeout while held"));
        assert_eq!(snapshot(&server, &keys.hold), planted, "{mode:?}: changed");
        let err = bounded("unlock", holder.unlock())
            .await
            .expect_err("the hold key is no longer a hash");
        assert_wrong_type(&err, name, &format!("{mode:?} unlock"));
        assert_eq!(snapshot(&server, &keys.hold), planted, "{mode:?}: changed");
        assert_eq!(waiting.stats().waiting, 0, "{mode:?}: waiter left behind");

        cleared_the_lock_works_again(&server, &keys.hold, name, (holding, waiting)).await;
    }
}

/// A foreign value at a lock's queue key (the sorted set beside the hold): an acquisition that
/// would queue there fails with `WrongType` and changes nothing; the holder, which nobody
/// queued behind, releases as usual; cleared, the lock works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_the_queue_key_gives_wrong_type() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-queue-{}", mode.as_str());
        let (holding, waiting) = holder_and_waiter(&server, &prefix, mode).await;
        let name = "queue-planted";
        let keys = mutex_keys(&prefix, 1, name);
        let queue = queue_key(&keys.hold);
        let holder = bounded("lock", holding.mutex(name).expect("mutex").lock())
            .await
            .expect("lock");
        let planted = plant(&server, &queue, "list");
        let hold = server.cmd(&["HGETALL", &keys.hold]);
        let err = bounded(
            "lock_timeout",
            waiting
                .mutex(name)
                .expect("mutex")
                .lock_timeout(Duration::from_secs(2)),
        )
        .await
        .expect_err("the queue key holds a list");
        assert_wrong_type(&err, name, &format!("{mode:?} lock_timeout"));
        assert!(
            matches!(&err, Error::WrongType { key, .. } if *key == queue),
            "{mode:?}: the error names the queue key: {err:?}"
        );
        assert_eq!(
            snapshot(&server, &queue),
            planted,
            "{mode:?}: queue changed"
        );
        assert_eq!(
            server.cmd(&["HGETALL", &keys.hold]),
            hold,
            "{mode:?}: hold changed"
        );
        assert_eq!(waiting.stats().waiting, 0, "{mode:?}: waiter left behind");
        bounded("unlock", holder.unlock()).await.expect("unlock");
        cleared_the_lock_works_again(&server, &queue, name, (holding, waiting)).await;
    }
}

/// A release grants the lock to a queued waiter through its client's inbox,
/// `<events key>:to:<client tag>`: a stream in Stream mode (which the client keeps), a channel
/// in Pub/Sub mode (no key). A foreign value under that name is left alone: in Stream mode the
/// grant passes the waiter over (the lock is freed) and the waiter takes the lock when it looks
/// again; in Pub/Sub mode the value is not the inbox and the grant reaches the waiter. Either
/// way the waiter gets the lock with the next token, and the holder's unlock succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_a_waiters_inbox_is_left_alone() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-inbox-{}", mode.as_str());
        let (holding, waiting) = holder_and_waiter(&server, &prefix, mode).await;
        let name = "inbox-planted";
        let keys = mutex_keys(&prefix, 1, name);
        let holder = bounded("lock", holding.mutex(name).expect("mutex").lock())
            .await
            .expect("lock");
        let token = holder.fencing_token();
        let waiter = tokio::spawn({
            let mutex = waiting.mutex(name).expect("mutex");
            async move { mutex.lock().await }
        });
        eventually("the waiter queues", || {
            queued_waiters(&server, &keys.hold).len() == 1
        })
        .await;
        // The waiter's line names its client's inbox.
        let tags = queued_inbox_tags(&server, &keys.hold);
        let inbox = format!("{{{prefix}:events}}:to:{}", tags[0]);
        let inboxes = inbox_keys(&server, &prefix);
        if mode == NotificationMode::Stream {
            assert_eq!(inboxes.len(), 2, "one inbox per client: {inboxes:?}");
            assert!(inboxes.contains(&inbox), "{inbox:?} not in {inboxes:?}");
        } else {
            assert!(inboxes.is_empty(), "{mode:?}: inbox keys {inboxes:?}");
        }
        let planted = plant(&server, &inbox, "string");

        bounded("unlock", holder.unlock())
            .await
            .unwrap_or_else(|e| panic!("{mode:?} unlock: {e}"));
        let next = bounded("the waiter acquires", waiter)
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("{mode:?} waiter: {e}"));
        assert!(next.fencing_token() > token, "{mode:?}: the next token");
        assert_eq!(
            snapshot(&server, &inbox),
            planted,
            "{mode:?}: inbox changed"
        );
        bounded("unlock", next.unlock()).await.expect("unlock");
        assert_eq!(
            snapshot(&server, &inbox),
            planted,
            "{mode:?}: inbox changed"
        );
        server.cmd(&["DEL", &inbox]);
        shutdown(&holding).await;
        shutdown(&waiting).await;
    }
}

// ---------------------------------------------------------------------------
// every key of every lock kind
// ---------------------------------------------------------------------------

/// Ok, or the typed error for foreign values; anything else fails the test. True when the
/// foreign value was reported.
fn acceptable<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> bool {
    match result {
        Err(Error::WrongType { .. }) => true,
        Ok(_) | Err(Error::NotHeld { .. }) => false,
        Err(other) => panic!("{what}: unexpected error {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_under_every_key_are_refused_and_left_alone() {
    init_tracing();
    let server = RedisServer::start();
    // (lock kind, role, whether our value there is a string). The exclusive locks keep their
    // hold and wait queue in one hash; "inbox" is the client's inbox stream (Stream mode only:
    // in Pub/Sub modes an inbox is a channel), where a release grants the lock to a waiter.
    let roles: &[(&str, &str, bool)] = &[
        ("mutex", "", false),
        ("mutex", "fence", true),
        ("mutex", "inbox", false),
        ("fair", "", false),
        ("fair", "fence", true),
        ("fair", "inbox", false),
        ("rw", "", false),
        ("rw", "fence", true),
        ("rw", "readers", false),
        ("rw", "queue", false),
        ("rw", "wait", false),
        ("rw", "read", false),
        ("rw", "alive", false),
        ("rw", "bids", false),
        ("rw", "done", false),
        ("shard", "events", false),
        ("shard", "seq", true),
    ];
    for mode in MODES {
        for (case, &(kind, role, ours_is_string)) in roles.iter().enumerate() {
            let prefix = format!("hostile-{}-{case}", mode as u8);
            let locks = LockClient::connect(sharded_config(&server, &prefix, mode, 1))
                .await
                .unwrap();
            // A bystander lock in the same shard, held throughout.
            let bystander = locks.mutex("bystander").unwrap();
            let held = bystander.lock().await.unwrap();
            let before = bystander.state().await.unwrap();

            let name = "target";
            if role == "inbox" && mode != NotificationMode::Stream {
                assert!(
                    inbox_keys(&server, &prefix).is_empty(),
                    "{mode:?}: inbox keys"
                );
                drop(held);
                locks.shutdown().await.unwrap();
                continue;
            }
            let key = match (kind, role) {
                (_, "inbox") => {
                    let inboxes = inbox_keys(&server, &prefix);
                    assert_eq!(inboxes.len(), 1, "one client, one inbox: {inboxes:?}");
                    inboxes[0].clone()
                }
                ("shard", "events") => format!("{{{prefix}:events}}"),
                ("shard", role) => format!("{{{prefix}:events}}:{role}"),
                // Fencing tokens are counted per shard: one fence key for every lock kind.
                (_, "fence") => format!("{{{prefix}:0}}:fence"),
                (kind, "") => format!("{{{prefix}:0}}:{kind}:{name}"),
                (kind, role) => format!("{{{prefix}:0}}:{kind}.{role}:{name}"),
            };
            let what = format!("{mode:?} {kind}.{role}");

            // Hold the lock first where possible, so that release paths run with the plant.
            let (mutex, fair, rw) = (
                locks.mutex(name).unwrap(),
                locks.fair_mutex(name).unwrap(),
                locks.rwlock(name).unwrap(),
            );
            let guard = match kind {
                "fair" => fair.try_lock().await.unwrap().map(LockGuard::from),
                "rw" => rw.try_write().await.unwrap().map(LockGuard::from),
                _ => mutex.try_lock().await.unwrap().map(LockGuard::from),
            };
            // A waiter makes releases hand the lock over, grant it (to an inbox) or emit (the
            // read-write lock's queue), so those keys are written.
            let waiting = {
                let (mutex, fair, rw) = (mutex.clone(), fair.clone(), rw.clone());
                let kind = kind.to_owned();
                tokio::spawn(async move {
                    let wait = Duration::from_millis(300);
                    match kind.as_str() {
                        "fair" => fair.lock_timeout(wait).await.map(|g| g.is_some()),
                        "rw" => rw.read_timeout(wait).await.map(|g| g.is_some()),
                        _ => mutex.lock_timeout(wait).await.map(|g| g.is_some()),
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            let foreign = if ours_is_string { "list" } else { "string" };
            let planted = plant(&server, &key, foreign);

            if let Some(guard) = guard {
                acceptable(
                    &format!("{what} unlock"),
                    bounded("unlock", guard.unlock()).await,
                );
            }
            acceptable(
                &format!("{what} waiter"),
                bounded("waiter", waiting).await.unwrap(),
            );
            match kind {
                "fair" => {
                    acceptable(&what, bounded("try", fair.try_lock()).await);
                    acceptable(&what, bounded("state", fair.state()).await);
                    acceptable(&what, bounded("force", fair.force_unlock()).await);
                }
                "rw" => {
                    acceptable(&what, bounded("try_read", rw.try_read()).await);
                    acceptable(&what, bounded("try_write", rw.try_write()).await);
                    acceptable(&what, bounded("state", rw.state()).await);
                    acceptable(&what, bounded("force", rw.force_unlock()).await);
                }
                _ => {
                    acceptable(&what, bounded("try", mutex.try_lock()).await);
                    acceptable(&what, bounded("state", mutex.state()).await);
                    acceptable(&what, bounded("force", mutex.force_unlock()).await);
                }
            }
            assert_eq!(
                snapshot(&server, &key),
                planted,
                "{what}: the foreign value changed"
            );
            if role != "events" && role != "seq" {
                let after = bystander.state().await.unwrap();
                assert_eq!(
                    (before.locked, before.hold_count, before.fencing_token),
                    (after.locked, after.hold_count, after.fencing_token),
                    "{what}: the bystander lock was damaged"
                );
            }
            server.cmd(&["DEL", &key]);
            drop(held);
            locks.shutdown().await.unwrap();
        }
    }
}
