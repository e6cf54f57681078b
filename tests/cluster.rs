//! Redis Cluster: a real 3-master / 3-replica cluster on loopback. Every lock type (and the
//! semaphore) with names spread over all masters, in both notification modes (sharded Pub/Sub), failover while tasks
//! hold and wait, and the opt-in replica acknowledgement.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use fredlock::{Config, Error, Lease, LockClient, LockKind, MultiLock, Mutex, NotificationMode};
use support::cluster::RedisCluster;
use support::{init_tracing, MODES};

/// Bound that only turns a hang into a failure; never a performance claim.
const HANG: Duration = Duration::from_secs(60);

fn config(cluster: &RedisCluster, mode: NotificationMode, prefix: &str) -> Config {
    let mut config = support::config(cluster, &format!("{prefix}-{}", mode.as_str()), mode);
    config.shards = 6;
    config.watchdog_lease = Duration::from_secs(3);
    config
}

/// Which masters hold keys under `prefix`.
fn masters_with_keys(cluster: &RedisCluster, prefix: &str) -> HashSet<usize> {
    cluster
        .masters()
        .into_iter()
        .filter(|&m| {
            let keys = cluster.nodes[m].cmd(&["KEYS", &format!("{{{prefix}:*")]);
            keys.as_array()
                .iter()
                .any(|k| k.as_str().is_some_and(|k| k.ends_with("}:fence")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_type_works_on_every_master() {
    init_tracing();
    let cluster = RedisCluster::start(3, 1);
    for mode in MODES {
        let cfg = config(&cluster, mode, "spread");
        let prefix = cfg.key_prefix.clone();
        let holder = LockClient::connect(cfg.clone()).await.unwrap();
        let waiter = LockClient::connect(cfg).await.unwrap();
        for i in 0..12 {
            let name = format!("lock-{i}");
            // Mutex and fair mutex: a waiter in another client is handed the lock by an event
            // (the holder's lease is far longer than the bound).
            for fair in [false, true] {
                let make = |locks: &LockClient| {
                    if fair {
                        Mutex::from(locks.fair_mutex(&name).unwrap())
                    } else {
                        locks.mutex(&name).unwrap()
                    }
                };
                let held = make(&holder)
                    .with_lease(Lease::fixed(Duration::from_secs(300)))
                    .unwrap()
                    .lock()
                    .await
                    .unwrap();
                let contender = make(&waiter);
                let task =
                    tokio::spawn(async move { contender.lock().await.map(|g| g.fencing_token()) });
                while waiter.stats().waiting == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let token = held.fencing_token();
                held.unlock().await.unwrap();
                let next = tokio::time::timeout(HANG, task)
                    .await
                    .unwrap()
                    .unwrap()
                    .unwrap();
                assert!(next > token, "{mode:?} fair={fair} {name}");
            }
            // Read-write lock: readers share, a writer waits for them.
            let rw = holder.rwlock(&name).unwrap();
            let read_a = rw.read().await.unwrap();
            let read_b = waiter.rwlock(&name).unwrap().read().await.unwrap();
            let writer = waiter.rwlock(&name).unwrap();
            let write =
                tokio::spawn(async move { writer.write().await.map(|g| g.fencing_token()) });
            while waiter.stats().waiting == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            read_a.unlock().await.unwrap();
            read_b.unlock().await.unwrap();
            tokio::time::timeout(HANG, write)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            // Semaphore: a permit held by one client, a waiter of the other client queued in
            // Redis and granted the permit by the release (an event into its inbox on the
            // semaphore's own master; the holder's lease is far longer than the bound).
            let permit = holder
                .semaphore(&name, 1)
                .unwrap()
                .with_lease(Lease::fixed(Duration::from_secs(300)))
                .unwrap()
                .acquire()
                .await
                .unwrap();
            let contender = waiter.semaphore(&name, 1).unwrap();
            assert!(
                contender.try_acquire().await.unwrap().is_none(),
                "{mode:?} {name}: the only permit is held"
            );
            let queued = waiter.stats().queued_in_redis;
            let task =
                tokio::spawn(async move { contender.acquire().await.map(|g| g.fencing_token()) });
            while waiter.stats().queued_in_redis == queued {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let token = permit.fencing_token();
            permit.unlock().await.unwrap();
            let next = tokio::time::timeout(HANG, task)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(next > token, "{mode:?} semaphore {name}");
            // A count-down latch opened by one client wakes a task of the other (its event
            // goes into the waiting client's inbox on the latch's own master).
            let latch = holder.count_down_latch(&name).unwrap();
            assert!(latch.try_set_count(1).await.unwrap());
            let waiting = waiter.count_down_latch(&name).unwrap();
            let opened = tokio::spawn(async move { waiting.wait().await });
            while waiter.stats().waiting == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(latch.count_down().await.unwrap(), 0);
            tokio::time::timeout(HANG, opened)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
        }
        // A multi-lock over locks on different masters: every member held, then all released.
        let names: Vec<String> = (0..12).map(|i| format!("lock-{i}")).collect();
        let members = names.iter().map(|name| holder.mutex(name).unwrap());
        let all = MultiLock::new(members).unwrap();
        let guard = tokio::time::timeout(HANG, all.lock())
            .await
            .unwrap()
            .unwrap();
        for name in &names {
            let other = waiter.mutex(name).unwrap();
            assert!(other.try_lock().await.unwrap().is_none(), "{mode:?} {name}");
        }
        // Inspection finds every held member, whichever master has it: `list` scans every
        // master, `inspect` runs on the lock's own.
        let listed = waiter.list().await.unwrap();
        for name in &names {
            assert!(
                listed.contains(&(LockKind::Mutex, name.clone())),
                "{mode:?}: {name} in {listed:?}"
            );
            let seen = waiter.inspect(LockKind::Mutex, name).await.unwrap();
            assert_eq!(seen.held, 1, "{mode:?} {name}");
        }
        guard.unlock().await.unwrap();
        for name in &names {
            assert!(!waiter.mutex(name).unwrap().is_locked().await.unwrap());
        }
        assert_eq!(
            masters_with_keys(&cluster, &prefix).len(),
            3,
            "{mode:?}: lock names should spread over all masters"
        );
        holder.shutdown().await.unwrap();
        waiter.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_keep_mutual_exclusion_on_a_cluster() {
    use fred::interfaces::KeysInterface;
    init_tracing();
    let cluster = RedisCluster::start(3, 1);
    for mode in MODES {
        let cfg = config(&cluster, mode, "excl");
        let clients = [
            LockClient::connect(cfg.clone()).await.unwrap(),
            LockClient::connect(cfg).await.unwrap(),
        ];
        let counter = format!("counter-{mode:?}");
        let mut tasks = Vec::new();
        for client in &clients {
            for _ in 0..4 {
                let mutex = client.mutex("shared").unwrap();
                let redis = client.redis().clone();
                let counter = counter.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..25 {
                        let guard = mutex.lock().await.unwrap();
                        let value: Option<i64> = redis.get(&counter).await.unwrap();
                        tokio::task::yield_now().await;
                        let _: () = redis
                            .set(&counter, value.unwrap_or(0) + 1, None, None, false)
                            .await
                            .unwrap();
                        guard.unlock().await.unwrap();
                    }
                }));
            }
        }
        for task in tasks {
            tokio::time::timeout(HANG, task).await.unwrap().unwrap();
        }
        let total: i64 = clients[0].redis().get(&counter).await.unwrap();
        assert_eq!(total, 200, "{mode:?}");
        for client in clients {
            client.shutdown().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_recover_from_failovers() {
    init_tracing();
    let mut cluster = RedisCluster::start(3, 1);
    for (round, mode) in MODES.into_iter().enumerate() {
        let cfg = config(&cluster, mode, "failover");
        let locks = LockClient::connect(cfg.clone()).await.unwrap();
        let holders = LockClient::connect(cfg).await.unwrap();
        let names: Vec<String> = (0..6).map(|i| format!("job-{i}")).collect();
        let mut guards = Vec::new();
        for name in &names {
            guards.push(holders.mutex(name).unwrap().lock().await.unwrap());
        }
        let waiters: Vec<_> = names
            .iter()
            .map(|name| {
                let mutex = locks.mutex(name).unwrap();
                tokio::spawn(async move { mutex.lock().await.map(|g| g.fencing_token()) })
            })
            .collect();
        while locks.stats().waiting < names.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // First a graceful failover, then (second mode) a killed master.
        let master = cluster.masters()[0];
        if round == 0 {
            let replica = cluster.replica_of(master);
            cluster.failover(replica);
        } else {
            cluster.kill_master(master);
        }
        // Each holder either kept its lock (the replica had it) or learns it lost it.
        for guard in guards {
            let lost = guard.lost_cause();
            match guard.unlock().await {
                Ok(()) => assert!(lost.is_none(), "{mode:?}: unlocked a hold reported lost"),
                Err(Error::NotHeld { .. }) => {}
                Err(other) => panic!("{mode:?}: unexpected error after failover: {other}"),
            }
        }
        for waiter in waiters {
            tokio::time::timeout(HANG, waiter)
                .await
                .expect("a waiter hung after the failover")
                .unwrap()
                .unwrap();
        }
        locks.shutdown().await.unwrap();
        holders.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_is_opt_in_and_enforced() {
    init_tracing();
    let cluster = RedisCluster::start(3, 1);
    let mut cfg = config(&cluster, NotificationMode::Stream, "acks");
    cfg.replica_acks = 1;
    let locks = LockClient::connect(cfg.clone()).await.unwrap();
    let guard = locks.mutex("replicated").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
    locks.shutdown().await.unwrap();

    cfg.replica_acks = 2; // every master has one replica only
    cfg.replica_ack_timeout = Duration::from_millis(200);
    let locks = LockClient::connect(cfg).await.unwrap();
    let mutex = locks.mutex("replicated").unwrap();
    match mutex.lock().await {
        Err(Error::NotReplicated { acked, wanted, .. }) => {
            assert_eq!(wanted, 2);
            assert!(acked < 2);
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(
        !mutex.is_locked().await.unwrap(),
        "the unconfirmed hold was released"
    );
    locks.shutdown().await.unwrap();
}
