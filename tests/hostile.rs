//! Hostile input: foreign values planted under every key the crate uses, and lock names of
//! arbitrary content. Each call must give a typed error or behave correctly: never a panic, a
//! hang, a changed foreign value, or damage to another lock.

mod support;

use std::time::Duration;

use fredlock::{Config, Error, LockClient, LockGuard, NotificationMode, MAX_NAME_LEN};
use support::{init_tracing, RedisServer, Resp};

/// Bound that only turns a hang into a failure; never a performance claim.
const HANG: Duration = Duration::from_secs(30);

const MODES: [NotificationMode; 2] = [NotificationMode::Stream, NotificationMode::PubSub];

fn config(server: &RedisServer, mode: NotificationMode, prefix: &str) -> Config {
    let mut config = Config::new(server.url());
    config.notification = mode;
    config.key_prefix = prefix.to_owned();
    config.shards = 1;
    config
}

/// A value of a type the key never has: a list where we keep strings, a string elsewhere.
fn plant(server: &RedisServer, key: &str, ours_is_string: bool) -> (Resp, Resp) {
    server.cmd(&["DEL", key]);
    if ours_is_string {
        server.cmd(&["RPUSH", key, "foreign", "value"]);
    } else {
        server.cmd(&["SET", key, "foreign value"]);
    }
    snapshot(server, key)
}

fn snapshot(server: &RedisServer, key: &str) -> (Resp, Resp) {
    (server.cmd(&["TYPE", key]), server.cmd(&["DUMP", key]))
}

/// Ok, or the typed error for foreign values; anything else fails the test. True when the
/// foreign value was reported.
fn acceptable<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) -> bool {
    match result {
        Err(Error::WrongType { .. }) => true,
        Ok(_) | Err(Error::NotHeld { .. }) => false,
        Err(other) => panic!("{what}: unexpected error {other:?}"),
    }
}

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
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
            let locks = LockClient::connect(config(&server, mode, &prefix))
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
            let planted = plant(&server, &key, ours_is_string);

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
    let locks = LockClient::connect(config(&server, NotificationMode::Stream, "names"))
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
    let is_client_marker = |key: &str| {
        key.strip_prefix("{names:layout}:client:")
            .is_some_and(|tag| tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    for key in server.keys("*") {
        assert!(
            key.starts_with("{names:0}:")
                || key == "{names:layout}"
                || is_client_marker(&key)
                || key.starts_with("{names:events}"),
            "{key:?} escaped the hash tag"
        );
    }
    locks.shutdown().await.unwrap();
}
