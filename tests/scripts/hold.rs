//! Takes, re-entries, busy waiters queuing once, releases counting down and answering their
//! retries, hand-overs to a waiter of the releasing process (`hold_acquire.lua`,
//! `hold_release.lua`).

use crate::lua::*;
use crate::support::*;

/// A take, a retried take, re-entries (a lease longer than the hold's remaining time extends
/// the hold and becomes its `l`, so busy replies carry it; a shorter one changes neither), and
/// busy attempts: a try (no waiter id, or waiter lease 0) never queues; a waiting attempt
/// appends one line to `q` (its waiter id, inbox tag, owner, lease and grant ms = min(lease,
/// waiter lease)), and its next attempts (other op ids) add none. The busy reply is the
/// holder's lease and token. The first take of the shard draws its token from the fence key
/// (at or above the server clock); neither the re-entry nor a busy attempt reads or writes the
/// fence key.
#[test]
fn a_take_reenters_and_a_busy_waiter_queues_once() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");

    let clock = lua.clock();
    let taken = lua.acquire(Ask::once("a", "a-take"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let t = taken[1];
    assert_drawn(t, 0, clock, "the shard's first take");
    assert_eq!(fence_value(&server, FENCE), (t as u64, LAYOUT.to_owned()));
    lua.assert_hold(&held("a", t, LEASE, "a-take"), LEASE, "a's take");
    let fence = snapshot(&server, FENCE);

    // A retried take (same op id) is answered, not applied again.
    assert_eq!(lua.acquire(Ask::once("a", "a-take")), vec![1, t, 1]);
    assert_eq!(lua.hash(), held("a", t, LEASE, "a-take"));

    // Re-entry: the count goes up, r is the new op, the token stays; a retried re-entry is
    // answered; a longer lease extends the hold and is its l from then on (the bound busy
    // attempts are given), a shorter one leaves both.
    assert_eq!(
        lua.acquire(Ask::once("a", "a-again").lease(2 * LEASE)),
        vec![1, t, 2]
    );
    assert_eq!(
        lua.acquire(Ask::once("a", "a-again").lease(2 * LEASE)),
        vec![1, t, 2]
    );
    let reentered = HoldHash {
        c: "2".to_owned(),
        ..held("a", t, 2 * LEASE, "a-again")
    };
    lua.assert_hold(&reentered, 2 * LEASE, "the longer re-entry");
    assert!(lua.pttl() > LEASE, "the longer lease extends the hold");
    assert_eq!(
        lua.acquire(Ask::once("a", "a-third").lease(1_000)),
        vec![1, t, 3]
    );
    assert!(lua.pttl() > LEASE, "a shorter lease does not shorten it");
    let holding = HoldHash {
        c: "3".to_owned(),
        ..held("a", t, 2 * LEASE, "a-third")
    };
    assert_eq!(lua.hash(), holding, "a shorter lease changed l");

    // Tries never queue: no waiter id, or a waiter id with waiter lease 0. The bound is the
    // holder's lease (the re-entry's), with the holder's token.
    assert_eq!(lua.acquire(Ask::once("b", "b-try")), busy(2 * LEASE, t));
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-try-2", "wb").waiter_lease(0)),
        busy(2 * LEASE, t)
    );
    assert_eq!(lua.hash(), holding, "a try changed the hold");

    // A waiting attempt queues once; its next attempts (other ops) add no line.
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait", "wb")),
        busy(2 * LEASE, t)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait-2", "wb")),
        busy(2 * LEASE, t)
    );
    // Grant ms = min(lease, waiter lease); a waiter id that is a prefix of a queued one
    // ("w" of "wb") is another waiter.
    assert_eq!(
        lua.acquire(Ask::waiting("c", "c-wait", "wc").lease(2_000)),
        busy(2 * LEASE, t)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("d", "d-wait", "w").waiter_lease(60_000)),
        busy(2 * LEASE, t)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("c", "c-wait-2", "wc").lease(2_000)),
        busy(2 * LEASE, t)
    );
    let queue = [
        line("wb", "b", LEASE, WAITER_LEASE),
        line("wc", "c", 2_000, 2_000),
        line("w", "d", LEASE, LEASE),
    ]
    .concat();
    let queued = HoldHash {
        q: queue,
        ..holding.clone()
    };
    lua.assert_hold(&queued, 2 * LEASE, "three waiters queued");
    assert_eq!(queued_waiters(&server, HOLD), ["wb", "wc", "w"]);
    assert_eq!(hold_owner(&server, HOLD).as_deref(), Some("a"));

    // The hold's time runs down (set here far below l): a re-entry whose lease is above what
    // is left extends it and sets l to its lease, lower than the l before; the queue stays, and
    // busy attempts are given the new bound.
    server.cmd(&["PEXPIRE", HOLD, "10000"]);
    assert_eq!(
        lua.acquire(Ask::once("a", "a-fourth").lease(20_000)),
        vec![1, t, 4]
    );
    lua.assert_hold(
        &HoldHash {
            c: "4".to_owned(),
            l: "20000".to_owned(),
            r: "a-fourth".to_owned(),
            ..queued.clone()
        },
        20_000,
        "a re-entry above the remaining time",
    );
    assert!(lua.pttl() > 10_000, "the re-entry extended the hold");
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait-3", "wb")),
        busy(20_000, t)
    );

    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// A re-entry drops the caller's own queue line (only its own): two waiters of one owner
/// queue, then one of another owner; a release grants the lock to the first; the second's next
/// attempt re-enters (count 2, the lease extended) and leaves the queue, so the owner's
/// releases grant the lock to the other owner's waiter, and with that one gone free it,
/// instead of granting it to the second waiter (a grant it would never take up). A re-entry by
/// an attempt that is not queued (a try) leaves the queue alone.
#[test]
fn a_reentry_drops_the_callers_own_queue_line() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["p", "c"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    for (owner, op, waiter) in [
        ("p", "p-wait-1", "wp1"),
        ("p", "p-wait-2", "wp2"),
        ("c", "c-wait", "wc"),
    ] {
        assert_eq!(lua.acquire(Ask::waiting(owner, op, waiter)), busy(LEASE, t));
    }

    let clock = lua.clock();
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tp = lua.token();
    assert_drawn(tp, t, clock, "wp1's grant");
    let first = tp;
    let after_wp1 = [
        line("wp2", "p", LEASE, WAITER_LEASE),
        line("wc", "c", LEASE, WAITER_LEASE),
    ]
    .concat();
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: after_wp1,
            ..granted("p", tp, WAITER_LEASE, "wp1")
        },
        WAITER_LEASE,
        "wp1's grant",
    );
    assert_eq!(lua.inbox_events("p"), [grant("wp1", tp, WAITER_LEASE)]);

    // wp2 looks again: its owner holds the lock, so it re-enters, and its line is gone (c's
    // stays). A retried attempt is answered the same.
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-2-again", "wp2")),
        vec![1, tp, 2]
    );
    // Its lease, longer than the grant's, extends the hold and becomes its l (the bound c is
    // given); the hold stays granted to wp1 (g).
    let reentered = HoldHash {
        c: "2".to_owned(),
        l: LEASE.to_string(),
        r: "p-wait-2-again".to_owned(),
        x: "a-release".to_owned(),
        q: line("wc", "c", LEASE, WAITER_LEASE),
        ..granted("p", tp, WAITER_LEASE, "wp1")
    };
    lua.assert_hold(&reentered, LEASE, "wp2's re-entry");
    assert!(
        lua.pttl() > WAITER_LEASE,
        "the re-entry's lease extends the grant's"
    );
    assert_eq!(
        lua.acquire(Ask::waiting("c", "c-wait-again", "wc")),
        busy(LEASE, tp)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-2-again", "wp2")),
        vec![1, tp, 2]
    );
    assert_eq!(lua.hash(), reentered, "a retried re-entry changed the hold");

    // A try of p re-enters and leaves the queue alone.
    assert_eq!(lua.acquire(Ask::once("p", "p-try")), vec![1, tp, 3]);
    let thrice = HoldHash {
        c: "3".to_owned(),
        r: "p-try".to_owned(),
        ..reentered.clone()
    };
    assert_eq!(lua.hash(), thrice);

    // p's three releases: the last grants the lock to c, not to wp2.
    assert_eq!(lua.release("p", tp, "p-release-1"), vec![1, 2]);
    assert_eq!(lua.release("p", tp, "p-release-2"), vec![1, 1]);
    let clock = lua.clock();
    assert_eq!(lua.release("p", tp, "p-release-3"), vec![1, 0]);
    let tc = lua.token();
    assert_drawn(tc, tp, clock, "c's grant");
    lua.assert_hold(
        &HoldHash {
            x: "p-release-3,a-release".to_owned(),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant",
    );
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE)]);
    assert_eq!(lua.inbox_events("p").len(), 1, "wp2 was granted the lock");

    // The same with nobody else queued: c's release grants the lock to wp3, wp4 re-enters
    // (its lease becomes l), and p's two releases free the lock (the tombstone keeps that l).
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-3", "wp3")),
        busy(WAITER_LEASE, tc)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-4", "wp4")),
        busy(WAITER_LEASE, tc)
    );
    assert_eq!(lua.release("c", tc, "c-release"), vec![1, 0]);
    let tp = lua.token();
    assert!(tp > tc, "wp3's grant: token {tp} after {tc}");
    assert_eq!(lua.hash().q, line("wp4", "p", LEASE, WAITER_LEASE));
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-4-again", "wp4")),
        vec![1, tp, 2]
    );
    assert_eq!(lua.release("p", tp, "p-release-4"), vec![1, 1]);
    assert_eq!(lua.release("p", tp, "p-release-5"), vec![1, 0]);
    lua.assert_hold(
        &tombstone(
            tp,
            LEASE,
            "p-release-5",
            "p-release-5,c-release,p-release-3,a-release",
        ),
        WINDOW,
        "freed by p",
    );
    assert_eq!(
        lua.inbox_events("p"),
        [
            grant("wp1", first, WAITER_LEASE),
            grant("wp3", tp, WAITER_LEASE)
        ],
        "wp2 or wp4 was granted the lock"
    );
    lua.assert_no_stray_keys();
}

/// The grant is the waiter's (field `g`), not the last op's (`r`): a release grants the lock
/// to wp1 of owner p, then wp2 of p re-enters (r becomes wp2's op, the count 2). wp1's next
/// attempt, and its retried first one, are still answered "granted already" (`{1, token,
/// count, remaining}`, no third level, nothing written), the heartbeat still finds wp1 (and not
/// wp2, nor its op id), and when wp1 gives up, its leave takes back only its own level: wp2
/// keeps the lock (count 1, nobody's grant), and p's release then grants it to the next waiter.
#[test]
fn a_grant_stays_the_waiters_after_another_task_of_its_owner_reenters() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["p", "c"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for (owner, op, waiter) in [
        ("p", "p-wait-1", "wp1"),
        ("p", "p-wait-2", "wp2"),
        ("c", "c-wait", "wc"),
    ] {
        assert_eq!(lua.acquire(Ask::waiting(owner, op, waiter)), busy(LEASE, t));
    }
    let clock = lua.clock();
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tp = lua.token();
    assert_drawn(tp, t, clock, "wp1's grant");
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: [
                line("wp2", "p", LEASE, WAITER_LEASE),
                line("wc", "c", LEASE, WAITER_LEASE),
            ]
            .concat(),
            ..granted("p", tp, WAITER_LEASE, "wp1")
        },
        WAITER_LEASE,
        "wp1's grant",
    );
    assert_eq!(lua.inbox_events("p"), [grant("wp1", tp, WAITER_LEASE)]);

    // wp2 re-enters before wp1 read its grant: r is wp2's op, g stays wp1.
    assert_eq!(
        lua.acquire(Ask::waiting("p", "p-wait-2-again", "wp2")),
        vec![1, tp, 2]
    );
    let reentered = HoldHash {
        c: "2".to_owned(),
        l: LEASE.to_string(),
        r: "p-wait-2-again".to_owned(),
        x: "a-release".to_owned(),
        q: line("wc", "c", LEASE, WAITER_LEASE),
        ..granted("p", tp, WAITER_LEASE, "wp1")
    };
    lua.assert_hold(&reentered, LEASE, "wp2's re-entry on wp1's grant");

    // wp1's next attempt (another op), and its first one re-sent: "granted already", with the
    // count as it is and what is left of the hold; no level added, no key written.
    let before = lua.dump(&[]);
    for op in ["p-wait-1-again", "p-wait-1"] {
        let answered = lua.acquire(Ask::waiting("p", op, "wp1"));
        assert_eq!(
            (answered.len(), &answered[..3]),
            (4, &[1, tp, 2][..]),
            "{op}: {answered:?}"
        );
        assert!(
            answered[3] > 0 && answered[3] <= LEASE,
            "{op}: {answered:?}"
        );
    }
    assert_eq!(
        lua.dump(&[]),
        before,
        "a granted-already answer wrote a key"
    );
    assert_eq!(lua.hash(), reentered);
    assert_eq!(
        ints(lua.heartbeat_raw(&[(HOLD, &["wp1", "wp2", "p-wait-2-again"])])),
        vec![1, 0, 0]
    );

    // wp1 gives up: wp2 keeps the lock, one level fewer (wp1's), and the grant is no
    // longer anybody's; c stays queued. p's release then frees it for c.
    let before_fence = snapshot(&server, FENCE);
    assert_eq!(lua.leave("wp1"), vec![1]);
    let p_keeps = HoldHash {
        c: "1".to_owned(),
        g: String::new(),
        ..reentered.clone()
    };
    lua.assert_hold(&p_keeps, LEASE, "wp1 left its level");
    assert_eq!(lua.inbox_events("c"), Vec::<String>::new(), "c was told");
    let before = lua.dump(&[]);
    assert_eq!(lua.leave("wp1"), vec![0]);
    assert_eq!(lua.dump(&[]), before, "a second leave changed a key");
    let clock = lua.clock();
    assert_eq!(lua.release("p", tp, "p-release"), vec![1, 0]);
    let tc = lua.token();
    assert_drawn(tc, tp, clock, "c's grant from p");
    let c_holds = HoldHash {
        x: "p-release,a-release".to_owned(),
        ..granted("c", tc, WAITER_LEASE, "wc")
    };
    lua.assert_hold(&c_holds, WAITER_LEASE, "c's grant from p");
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE)]);
    assert_eq!(
        snapshot(&server, FENCE),
        before_fence,
        "the fence key changed"
    );
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// Releases: by another owner or with a stale token refused with no change; one hold of two
/// counted down; the last one frees the lock, leaving a tombstone {o = ""} for the retry window
/// with the token kept; every retry (same op id) answered as the call it was, also after
/// another owner took the lock; a new release of a freed lock answered "not held". A take from
/// the tombstone draws its token from the hash (max(f + 1, clock)), never from the fence key.
#[test]
fn releases_count_down_free_the_lock_and_answer_their_retries() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let inspect = composed(&[], include_str!("../../lua/hold_inspect.lua"));
    let inspect = || ints(server.cmd(&["EVAL", &inspect, "1", HOLD]));

    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    assert_eq!(lua.acquire(Ask::once("a", "a-again")), vec![1, t, 2]);
    let before = lua.dump(&[]);
    // Another owner, and a stale token of the holder: refused, nothing changes.
    assert_eq!(lua.release("b", t, "b-release"), vec![-1, 0]);
    assert_eq!(lua.release("a", t - 1, "a-stale"), vec![-1, 0]);
    assert_eq!(
        lua.release_raw("b", t, "b-all", true, None),
        ints_of(&[-1, 0])
    );
    assert_eq!(lua.dump(&[]), before, "a refused release changed a key");

    // One of two holds; its retry is answered with the same count.
    assert_eq!(lua.release("a", t, "a-release-1"), vec![1, 1]);
    let one_left = held("a", t, LEASE, "a-release-1");
    assert_eq!(lua.hash(), one_left);
    assert_eq!(lua.release("a", t, "a-release-1"), vec![1, 1]);
    assert_eq!(lua.hash(), one_left, "a retried release counted down again");
    assert_eq!(inspect()[..3], [1, 1, t]);

    // The last one frees the lock: a tombstone for the retry window.
    assert_eq!(lua.release("a", t, "a-release-2"), vec![1, 0]);
    let freed = tombstone(t, LEASE, "a-release-2", "a-release-2");
    lua.assert_hold(&freed, WINDOW, "the tombstone");
    assert_eq!(hold_owner(&server, HOLD), None);
    assert_eq!(inspect(), vec![0, 0, 0, -2]);
    let before = lua.dump(&[]);
    assert_eq!(lua.release("a", t, "a-release-2"), vec![1, 0]);
    assert_eq!(lua.release("a", t, "a-release-1"), vec![0, 0]);
    assert_eq!(lua.release("a", t, "a-release-3"), vec![0, 0]);
    assert_eq!(
        lua.dump(&[]),
        before,
        "a release of a free lock changed a key"
    );

    // b takes the lock from the tombstone: the token continues the hash's; a's retried release
    // is still answered "released" and leaves b alone; a's new release is refused.
    let clock = lua.clock();
    let taken = lua.acquire(Ask::once("b", "b-take"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let tb = taken[1];
    assert_drawn(tb, t, clock, "b's take from the tombstone");
    let b_holds = HoldHash {
        x: "a-release-2".to_owned(),
        ..held("b", tb, LEASE, "b-take")
    };
    lua.assert_hold(&b_holds, LEASE, "b's take from the tombstone");
    assert_eq!(lua.release("a", t, "a-release-2"), vec![1, 0]);
    assert_eq!(lua.release("a", t, "a-again-2"), vec![-1, 0]);
    assert_eq!(lua.hash(), b_holds, "b was harmed");

    // Every hold at once ("all"): b holds three, one release frees the lock.
    assert_eq!(lua.acquire(Ask::once("b", "b-2")), vec![1, tb, 2]);
    assert_eq!(lua.acquire(Ask::once("b", "b-3")), vec![1, tb, 3]);
    assert_eq!(
        lua.release_raw("b", tb, "b-all", true, None),
        ints_of(&[1, 0])
    );
    lua.assert_hold(
        &tombstone(tb, LEASE, "b-all", "b-all,a-release-2"),
        WINDOW,
        "freed at once",
    );

    // A tombstone whose token runs ahead of the clock: the next take is exactly one above it.
    let ahead = lua.push_ahead();
    assert_eq!(lua.acquire(Ask::once("c", "c-take")), vec![1, ahead + 1, 1]);
    lua.assert_hold(
        &HoldHash {
            x: "b-all,a-release-2".to_owned(),
            ..held("c", ahead + 1, LEASE, "c-take")
        },
        LEASE,
        "c's take from a tombstone ahead of the clock",
    );
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// fred re-sends the commands of a broken connection, so a release that freed the lock can
/// arrive a second time after several owners took it meanwhile (freed, handed over, freed...).
/// The last releases that freed it (as many ids as fit in 64 bytes: two of 30 characters, the
/// length of the crate's op ids) are still answered "released", and the holder is unharmed;
/// older ones are refused (another owner holds the lock).
#[test]
fn releases_resent_after_others_took_the_lock_are_answered_released() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let release = |n: usize| format!("{n:0>30}");
    // The token a hand-over drew, and the server clock read before it.
    let mut handed: Option<(i64, i64)> = None;
    let mut last_token = 0;
    for n in 0..6 {
        let (owner, next) = (format!("o{n}"), format!("o{}", n + 1));
        let (token, clock) = match handed.take() {
            Some(drawn) => drawn,
            None => {
                let clock = lua.clock();
                let taken = lua.acquire(Ask::once(&owner, &format!("{owner}-take")));
                assert_eq!((taken[0], taken[2]), (1, 1), "{owner}: {taken:?}");
                (taken[1], clock)
            }
        };
        assert_drawn(token, last_token, clock, &owner);
        last_token = token;
        let clock = lua.clock();
        let given = if n % 2 == 0 {
            lua.hand_over(&owner, token, &release(n), (&next, "w"))
        } else {
            lua.release(&owner, token, &release(n))
        };
        assert_eq!(given[..2], [1, 0], "{owner}: {given:?}");
        assert_eq!(given.len(), if n % 2 == 0 { 3 } else { 2 }, "{given:?}");
        handed = given.get(2).map(|&token| (token, clock));
    }
    let clock = lua.clock();
    let taken = lua.acquire(Ask::once("last", "last-take"));
    assert_eq!((taken[0], taken[2]), (1, 1), "{taken:?}");
    assert_drawn(taken[1], last_token, clock, "the last take");
    let holder = lua.hash();
    assert_eq!(holder.x, format!("{},{}", release(5), release(4)));
    for n in 0..6 {
        let resent = lua.release(&format!("o{n}"), 0, &release(n));
        let expected = if n >= 4 { vec![1, 0] } else { vec![-1, 0] };
        assert_eq!(resent, expected, "release {n}");
    }
    assert_eq!(lua.hash(), holder, "the holder is unharmed");
}

/// The hand-over (`lua/hold_release.lua`): a release that frees the lock takes it for a named
/// successor (token max(f + 1, clock), its lease, its waiter id as r, its queue line removed,
/// the streak counted in h) and says so; the successor's re-check is answered without a second
/// level; a re-sent release still reports the hand-over (or only "released" when it names
/// another successor); after `STREAK` hand-overs in a row the queue's head gets the lock (for
/// its grant ms), and a fresh streak starts. No hand-over or grant reads or writes the fence
/// key or sends an event to the successor.
#[test]
fn a_release_hands_the_lock_to_a_successor_at_most_streak_times_in_a_row() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "c", "d", "e", "f"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for (owner, waiter) in [("b", "wb"), ("c", "wc")] {
        assert_eq!(
            lua.acquire(Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, t)
        );
    }

    let clock = lua.clock();
    let handed = lua.hand_over("a", t, "a-release", ("b", "wb"));
    assert_eq!(
        (handed.len(), handed[0], handed[1]),
        (3, 1, 0),
        "{handed:?}"
    );
    let tb = handed[2];
    assert_drawn(tb, t, clock, "b's hand-over");
    let b_holds = HoldHash {
        x: "a-release".to_owned(),
        h: "1".to_owned(),
        q: line("wc", "c", LEASE, WAITER_LEASE),
        ..granted("b", tb, SUCCESSOR_LEASE, "wb")
    };
    lua.assert_hold(&b_holds, SUCCESSOR_LEASE, "b's hand-over");
    assert!(
        lua.pttl() > WAITER_LEASE,
        "the successor's lease, not a grant's"
    );
    assert!(
        lua.inbox_events("b").is_empty(),
        "a hand-over sends nothing"
    );

    // b never heard of it: its next attempt (another op, its waiter id) is answered, with the
    // same token and what is left of the hold; the count stays 1.
    let answered = lua.acquire(Ask::waiting("b", "b-recheck", "wb"));
    assert_eq!(answered[..3], [1, tb, 1], "{answered:?}");
    assert!(
        answered[3] > 0 && answered[3] <= SUCCESSOR_LEASE,
        "{answered:?}"
    );
    assert_eq!(lua.hash(), b_holds);
    // a's release, re-sent, still reports the hand-over it made (else b would never learn of
    // it); re-sent with another successor, or none, it is only answered as released.
    assert_eq!(
        lua.hand_over("a", t, "a-release", ("b", "wb")),
        vec![1, 0, tb]
    );
    assert_eq!(lua.hand_over("a", t, "a-release", ("c", "wc")), vec![1, 0]);
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    assert_eq!(lua.hash(), b_holds, "a re-sent release changed the hold");

    // Another task of b re-enters (a try: the count 2, r its op, and l its lease, above what
    // is left of the hold). The hold stays handed to wb (g): wb's next attempt is still
    // answered as handed over (count 2, no third level), and a's release, re-sent once more,
    // still reports the hand-over. The inner release counts down.
    assert_eq!(lua.acquire(Ask::once("b", "b-inner")), vec![1, tb, 2]);
    let b_twice = HoldHash {
        c: "2".to_owned(),
        l: LEASE.to_string(),
        r: "b-inner".to_owned(),
        ..b_holds.clone()
    };
    lua.assert_hold(&b_twice, LEASE, "b's inner re-entry");
    let answered = lua.acquire(Ask::waiting("b", "b-recheck-2", "wb"));
    assert_eq!(answered[..3], [1, tb, 2], "{answered:?}");
    assert!(answered[3] > 0 && answered[3] <= LEASE, "{answered:?}");
    assert_eq!(
        lua.hand_over("a", t, "a-release", ("b", "wb")),
        vec![1, 0, tb]
    );
    assert_eq!(lua.hand_over("a", t, "a-release", ("c", "wc")), vec![1, 0]);
    assert_eq!(lua.hash(), b_twice, "a re-sent release changed the hold");
    assert_eq!(lua.release("b", tb, "b-inner-release"), vec![1, 1]);
    assert_eq!(
        lua.hash(),
        HoldHash {
            c: "1".to_owned(),
            r: "b-inner-release".to_owned(),
            ..b_twice
        }
    );

    // Second hand-over in a row, to a successor that never queued: the queue stays. With b's
    // token ahead of the clock, the tokens from here on are exactly one above the last.
    let tb = lua.push_ahead();
    assert_eq!(
        lua.hand_over("b", tb, "b-release", ("d", "wd")),
        vec![1, 0, tb + 1]
    );
    lua.assert_hold(
        &HoldHash {
            x: "b-release,a-release".to_owned(),
            h: "2".to_owned(),
            q: line("wc", "c", LEASE, WAITER_LEASE),
            ..granted("d", tb + 1, SUCCESSOR_LEASE, "wd")
        },
        SUCCESSOR_LEASE,
        "d's hand-over",
    );

    // The cap: d's release does not hand over; the queue's head c gets the lock for its grant
    // ms (grant event to c's inbox) and the streak starts again.
    assert_eq!(
        lua.hand_over("d", tb + 1, "d-release", ("e", "we")),
        vec![1, 0]
    );
    lua.assert_hold(
        &HoldHash {
            x: "d-release,b-release,a-release".to_owned(),
            ..granted("c", tb + 2, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant after the streak",
    );
    assert_eq!(lua.inbox_events("c"), [grant("wc", tb + 2, WAITER_LEASE)]);
    assert!(lua.inbox_events("e").is_empty());
    // d's release, re-sent naming e: answered, no hand-over.
    assert_eq!(
        lua.hand_over("d", tb + 1, "d-release", ("e", "we")),
        vec![1, 0]
    );
    assert_eq!(hold_owner(&server, HOLD).as_deref(), Some("c"));

    // A fresh streak: c hands over to f.
    assert_eq!(
        lua.hand_over("c", tb + 2, "c-release", ("f", "wf")),
        vec![1, 0, tb + 3]
    );
    lua.assert_hold(
        &HoldHash {
            x: "c-release,d-release,b-release,a-release".to_owned(),
            h: "1".to_owned(),
            ..granted("f", tb + 3, SUCCESSOR_LEASE, "wf")
        },
        SUCCESSOR_LEASE,
        "f's hand-over",
    );
    // A stale holder cannot hand the lock over.
    let before = lua.dump(&[]);
    assert_eq!(
        lua.hand_over("c", tb + 2, "c-again", ("e", "we")),
        vec![-1, 0]
    );
    assert_eq!(lua.dump(&[]), before);

    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}
