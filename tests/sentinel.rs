//! Sentinel: 1 master + 1 replica + 3 sentinels on loopback. Clients connect through the
//! sentinels; a failover (SENTINEL FAILOVER, then a killed master) happens while tasks hold and
//! wait: clients reconnect to the new master, waiters acquire, nothing hangs, and holders whose
//! lock did not survive learn it through `lost()`.

mod support;

use std::time::Duration;

use fredlock::{Config, Error, Lease, LockClient, NotificationMode};
use support::sentinel::SentinelSetup;
use support::{init_tracing, MODES};

/// Bound that only turns a hang into a failure; never a performance claim.
const HANG: Duration = Duration::from_secs(90);

fn config(setup: &SentinelSetup, mode: NotificationMode) -> Config {
    let mut config = support::config(setup, &format!("sentinel-{}", mode.as_str()), mode);
    config.watchdog_lease = Duration::from_secs(2);
    config.command_timeout = Duration::from_secs(2);
    config
}

/// Holders hold, waiters wait, `failover` runs; then every waiter must get its lock.
async fn survive(setup: &mut SentinelSetup, failover: impl FnOnce(&mut SentinelSetup)) {
    let mut clients = Vec::new();
    let mut guards = Vec::new();
    let mut waiters = Vec::new();
    for mode in MODES {
        let holder = LockClient::connect(config(setup, mode)).await.unwrap();
        let waiter = LockClient::connect(config(setup, mode)).await.unwrap();
        for i in 0..4 {
            let name = format!("job-{i}");
            guards.push((mode, holder.mutex(&name).unwrap().lock().await.unwrap()));
            // Fixed, long lease on the waiting side: the test cannot pass by lease expiry of a
            // waiter's own hold, and the holders' watchdog leases are short (2 s).
            let mutex = waiter
                .mutex(&name)
                .unwrap()
                .with_lease(Lease::fixed(Duration::from_secs(60)))
                .unwrap();
            waiters.push(tokio::spawn(async move {
                let guard = mutex.lock().await?;
                guard.unlock().await
            }));
        }
        while waiter.stats().waiting < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        clients.push(holder);
        clients.push(waiter);
    }

    failover(setup);

    for (mode, guard) in guards {
        let lost = guard.lost_cause();
        match tokio::time::timeout(HANG, guard.unlock())
            .await
            .expect("unlock hung")
        {
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
    for client in clients {
        client.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_sentinel_failover() {
    init_tracing();
    let mut setup = SentinelSetup::start();
    let old = setup.master_port().unwrap();
    survive(&mut setup, |setup| {
        let reply = setup.sentinels[0]
            .cmd(&["SENTINEL", "FAILOVER", support::sentinel::SERVICE])
            .unwrap();
        assert!(!reply.is_error(), "{reply:?}");
        assert_ne!(setup.wait_new_master(old), old);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_survive_a_killed_master() {
    init_tracing();
    let mut setup = SentinelSetup::start();
    let old = setup.master_port().unwrap();
    survive(&mut setup, |setup| {
        let index = setup.server_on(old);
        setup.servers[index].kill();
        assert_ne!(setup.wait_new_master(old), old);
    })
    .await;
}
