//! Redlock over 5 independent redis-servers: quorum with 2 instances down, a typed error with 3
//! down, mutual exclusion across processes, push wakeups, and the lease-lost signal when the
//! quorum cannot be renewed.

mod support;

use std::time::Duration;

use fredlock::{Config, Error, Lease, LockClient, LostCause, NotificationMode, Redlock};
use support::{
    emit_result, init_tracing, is_worker, spawn_worker_handle, worker_param, RedisServer,
};

/// Bound that only turns a hang into a failure; never a performance claim.
const HANG: Duration = Duration::from_secs(30);

fn config(url: &str) -> Config {
    let mut config = Config::new(url);
    config.key_prefix = "redlock".into();
    config.command_timeout = Duration::from_millis(500);
    config.connect_timeout = Duration::from_secs(2);
    config.notification = NotificationMode::Stream;
    config
}

async fn clients(urls: &[String]) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for url in urls {
        clients.push(LockClient::connect(config(url)).await.expect("connect"));
    }
    clients
}

fn start_five() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// The Redlock `name` over `clients`, held with a fixed 120 s lease: it ends only by a release
/// within a test.
async fn held_for_long(clients: &[LockClient], name: &str) -> fredlock::RedlockGuard {
    Redlock::new(clients, name)
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap()
        .lock()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_a_quorum_and_tokens_increase() {
    init_tracing();
    let servers = start_five();
    let clients = clients(&urls(&servers)).await;
    let lock = Redlock::new(&clients, "payments").unwrap();
    assert_eq!(lock.quorum(), 3);
    let mut last = 0;
    for _ in 0..3 {
        let guard = lock.lock().await.unwrap();
        assert!(guard.instances() >= 3);
        assert!(guard.fencing_token() > last);
        last = guard.fencing_token();
        assert!(lock.try_lock().await.unwrap().is_none(), "exclusive");
        guard.unlock().await.unwrap();
    }
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_down_still_locks_three_down_is_a_typed_error() {
    init_tracing();
    let mut servers = start_five();
    let clients = clients(&urls(&servers)).await;
    let lock = Redlock::new(&clients, "orders").unwrap();
    servers[0].kill();
    servers[1].kill();
    let guard = tokio::time::timeout(HANG, lock.lock())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(guard.instances(), 3);
    guard.unlock().await.unwrap();

    servers[2].kill();
    match tokio::time::timeout(HANG, lock.lock_timeout(Duration::from_secs(2)))
        .await
        .unwrap()
    {
        Err(Error::NoQuorum {
            reached, needed, ..
        }) => {
            assert_eq!(needed, 3);
            assert!(reached < 3);
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    match lock.try_lock().await {
        Err(Error::NoQuorum { .. }) => {}
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    for client in clients {
        let _ = client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release() {
    init_tracing();
    let servers = start_five();
    let holders = clients(&urls(&servers)).await;
    let waiters = clients(&urls(&servers)).await;
    let held = held_for_long(&holders, "report").await;
    let lock = Redlock::new(&waiters, "report").unwrap();
    let waiter = tokio::spawn(async move { lock.lock().await.map(|g| g.fencing_token()) });
    while waiters[0].stats().waiting == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let token = held.fencing_token();
    held.unlock().await.unwrap();
    // The holder's lease is 120 s: only a release event can explain an acquisition in time.
    let next = tokio::time::timeout(HANG, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_quorum_cannot_be_renewed() {
    init_tracing();
    let mut servers = start_five();
    let clients = clients(&urls(&servers)).await;
    let guard = Redlock::new(&clients, "batch")
        .unwrap()
        .with_lease(Lease::watchdog(Duration::from_millis(900)))
        .unwrap()
        .lock()
        .await
        .unwrap();
    let first_deadline = guard.lease_deadline();
    // Renewal keeps it alive past several leases.
    while guard.lease_deadline() < first_deadline + Duration::from_millis(900) {
        assert!(guard.lost_cause().is_none());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for server in servers.iter_mut().take(3) {
        server.kill();
    }
    let cause = tokio::time::timeout(HANG, guard.lost()).await.unwrap();
    assert!(matches!(cause, LostCause::RenewalFailed(_)), "{cause:?}");
}

/// `unlock()` while one instance does not answer (frozen past the command timeout): its
/// release is retried with the same op id once it is back, so no instance keeps the hold until
/// the 120 s lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_rides_out_an_unresponsive_instance() {
    init_tracing();
    let servers = start_five();
    let clients = clients(&urls(&servers)).await;
    let guard = held_for_long(&clients, "frozen").await;
    assert_eq!(guard.instances(), 5);
    servers[0].stop_signal();
    let unlocking = tokio::spawn(guard.unlock());
    // Longer than the command timeout (500 ms): the first release on that instance times out.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    servers[0].cont_signal();
    tokio::time::timeout(HANG, unlocking)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for (at, client) in clients.iter().enumerate() {
        let held = client.mutex("frozen").unwrap().is_locked().await.unwrap();
        assert!(!held, "instance {at} still holds the released Redlock");
    }
    for client in clients {
        let _ = client.shutdown().await;
    }
}

/// A round in which one instance does not answer in time (frozen past the command timeout)
/// still wins on the others; the instance takes the hold when it comes back, and the round
/// releases it then: nothing of the round stays held there once the guard is released, long
/// before the 120 s lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_the_round_is_released() {
    init_tracing();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let clients = clients(&urls(&servers)).await;
    let lock = Redlock::new(&clients, "late")
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap();
    // The scripts are cached on every instance.
    lock.try_lock()
        .await
        .unwrap()
        .unwrap()
        .unlock()
        .await
        .unwrap();
    servers[0].stop_signal();
    let guard = tokio::time::timeout(HANG, lock.try_lock())
        .await
        .unwrap()
        .unwrap()
        .expect("a quorum of the two others");
    assert_eq!(guard.instances(), 2);
    servers[0].cont_signal();
    guard.unlock().await.unwrap();
    let late = clients[0].mutex("late").unwrap();
    support::eventually_async("the late grant released", || async {
        !late.is_locked().await.unwrap()
    })
    .await;
    for client in clients {
        let _ = client.shutdown().await;
    }
}

/// Worker process: 3 tasks increment a counter under a Redlock over the 5 given servers.
#[test]
#[ignore = "worker process of the Redlock tests"]
fn redlock_worker() {
    if !is_worker() {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        use fred::interfaces::KeysInterface;
        let urls: Vec<String> = worker_param("RL_URLS")
            .expect("urls")
            .split(',')
            .map(str::to_owned)
            .collect();
        let clients = clients(&urls).await;
        let counter_client = clients[0].redis().clone();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let lock = Redlock::new(&clients, "counter").unwrap();
            let redis = counter_client.clone();
            tasks.push(tokio::spawn(async move {
                let mut violations = 0;
                for _ in 0..15 {
                    let guard = lock.lock().await.expect("lock");
                    let inside: i64 = redis.incr("rl-inside").await.expect("INCR");
                    if inside != 1 {
                        violations += 1;
                    }
                    let value: Option<i64> = redis.get("rl-counter").await.expect("GET");
                    tokio::task::yield_now().await;
                    let _: () = redis
                        .set("rl-counter", value.unwrap_or(0) + 1, None, None, false)
                        .await
                        .expect("SET");
                    let _: i64 = redis.decr("rl-inside").await.expect("DECR");
                    guard.unlock().await.expect("unlock");
                }
                violations
            }));
        }
        let mut violations = 0;
        for task in tasks {
            violations += task.await.expect("task");
        }
        emit_result(format!("violations {violations}"));
    });
}

#[test]
fn redlock_keeps_mutual_exclusion_across_processes() {
    init_tracing();
    let servers = start_five();
    let urls = urls(&servers).join(",");
    let workers: Vec<_> = (0..3)
        .map(|_| spawn_worker_handle("redlock_worker", &[("RL_URLS", urls.clone())]))
        .collect();
    for worker in workers {
        assert_eq!(worker.wait(), vec!["violations 0".to_owned()]);
    }
    assert_eq!(servers[0].cmd(&["GET", "rl-counter"]).as_int(), 3 * 3 * 15);
}

/// A Redlock hold spans several clients, so no single client's registry tracks it. When one of
/// those clients shuts down, the hold is released on every instance and its guard hears
/// `LostCause::Shutdown`; a later `unlock()` says `Error::Shutdown`, and the lock is free for
/// others at once (no lease to wait for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutting_down_one_client_releases_the_redlock_everywhere() {
    init_tracing();
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls = urls(&servers);
    let first = clients(&urls).await;
    let lock = Redlock::new(&first, "spanning")
        .unwrap()
        .with_lease(Lease::fixed(Duration::from_secs(120)))
        .unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.instances(), 3);
    let lost = guard.lost();

    first[0].shutdown().await.unwrap();
    let cause = tokio::time::timeout(HANG, lost)
        .await
        .expect("lost() fired");
    assert_eq!(cause, LostCause::Shutdown);
    for client in &first[1..] {
        let state = client.mutex("spanning").unwrap().state().await.unwrap();
        assert!(!state.locked, "released on every instance: {state:?}");
    }
    assert!(matches!(guard.unlock().await, Err(Error::Shutdown)));

    // The lock is free at once: a Redlock over fresh clients takes it without waiting for the
    // 120 s lease.
    let fresh = clients(&urls).await;
    let again = Redlock::new(&fresh, "spanning").unwrap();
    let guard = again
        .try_lock()
        .await
        .unwrap()
        .expect("free after the shutdown");
    guard.unlock().await.unwrap();
    for client in first[1..].iter().chain(&fresh) {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_client_twice_is_refused() {
    init_tracing();
    let servers: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let clients = clients(&urls(&servers)).await;
    // [a, a, b]: one server would answer twice and make a quorum of 2 out of 3 alone.
    let twice = [clients[0].clone(), clients[0].clone(), clients[1].clone()];
    match Redlock::new(&twice, "votes") {
        Err(Error::InvalidConfig(message)) => assert!(message.contains("twice"), "{message}"),
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    // Distinct clients are fine.
    assert!(Redlock::new(&clients, "votes").is_ok());
    for client in &clients {
        client.shutdown().await.unwrap();
    }
}

/// While an instance is down, every round leaves an attempt there to settle (it may have run
/// after all, and its hold must then be given back): one background task per instance works
/// through them, however many rounds there are, rather than one task per round, each retrying
/// until its lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_against_a_dead_instance_leave_one_settling_task_behind() {
    init_tracing();
    let mut servers = start_five();
    let clients = clients(&urls(&servers)).await;
    let lock = Redlock::new(&clients, "steady").unwrap();
    servers[0].kill();
    let cycle = || async {
        let guard = tokio::time::timeout(HANG, lock.lock())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(guard.instances(), 4);
        guard.unlock().await.unwrap();
    };
    cycle().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    for _ in 0..10 {
        cycle().await;
    }
    let after = metrics.num_alive_tasks();
    assert!(
        after <= before + 2,
        "10 rounds against a dead instance left {} more tasks alive",
        after.saturating_sub(before)
    );
    for client in clients {
        let _ = client.shutdown().await;
    }
}
