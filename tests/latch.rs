//! CountDownLatch against a real redis-server, in both notification modes: set once, counted
//! down from another client, every waiting task of every client woken when it opens (by one
//! event per client), timeouts, delete, cancellation, and refused or foreign values.

mod support;

use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use fredlock::{CountDownLatch, Error, LockClient, NotificationMode};
use support::{
    bounded, connect, in_both_modes, init_tracing, poll_once, shutdown, RedisServer, ReplyDropper,
};

/// `tasks` tasks of `locks` waiting on the latch `name`, once each has registered in the
/// client's waiter table (its look may still be in flight).
async fn waiting(locks: &LockClient, name: &str, tasks: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let before = locks.stats().waiting;
    let handles = (0..tasks)
        .map(|_| {
            let latch = locks.count_down_latch(name).unwrap();
            tokio::spawn(async move { latch.wait().await.unwrap() })
        })
        .collect();
    support::eventually("the waiters registered", || {
        locks.stats().waiting >= before + tasks
    })
    .await;
    handles
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_wakes_every_waiting_task_of_every_client() {
    in_both_modes("latch-open", |mode, locks, other| async move {
        let latch = locks.count_down_latch("gate").unwrap();
        assert_eq!(latch.count().await.unwrap(), 0, "{mode:?}: never set: open");
        assert!(latch.try_set_count(3).await.unwrap());
        assert!(!latch.try_set_count(5).await.unwrap(), "{mode:?}: set once");
        assert_eq!(latch.count().await.unwrap(), 3);

        let mut tasks = waiting(&locks, "gate", 3).await;
        tasks.extend(waiting(&other, "gate", 2).await);
        let theirs = other.count_down_latch("gate").unwrap();
        assert_eq!(theirs.count_down().await.unwrap(), 2);
        assert_eq!(theirs.count_down().await.unwrap(), 1);
        for task in &mut tasks {
            poll_once("a waiter before the last count-down", task).await;
        }
        let wakeups = [locks.stats().wakeups, other.stats().wakeups];
        assert_eq!(theirs.count_down().await.unwrap(), 0, "{mode:?}: opened");
        for task in tasks {
            bounded("a waiter after the opening", task).await.unwrap();
        }
        // Woken by the opening's events, not by the safety-net look (30 s later).
        assert!(locks.stats().wakeups >= wakeups[0] + 3, "{mode:?}");
        assert!(other.stats().wakeups >= wakeups[1] + 2, "{mode:?}");
        assert_eq!(latch.count().await.unwrap(), 0);
        assert_eq!(
            latch.count_down().await.unwrap(),
            0,
            "{mode:?}: open stays open"
        );
        bounded("waiting on an open latch", latch.wait())
            .await
            .unwrap();
        assert!(
            latch.try_set_count(1).await.unwrap(),
            "{mode:?}: an open latch is set again"
        );
        assert!(latch.delete().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_times_out_on_a_closed_latch_and_delete_opens_it() {
    in_both_modes("latch-timeout", |mode, locks, other| async move {
        let latch = locks.count_down_latch("slow").unwrap();
        assert!(latch.try_set_count(2).await.unwrap());
        let open = latch
            .wait_timeout(Duration::from_millis(100))
            .await
            .unwrap();
        assert!(!open, "{mode:?}: still closed");
        assert!(!latch.wait_timeout(Duration::ZERO).await.unwrap());

        let tasks = waiting(&locks, "slow", 2).await;
        assert!(other
            .count_down_latch("slow")
            .unwrap()
            .delete()
            .await
            .unwrap());
        for task in tasks {
            bounded("a waiter after the delete", task).await.unwrap();
        }
        assert!(latch.wait_timeout(Duration::from_secs(1)).await.unwrap());
        assert!(!latch.delete().await.unwrap(), "{mode:?}: deleted already");
    })
    .await;
}

/// A dropped wait leaves the client's waiter table empty, and the latch works on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_nothing_behind() {
    in_both_modes("latch-cancel", |mode, locks, _other| async move {
        let latch = locks.count_down_latch("dropped").unwrap();
        assert!(latch.try_set_count(1).await.unwrap());
        let tasks = waiting(&locks, "dropped", 1).await;
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            assert!(task.await.unwrap_err().is_cancelled());
        }
        assert_eq!(locks.stats().waiting, 0, "{mode:?}");
        assert_eq!(latch.count_down().await.unwrap(), 0);
        bounded("an open latch", latch.wait()).await.unwrap();
    })
    .await;
}

/// A count of 0 is refused before any call; a foreign value under a latch's keys is reported
/// as such and left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_counts_and_foreign_values_are_refused() {
    init_tracing();
    let server = RedisServer::start();
    let locks = connect(support::config(
        &server,
        "latch-bad",
        NotificationMode::Stream,
    ))
    .await;
    let latch = locks.count_down_latch("bad").unwrap();
    assert!(matches!(
        latch.try_set_count(0).await,
        Err(Error::InvalidCount(0))
    ));
    let too_many = CountDownLatch::MAX_COUNT + 1;
    let refused = latch.try_set_count(too_many).await;
    assert!(matches!(refused, Err(Error::InvalidCount(n)) if n == too_many));
    assert_eq!(latch.count().await.unwrap(), 0, "nothing was written");

    let redis = locks.redis();
    let key = latch_key(&server, &latch).await;
    let _: () = redis.hset(&key, ("planted", "1")).await.unwrap();
    expect_wrong_type(&latch).await;
    let _: () = redis.set(&key, "abc", None, None, false).await.unwrap();
    expect_wrong_type(&latch).await;
    let planted: String = redis.get(&key).await.unwrap();
    assert_eq!(planted, "abc", "a foreign value is left alone");

    // The record of the calls that set or deleted the latch lately, beside its count.
    let ops = key.replacen(":latch:", ":latch.op:", 1);
    let _: () = redis.del((key.as_str(), ops.as_str())).await.unwrap();
    let _: () = redis.hset(&ops, ("planted", "1")).await.unwrap();
    expect_wrong_type_at(&latch, &ops).await;
    let _: () = redis
        .set(&ops, "not an op id", None, None, false)
        .await
        .unwrap();
    expect_wrong_type_at(&latch, &ops).await;
    let planted: String = redis.get(&ops).await.unwrap();
    assert_eq!(planted, "not an op id", "a foreign value is left alone");
    assert_eq!(latch.count().await.unwrap(), 0, "nothing was written");
    shutdown(&locks).await;
}

/// `try_set_count` and `delete` refuse a foreign value under `key` (the latch's record of the
/// calls that changed it), naming it.
async fn expect_wrong_type_at(latch: &CountDownLatch, key: &str) {
    for outcome in [
        latch.try_set_count(2).await.map(|_| ()),
        latch.delete().await.map(|_| ()),
    ] {
        assert!(
            matches!(&outcome, Err(Error::WrongType { key: named, .. }) if named == key),
            "{outcome:?}"
        );
    }
}

/// The key that holds `latch`'s count: the one key a set creates.
async fn latch_key(server: &RedisServer, latch: &CountDownLatch) -> String {
    assert!(latch.try_set_count(1).await.unwrap());
    let key = support::find_hold(server, "latch-bad", "latch", latch.name()).expect("the count");
    assert!(latch.delete().await.unwrap());
    key
}

async fn expect_wrong_type(latch: &CountDownLatch) {
    let outcomes = [
        latch.count().await.map(|_| ()),
        latch.count_down().await.map(|_| ()),
        latch.try_set_count(2).await.map(|_| ()),
        latch
            .wait_timeout(Duration::from_millis(10))
            .await
            .map(|_| ()),
        latch.delete().await.map(|_| ()),
    ];
    for outcome in outcomes {
        assert!(
            matches!(outcome, Err(Error::WrongType { .. })),
            "{outcome:?}"
        );
    }
}

/// A server, a [`ReplyDropper`] in front of it, a client of prefix `prefix` through the proxy,
/// and its latch `gate`.
async fn behind_a_reply_dropper(
    prefix: &str,
) -> (RedisServer, ReplyDropper, LockClient, CountDownLatch) {
    init_tracing();
    let server = RedisServer::start();
    let proxy = ReplyDropper::start(server.port()).await;
    let locks = connect(proxy.config(prefix)).await;
    let latch = locks.count_down_latch("gate").unwrap();
    (server, proxy, locks, latch)
}

/// A count-down whose reply is lost (the connection breaks after the script ran) is not sent
/// again: fred re-sends a command that was in flight on a broken connection, and a count-down
/// has no op id to answer a second delivery with, so it would count twice. The caller gets an
/// error instead (it may or may not have been applied; here it was, once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_down_whose_reply_is_lost_is_not_applied_twice() {
    let (_server, proxy, locks, latch) = behind_a_reply_dropper("latch-lost").await;
    assert!(latch.try_set_count(4).await.unwrap());
    // The script is cached now: the reply swallowed below is the script's, not a NOSCRIPT.
    assert_eq!(latch.count_down().await.unwrap(), 3);

    proxy.arm();
    let lost = bounded("a count-down whose reply is lost", latch.count_down()).await;
    assert!(lost.is_err(), "the outcome is unknown: {lost:?}");
    assert_eq!(latch.count().await.unwrap(), 2, "counted down once");

    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    bounded("the opened latch", latch.wait()).await.unwrap();
    shutdown(&locks).await;
}

/// `try_set_count` and `delete` whose reply is lost are sent again by fred after it
/// reconnects, and the second delivery answers what the first did: each call carries an op id
/// that the latch remembers for a while after the change it made (`lua/latch_set.lua`). Without
/// it the repeat would find the count the first delivery set (or the latch it deleted) and
/// answer `false` for a call that did what it was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_or_delete_whose_reply_is_lost_answers_what_it_did() {
    let (_server, proxy, locks, latch) = behind_a_reply_dropper("latch-resent").await;
    // Both scripts cached: the replies swallowed below are theirs, not a NOSCRIPT's.
    assert!(latch.try_set_count(1).await.unwrap());
    assert!(latch.delete().await.unwrap());

    proxy.arm();
    let set = bounded("a set whose reply is lost", latch.try_set_count(3)).await;
    assert!(
        set.unwrap(),
        "the re-sent set answers that it set the count"
    );
    assert_eq!(latch.count().await.unwrap(), 3, "set once");
    assert!(
        !latch.try_set_count(5).await.unwrap(),
        "another set still finds the count"
    );

    proxy.arm();
    let deleted = bounded("a delete whose reply is lost", latch.delete()).await;
    assert!(
        deleted.unwrap(),
        "the re-sent delete answers that it deleted the latch"
    );
    assert_eq!(latch.count().await.unwrap(), 0);
    assert!(
        !latch.delete().await.unwrap(),
        "another delete finds it open"
    );
    shutdown(&locks).await;
}
