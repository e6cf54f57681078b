//! Foreign values in the lock's keys (SPEC §5: "lock key exists with another type: a clear
//! typed error"): values of another type or shape planted under the keys the crate uses. Each
//! call must give a typed error or behave correctly: never a panic, a hang, a changed foreign
//! value, or damage to another lock. Every test talks to its own throwaway `redis-server`
//! (see `tests/support`).

mod support;

use std::time::Duration;

use fredlock::{Error, LockClient, LockGuard};
use support::{
    bounded, connect, exists, fence_value, init_tracing, mutex_keys, sharded_config, shown,
    shutdown, snapshot, RedisServer, Resp, MODES,
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

/// The waiter marker is a key of the lock too (SPEC §5: "lock key exists with another type:
/// a clear typed error"); a foreign value there should be reported like at the hold and fence
/// keys instead of being overwritten (by a waiting acquisition) or deleted (by a release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_value_at_wait_key_gives_wrong_type() {
    support::init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let prefix = format!("fail-wt-wait-{}", mode.as_str());
        let locks = connect(sharded_config(&server.url(), &prefix, mode, 1)).await;
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
        shutdown(&locks).await;
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
    // (lock kind, role, whether our value there is a string)
    let roles: &[(&str, &str, bool)] = &[
        ("mutex", "", false),
        ("mutex", "fence", true),
        ("mutex", "wait", true),
        ("fair", "", false),
        ("fair", "fence", true),
        ("fair", "queue", false),
        ("fair", "alive", false),
        ("fair", "bids", false),
        ("rw", "", false),
        ("rw", "fence", true),
        ("rw", "readers", false),
        ("rw", "queue", false),
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
            let key = match (kind, role) {
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
            // A waiter makes releases emit (marker / queue), so event keys are written.
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
