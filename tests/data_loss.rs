//! When Redis loses its data (a restart without persistence, `FLUSHALL`, a deleted layout
//! record), and at the edges of a hold's lease:
//!
//! * fencing tokens keep increasing, for every lock type;
//! * every hold that vanished is reported by `lost()` long before its lease could run out
//!   (the client notices the loss itself: a reconnect, or its marker key gone);
//! * a client never works on a prefix laid out differently from its own, even after the
//!   layout record was lost;
//! * `extend(d)` with `d` shorter than what is left moves the guard's deadline with Redis;
//! * a lock name leaves no key behind once its hold and tombstone expire.
//!
//! Time bounds here only turn a hang into a failure: each is many times what the behaviour
//! needs, and the leases involved are longer still, so a test cannot pass by a lease running
//! out.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use fredlock::{Config, Error, Lease, LockClient, LockGuard, LostCause, NotificationMode};
use support::sentinel::SentinelSetup;
use support::{init_tracing, RedisServer, MODES};
use tokio::time::{timeout, Instant};

/// Turns a hang into a failure.
const HANG: Duration = Duration::from_secs(60);
/// Leases far longer than [`HANG`]: a hold reported lost within `HANG` was not lost by expiry.
const LONG: Duration = Duration::from_secs(600);

fn config(server: &RedisServer, prefix: &str, mode: NotificationMode) -> Config {
    let mut config = support::config(server, &format!("{prefix}-{}", mode.as_str()), mode);
    config.watchdog_lease = LONG;
    config.command_timeout = Duration::from_secs(3);
    config
}

/// One exclusive hold of each lock type on `name`, with a fixed and a watchdog lease.
async fn hold_everything(client: &LockClient, name: &str) -> Vec<LockGuard> {
    let fixed = Lease::fixed(LONG);
    let mutex = |suffix: &str| client.mutex(&format!("{name}-{suffix}")).unwrap();
    let fair = client.fair_mutex(&format!("{name}-f")).unwrap();
    let rw = client.rwlock(&format!("{name}-rw")).unwrap();
    vec![
        mutex("m")
            .with_lease(fixed)
            .unwrap()
            .lock()
            .await
            .unwrap()
            .into(),
        mutex("w")
            .with_lease(Lease::watchdog(LONG))
            .unwrap()
            .lock()
            .await
            .unwrap()
            .into(),
        fair.with_lease(fixed).unwrap().lock().await.unwrap().into(),
        rw.with_lease(fixed).unwrap().write().await.unwrap().into(),
    ]
}

/// Every guard's `lost()` resolves with `KeyDeleted`, long before any lease could end.
async fn all_reported_lost(guards: &[LockGuard]) {
    for guard in guards {
        let cause = timeout(HANG, guard.lost())
            .await
            .unwrap_or_else(|_| panic!("{}: the vanished hold was never reported", guard.name()));
        assert_eq!(cause, LostCause::KeyDeleted, "{}", guard.name());
    }
}

/// After the loss, another client takes every lock again: each new token is above the token
/// of the vanished hold, and so are those of 20 more holds of the same name.
async fn tokens_go_on(other: &LockClient, before: &[LockGuard]) {
    for (i, old) in before.iter().enumerate() {
        let name = old.name().to_owned();
        let mut last = old.fencing_token();
        for _ in 0..20 {
            let guard: LockGuard = match i {
                0 | 1 => other.mutex(&name).unwrap().lock().await.unwrap().into(),
                2 => other
                    .fair_mutex(&name)
                    .unwrap()
                    .lock()
                    .await
                    .unwrap()
                    .into(),
                _ => other.rwlock(&name).unwrap().write().await.unwrap().into(),
            };
            let token = guard.fencing_token();
            assert!(token > last, "{name}: token {token} after {last}");
            last = token;
            guard.unlock().await.unwrap();
        }
    }
}

/// Holds, then `lose` wipes the server; the holds are reported lost and tokens go on.
async fn survive_loss(server: &mut RedisServer, prefix: &str, lose: fn(&mut RedisServer)) {
    for mode in MODES {
        let holder = LockClient::connect(config(server, prefix, mode))
            .await
            .unwrap();
        let guards = hold_everything(&holder, "job").await;
        lose(server);
        all_reported_lost(&guards).await;
        let other = LockClient::connect(config(server, prefix, mode))
            .await
            .unwrap();
        tokens_go_on(&other, &guards).await;
        drop(guards);
        holder.shutdown().await.unwrap();
        other.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_tokens_keep_increasing_and_lost_holds_are_reported() {
    init_tracing();
    let mut server = RedisServer::start();
    survive_loss(&mut server, "flush", |server| {
        assert!(!server.cmd(&["FLUSHALL"]).is_error());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_tokens_keep_increasing_and_lost_holds_are_reported() {
    init_tracing();
    // The harness starts servers with `--save "" --appendonly no`: a restart is empty.
    let mut server = RedisServer::start();
    survive_loss(&mut server, "restart", RedisServer::restart).await;
}

/// A client whose shard count differs from the other clients' must never work on the prefix,
/// even after the layout record was lost: whichever of the two comes first after the loss,
/// the other is refused, and no name is ever held by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_layout_record_never_admits_a_second_layout() {
    init_tracing();
    let server = RedisServer::start();
    let names: Vec<String> = (0..16).map(|i| format!("order-{i}")).collect();
    let with_shards = |prefix: &str, shards: u16| {
        let mut config = config(&server, prefix, NotificationMode::Stream);
        config.shards = shards;
        config
    };
    let use_all = |client: LockClient| {
        let names = names.clone();
        async move {
            for name in &names {
                client.mutex(name)?.lock().await?.unlock().await?;
            }
            Ok::<_, Error>(client)
        }
    };

    // The second layout connects first after the flush: the first is refused at its next
    // acquisition, while the second holds every name.
    let first = use_all(
        LockClient::connect(with_shards("layout-a", 16))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert!(!server.cmd(&["FLUSHALL"]).is_error());
    let second = LockClient::connect(with_shards("layout-a", 8))
        .await
        .unwrap();
    let mut held = Vec::new();
    for name in &names {
        held.push(second.mutex(name).unwrap().lock().await.unwrap());
    }
    for name in &names {
        match first.mutex(name).unwrap().try_lock().await {
            Err(Error::LayoutMismatch { .. }) => {}
            other => panic!("{name}: a second layout was admitted: {other:?}"),
        }
    }
    drop(held);
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();

    // The first layout comes back first: the second is refused when it connects.
    let first = use_all(
        LockClient::connect(with_shards("layout-b", 16))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert!(!server.cmd(&["FLUSHALL"]).is_error());
    let first = use_all(first).await.unwrap();
    match LockClient::connect(with_shards("layout-b", 8)).await {
        Err(Error::LayoutMismatch { .. }) => {}
        other => panic!("a second layout was admitted: {other:?}"),
    }
    first.shutdown().await.unwrap();

    // Only the record is deleted, the shards' fence keys survive: their layout stamp refuses
    // the second layout at its first token, and it stops working.
    let first = use_all(
        LockClient::connect(with_shards("layout-c", 16))
            .await
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(server.cmd(&["DEL", "{layout-c-stream:layout}"]).as_int(), 1);
    let second = LockClient::connect(with_shards("layout-c", 8))
        .await
        .unwrap();
    let refused = use_all(second.clone()).await;
    assert!(
        matches!(refused, Err(Error::LayoutMismatch { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        second.mutex("anything").unwrap().try_lock().await,
        Err(Error::LayoutMismatch { .. })
    ));
    let first = use_all(first).await.unwrap();
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
}

/// `extend(d)` sets what is left of the lease to `d`, shorter or longer: the guard's deadline
/// and `lost()` follow Redis, so the local view never outlives the server's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_the_deadline_both_ways() {
    init_tracing();
    let server = RedisServer::start();
    for mode in MODES {
        let client = LockClient::connect(config(&server, "extend", mode))
            .await
            .unwrap();
        let other = LockClient::connect(config(&server, "extend", mode))
            .await
            .unwrap();
        for lease in [
            Lease::fixed(Duration::from_secs(3)),
            Lease::watchdog(Duration::from_secs(3)),
        ] {
            let mutex = client.mutex("short").unwrap().with_lease(lease).unwrap();
            let guard = mutex.lock().await.unwrap();
            let longer = Duration::from_secs(20);
            guard.extend(longer).await.unwrap();
            assert!(guard.lease_deadline() > Instant::now() + Duration::from_secs(10));

            let short = Duration::from_millis(50);
            guard.extend(short).await.unwrap();
            let bound = Instant::now() + short;
            assert!(
                guard.lease_deadline() <= bound,
                "{lease:?}: the guard outlives the server's hold"
            );
            if matches!(lease, Lease::Fixed(_)) {
                // Another owner can take the lock once the short lease has run out; by then
                // the guard must already know.
                let taken = timeout(HANG, other.mutex("short").unwrap().lock())
                    .await
                    .unwrap()
                    .unwrap();
                assert!(guard.lease_deadline() <= Instant::now());
                let cause = timeout(HANG, guard.lost()).await.unwrap();
                assert_eq!(cause, LostCause::Expired);
                assert!(taken.fencing_token() > guard.fencing_token());
                taken.unlock().await.unwrap();
            } else {
                // The watchdog renews a third into the short lease: the hold stays healthy.
                guard.unlock().await.unwrap();
            }
        }
        client.shutdown().await.unwrap();
        other.shutdown().await.unwrap();
    }
}

/// Locking and unlocking many distinct names leaves no key per name once the holds'
/// tombstones expire: only the prefix's and the shards' own keys remain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_names_leave_no_keys_behind() {
    init_tracing();
    const NAMES: usize = 100_000;
    const TASKS: usize = 64;
    let server = RedisServer::start();
    let mut config = config(&server, "many", NotificationMode::Stream);
    config.command_timeout = Duration::from_secs(1); // tombstones live max(3 x this, 10 s)
    let client = LockClient::connect(config).await.unwrap();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in (task..NAMES).step_by(TASKS) {
                let mutex = client.mutex(&format!("order-{i}"))?;
                mutex.try_lock().await?.expect("free").unlock().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    // Every key of a name expires; keys without a TTL belong to the prefix or a shard.
    let mut conn = server.connect().unwrap();
    let mut ask = |args: &[&str]| conn.cmd(args).unwrap().as_int();
    let lasting: BTreeSet<String> = server
        .keys("*")
        .into_iter()
        .filter(|key| ask(&["PTTL", key]) == -1)
        .collect();
    assert!(
        lasting.iter().all(|key| !key.contains("order-")),
        "keys of a name that never expire: {lasting:?}"
    );
    assert!(lasting.len() <= 16 + 3, "{lasting:?}");
    tokio::time::sleep(Duration::from_secs(11)).await;
    let left: Vec<String> = server
        .keys("*")
        .into_iter()
        .filter(|key| key.contains("order-") && ask(&["EXISTS", key]) == 1)
        .collect();
    assert!(
        left.is_empty(),
        "{} keys of names remain: {:?}",
        left.len(),
        &left[..left.len().min(5)]
    );
    client.shutdown().await.unwrap();
}

fn sentinel_config(setup: &SentinelSetup, prefix: &str, replica_acks: u32) -> Config {
    let mut config = Config::new(setup.url());
    config.key_prefix = prefix.to_owned();
    config.watchdog_lease = LONG;
    config.command_timeout = Duration::from_secs(2);
    config.replica_acks = replica_acks;
    config
}

/// Master, replica, three sentinels. A takes a lock while the replication link is down (so
/// the hold never reaches the replica), then the master is killed and the replica promoted: the hold is gone.
/// A's guard is told through `lost()` (its fixed lease is far from over), and the tokens the
/// new master issues are above A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_a_hold_is_reported_and_tokens_go_on() {
    init_tracing();
    let mut setup = SentinelSetup::start();
    let old = setup.master_port().unwrap();
    let master = setup.server_on(old);
    let replica = 1 - master;
    let a = LockClient::connect(sentinel_config(&setup, "failover", 0))
        .await
        .unwrap();
    let mutex = a
        .mutex("stock")
        .unwrap()
        .with_lease(Lease::fixed(LONG))
        .unwrap();
    let warm = mutex.lock().await.unwrap(); // the shard's fence key reaches the replica
    warm.unlock().await.unwrap();
    setup.wait_ready();

    // Cut the replication link: the replica is frozen (so it cannot reconnect) and the
    // master drops its connection (so nothing written from now on reaches it).
    setup.servers[replica].stop_signal();
    let cut = setup.servers[master].cmd(&["CLIENT", "KILL", "TYPE", "slave"]);
    assert_eq!(cut.as_int(), 1, "{cut:?}");
    let lost_hold = mutex.lock().await.unwrap();
    setup.servers[master].kill();
    setup.servers[replica].cont_signal();
    assert_ne!(setup.wait_new_master(old), old);

    let cause = timeout(HANG, lost_hold.lost())
        .await
        .expect("the lost hold was never reported");
    assert_eq!(cause, LostCause::KeyDeleted);
    let b = LockClient::connect(sentinel_config(&setup, "failover", 0))
        .await
        .unwrap();
    let taken = timeout(HANG, b.mutex("stock").unwrap().lock())
        .await
        .unwrap()
        .unwrap();
    assert!(
        taken.fencing_token() > lost_hold.fencing_token(),
        "token {} after the failover, {} before",
        taken.fencing_token(),
        lost_hold.fencing_token()
    );
    taken.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// With `replica_acks = 1`: an acquisition is refused while no replica can confirm it, and
/// retried (not failed at once) until the caller's deadline; a fair grant made by another
/// client's release is confirmed too before the waiter returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_cover_grants_and_are_retried_until_the_deadline() {
    init_tracing();
    let setup = SentinelSetup::start();
    let master = setup.server_on(setup.master_port().unwrap());
    let replica = &setup.servers[1 - master];
    let a = LockClient::connect(sentinel_config(&setup, "acks", 1))
        .await
        .unwrap();
    let b = LockClient::connect(sentinel_config(&setup, "acks", 1))
        .await
        .unwrap();
    let fair = |client: &LockClient| client.fair_mutex("ledger").unwrap();

    // Healthy replica: acquisitions are confirmed.
    let held = fair(&a).lock().await.unwrap();

    // A waiter of another client is granted the lock by a's release while the replica is
    // frozen: it must not return before a replica has the grant.
    let waiter = fair(&b);
    let waiting = tokio::spawn(async move { waiter.lock().await });
    while b.stats().waiting == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    replica.stop_signal();
    held.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !waiting.is_finished(),
        "a grant returned without a replica's confirmation"
    );

    // A bounded acquisition while the replica is frozen ends with NotReplicated at its
    // deadline, after retries.
    let refused = a
        .mutex("other")
        .unwrap()
        .lock_timeout(Duration::from_secs(3))
        .await;
    assert!(
        matches!(refused, Err(Error::NotReplicated { .. })),
        "{refused:?}"
    );

    replica.cont_signal();
    let granted = timeout(HANG, waiting).await.unwrap().unwrap().unwrap();
    let next = timeout(HANG, a.mutex("other").unwrap().lock())
        .await
        .unwrap()
        .unwrap();
    next.unlock().await.unwrap();
    granted.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A `maxmemory-policy` that may evict any key (held locks included) is reported at connect;
/// `noeviction` and the `volatile-*` policies are not.
#[tokio::test(flavor = "current_thread")]
async fn an_eviction_policy_that_may_drop_locks_is_reported_at_connect() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for (policy, warned) in [
        ("allkeys-lru", true),
        ("noeviction", false),
        ("volatile-lru", false),
    ] {
        let server = RedisServer::start_with(&["--maxmemory-policy", policy]);
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::WARN)
            .finish();
        let _scope = tracing::subscriber::set_default(subscriber);
        let client = LockClient::connect(config(&server, "evict", NotificationMode::Stream))
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).to_string();
        assert_eq!(log.contains("maxmemory-policy"), warned, "{policy}: {log}");
    }
}
