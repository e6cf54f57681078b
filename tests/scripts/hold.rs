//! Takes, re-entries, busy waiters queuing once, releases counting down and answering their
//! retries, hand-overs to a task of the releasing process until the queue's head has waited the
//! hand-over limit (`hold_acquire.lua`, `hold_release.lua`).

use crate::lua::*;
use crate::support::*;

/// A take, a retried take, re-entries (a lease longer than the hold's remaining time extends
/// the hold and becomes its `l`, so busy replies carry it; a shorter one changes neither), and
/// busy attempts: a try (no waiter id, or waiter lease 0) never queues; a waiting attempt
/// appends one line to `q` (its waiter id, inbox tag, owner, lease, grant ms = min(lease,
/// waiter lease) and since = the server clock in ms when it queued), and its next attempts
/// (other op ids) add none and leave its since as it was. The busy reply is the
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

    // A waiting attempt queues once, its line stamped with the server clock (ms) of the call;
    // its next attempts (other ops) add no line and keep the stamp.
    let before = lua.clock().div_euclid(1000);
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait", "wb")),
        busy(2 * LEASE, t)
    );
    let after = lua.clock().div_euclid(1000);
    let since = queued_since(&lua.hash().q, "wb").expect("wb queued");
    assert!(
        (before..=after).contains(&since),
        "wb queued at {since} ms, not within {before}..={after}"
    );
    assert_eq!(
        lua.hash().q,
        queue_line("wb", "b", LEASE, WAITER_LEASE, since)
    );
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait-2", "wb")),
        busy(2 * LEASE, t)
    );
    assert_eq!(
        lua.hash().q,
        queue_line("wb", "b", LEASE, WAITER_LEASE, since)
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
        lua.line("wb", "b", LEASE, WAITER_LEASE),
        lua.line("wc", "c", 2_000, 2_000),
        lua.line("w", "d", LEASE, LEASE),
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
        lua.line("wp2", "p", LEASE, WAITER_LEASE),
        lua.line("wc", "c", LEASE, WAITER_LEASE),
    ]
    .concat();
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: after_wp1,
            i: String::new(),
            ..granted("p", tp, WAITER_LEASE, "wp1")
        },
        WAITER_LEASE,
        "wp1's grant",
    );
    assert_eq!(lua.inbox_events("p"), [grant("wp1", tp, WAITER_LEASE, 2)]);

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
        q: lua.line("wc", "c", LEASE, WAITER_LEASE),
        i: String::new(),
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
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE, 0)]);
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
    assert_eq!(lua.hash().q, lua.line("wp4", "p", LEASE, WAITER_LEASE));
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
            grant("wp1", first, WAITER_LEASE, 2),
            grant("wp3", tp, WAITER_LEASE, 1)
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
                lua.line("wp2", "p", LEASE, WAITER_LEASE),
                lua.line("wc", "c", LEASE, WAITER_LEASE),
            ]
            .concat(),
            i: String::new(),
            ..granted("p", tp, WAITER_LEASE, "wp1")
        },
        WAITER_LEASE,
        "wp1's grant",
    );
    assert_eq!(lua.inbox_events("p"), [grant("wp1", tp, WAITER_LEASE, 2)]);

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
        q: lua.line("wc", "c", LEASE, WAITER_LEASE),
        i: String::new(),
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
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE, 0)]);
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
    let inspect = hold_inspect_script();
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
        // A hand-over: {1, 0, token, 0} (nobody queued).
        assert_eq!(given.len(), if n % 2 == 0 { 4 } else { 2 }, "{given:?}");
        assert_eq!(given.get(3), (n % 2 == 0).then_some(&0), "{given:?}");
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
/// successor (token max(f + 1, clock), its lease, its waiter id as r and g, its own queue line
/// removed, the other lines untouched) and replies {1, 0, token, queued, quiet} (queued: 1
/// while waiters stay in the queue; quiet: ms until the first of them other than the
/// successor has waited the limit, a re-sent release omits it); the successor's re-check is answered without a second level; a
/// re-sent release still reports the hand-over (or only "released" when it names another
/// successor). No count caps hand-overs in a row: only time does. Once the queue's head (a
/// waiter other than the successor) has waited the limit (ARGV[12], ms) or more since it
/// queued, the release grants the lock to it instead (for its grant ms, grant event in its
/// inbox) and replies {1, 0}, the successor's own line (if queued) staying; a successor that
/// is itself the head is handed the lock however long it waited. Times are set, not waited
/// for: the head's since column is set back, or the limit is 0. No hand-over or grant reads or
/// writes the fence key or sends an event to the successor.
#[test]
fn a_release_hands_the_lock_to_a_successor_until_the_queue_head_has_waited_the_limit() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "c", "d", "e", "f", "g", "h", "i"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for (owner, waiter) in [("b", "wb"), ("c", "wc"), ("e", "we")] {
        assert_eq!(
            lua.acquire(Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, t)
        );
    }
    let rest = || {
        [
            lua.line("wc", "c", LEASE, WAITER_LEASE),
            lua.line("we", "e", LEASE, WAITER_LEASE),
        ]
        .concat()
    };

    // a hands the lock to b, the queue's head: wb's line goes, wc's and we's stay.
    let clock = lua.clock();
    let handed = lua.hand_over("a", t, "a-release", ("b", "wb"));
    assert_eq!(
        (handed.len(), handed[0], handed[1], handed[3]),
        (5, 1, 0, 2),
        "{handed:?}"
    );
    // Nobody queued was due: the reply says when the first waiter other than wb (wc, queued
    // just now) will be, about the limit from now.
    assert_quiet(&handed, LIMIT);
    let tb = handed[2];
    assert_drawn(tb, t, clock, "b's hand-over");
    let b_holds = HoldHash {
        x: "a-release".to_owned(),
        q: rest(),
        ..handed_over("b", tb, SUCCESSOR_LEASE, "wb")
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
        vec![1, 0, tb, 2]
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
        vec![1, 0, tb, 2]
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

    // The head wc has waited half the limit: b hands the lock over again, to d, which never
    // queued; the queue stays as it is. With b's token ahead of the clock, the tokens from
    // here on are exactly one above the last.
    lua.set_since("wc", lua.clock().div_euclid(1000) - LIMIT / 2);
    let tb = lua.push_ahead();
    // The reply says wc is due in about half the limit.
    let handed = lua.hand_over("b", tb, "b-release", ("d", "wd"));
    assert_eq!(handed[..4], [1, 0, tb + 1, 2], "{handed:?}");
    assert_quiet(&handed, LIMIT / 2);
    lua.assert_hold(
        &HoldHash {
            x: "b-release,a-release".to_owned(),
            q: rest(),
            ..handed_over("d", tb + 1, SUCCESSOR_LEASE, "wd")
        },
        SUCCESSOR_LEASE,
        "d's hand-over",
    );
    // A third in a row, to f (no count caps them).
    let handed = lua.hand_over("d", tb + 1, "d-release", ("f", "wf"));
    assert_eq!(handed[..4], [1, 0, tb + 2, 2], "{handed:?}");
    assert_quiet(&handed, LIMIT / 2);
    lua.assert_hold(
        &HoldHash {
            x: "d-release,b-release,a-release".to_owned(),
            q: rest(),
            ..handed_over("f", tb + 2, SUCCESSOR_LEASE, "wf")
        },
        SUCCESSOR_LEASE,
        "f's hand-over",
    );
    for owner in ["d", "f"] {
        assert!(lua.inbox_events(owner).is_empty(), "{owner} was sent to");
    }

    // The head wc has waited the limit (its since set back by the limit, read before the
    // call): f's release, naming e (queued behind wc), grants the lock to wc instead (grant
    // event to c's inbox); we stays queued.
    lua.set_since("wc", lua.clock().div_euclid(1000) - LIMIT);
    assert_eq!(
        lua.hand_over("f", tb + 2, "f-release", ("e", "we")),
        vec![1, 0]
    );
    let c_holds = HoldHash {
        x: "f-release,d-release,b-release,a-release".to_owned(),
        q: lua.line("we", "e", LEASE, WAITER_LEASE),
        i: String::new(),
        ..granted("c", tb + 3, WAITER_LEASE, "wc")
    };
    lua.assert_hold(&c_holds, WAITER_LEASE, "wc's grant: it waited the limit");
    assert_eq!(
        lua.inbox_events("c"),
        [grant("wc", tb + 3, WAITER_LEASE, 1)]
    );
    assert!(lua.inbox_events("e").is_empty(), "e was sent to");
    // f's release, re-sent naming e: answered, no hand-over, nothing changed.
    let before = lua.dump(&[]);
    assert_eq!(
        lua.hand_over("f", tb + 2, "f-release", ("e", "we")),
        vec![1, 0]
    );
    assert_eq!(lua.dump(&[]), before, "a re-sent release changed a key");
    assert_eq!(lua.hash(), c_holds);

    // g queues behind we. With limit 0 every head is overdue, but c's hold is the queue's
    // turn (a grant) and the successor we is the head itself: c hands it the lock; wg stays
    // queued. (A handed-over holder's release to the head alone: h's and wi's, below.)
    assert_eq!(
        lua.acquire(Ask::waiting("g", "g-wait", "wg")),
        busy(WAITER_LEASE, tb + 3)
    );
    assert_eq!(
        lua.hand_over_within("c", tb + 3, "c-release", ("e", "we"), 0),
        vec![1, 0, tb + 4, 1]
    );
    let e_holds = HoldHash {
        x: "c-release,f-release,d-release,b-release,a-release".to_owned(),
        q: lua.line("wg", "g", LEASE, WAITER_LEASE),
        ..handed_over("e", tb + 4, SUCCESSOR_LEASE, "we")
    };
    lua.assert_hold(&e_holds, SUCCESSOR_LEASE, "we's hand-over as the head");
    assert!(lua.inbox_events("e").is_empty(), "e was sent to");
    assert_eq!(
        lua.hand_over_within("c", tb + 3, "c-release", ("e", "we"), 0),
        vec![1, 0, tb + 4, 1]
    );
    assert_eq!(lua.hash(), e_holds, "a re-sent release changed the hold");

    // Limit 0, the head wg (just queued) not the successor: e's release grants to wg.
    assert_eq!(
        lua.hand_over_within("e", tb + 4, "e-release", ("f", "wf"), 0),
        vec![1, 0]
    );
    lua.assert_hold(
        &HoldHash {
            x: "e-release,c-release,f-release,d-release,b-release,a-release".to_owned(),
            ..granted("g", tb + 5, WAITER_LEASE, "wg")
        },
        WAITER_LEASE,
        "wg's grant under limit 0",
    );
    assert_eq!(
        lua.inbox_events("g"),
        [grant("wg", tb + 5, WAITER_LEASE, 0)]
    );
    assert!(lua.inbox_events("f").is_empty(), "f was sent to");
    // c's hand-over, re-sent now that the lock moved on from we: only "released".
    assert_eq!(
        lua.hand_over_within("c", tb + 3, "c-release", ("e", "we"), 0),
        vec![1, 0]
    );

    // Nobody queued: nobody is overdue, even under limit 0; g hands the lock to h ({1, 0,
    // token, 0}). The freed-by chain keeps the newest op ids within 64 bytes.
    assert_eq!(
        lua.hand_over_within("g", tb + 5, "g-release", ("h", "wh"), 0),
        vec![1, 0, tb + 6, 0]
    );
    lua.assert_hold(
        &HoldHash {
            x: "g-release,e-release,c-release,f-release,d-release,b-release".to_owned(),
            ..handed_over("h", tb + 6, SUCCESSOR_LEASE, "wh")
        },
        SUCCESSOR_LEASE,
        "h's hand-over with nobody queued",
    );
    assert!(lua.inbox_events("h").is_empty(), "h was sent to");

    // The successor's own line the only one queued: handed over (limit 0: it is the head),
    // and nobody stays queued ({1, 0, token, 0}); a re-sent release says the same.
    assert_eq!(
        lua.acquire(Ask::waiting("i", "i-wait", "wi")),
        busy(SUCCESSOR_LEASE, tb + 6)
    );
    assert_eq!(lua.hash().q, lua.line("wi", "i", LEASE, WAITER_LEASE));
    assert_eq!(
        lua.hand_over_within("h", tb + 6, "h-release", ("i", "wi"), 0),
        vec![1, 0, tb + 7, 0]
    );
    let i_holds = HoldHash {
        x: "h-release,g-release,e-release,c-release,f-release,d-release".to_owned(),
        ..handed_over("i", tb + 7, SUCCESSOR_LEASE, "wi")
    };
    lua.assert_hold(&i_holds, SUCCESSOR_LEASE, "wi's hand-over, nobody left");
    assert_eq!(
        lua.hand_over_within("h", tb + 6, "h-release", ("i", "wi"), 0),
        vec![1, 0, tb + 7, 0]
    );
    assert!(lua.inbox_events("i").is_empty(), "i was sent to");
    assert_eq!(lua.hash(), i_holds, "a re-sent release changed the hold");

    // A stale holder cannot hand the lock over.
    let before = lua.dump(&[]);
    assert_eq!(
        lua.hand_over("h", tb + 6, "h-again", ("e", "we")),
        vec![-1, 0]
    );
    assert_eq!(lua.dump(&[]), before);

    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// A release naming a successor while the queue's head is overdue grants the lock to the
/// queue, but when nobody there can be granted it (Stream mode: every queued client is dead,
/// its inbox stream missing) the successor takes the lock instead of leaving it free: the
/// reply {1, 0, token, 0} (token max(f + 1, clock)), the hold in the successor's name (its
/// lease, its waiter id as r and g), the dead waiters' lines dropped (q empty). No event is
/// sent and no inbox created; a re-sent release reports the same hand-over.
#[test]
fn a_release_hands_the_lock_to_its_successor_when_the_overdue_queue_has_nobody_alive() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    // b's and c's clients died: no inbox.
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for (owner, waiter) in [("b", "wb"), ("c", "wc")] {
        assert_eq!(
            lua.acquire(Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, t)
        );
    }
    // The head wb has waited the limit; a's token ahead of the clock, so that the next is
    // exactly one above it.
    lua.set_since("wb", lua.clock().div_euclid(1000) - LIMIT);
    let t = lua.push_ahead();
    lua.assert_hold(
        &HoldHash {
            q: [
                lua.line("wb", "b", LEASE, WAITER_LEASE),
                lua.line("wc", "c", LEASE, WAITER_LEASE),
            ]
            .concat(),
            ..held("a", t, LEASE, "a-take")
        },
        LEASE,
        "wb (overdue) and wc queued",
    );

    assert_eq!(
        lua.hand_over("a", t, "a-release", ("s", "ws")),
        vec![1, 0, t + 1, 0]
    );
    let s_holds = HoldHash {
        x: "a-release".to_owned(),
        ..handed_over("s", t + 1, SUCCESSOR_LEASE, "ws")
    };
    lua.assert_hold(
        &s_holds,
        SUCCESSOR_LEASE,
        "s took the lock: nobody alive queued",
    );
    assert!(
        lua.pttl() > WAITER_LEASE,
        "the successor's lease, not a grant's"
    );
    assert!(
        server.keys(&format!("{EVENTS}:to:*")).is_empty(),
        "an inbox was created or sent to"
    );

    // The release, re-sent: the same hand-over, nothing changed.
    let before = lua.dump(&[]);
    assert_eq!(
        lua.hand_over("a", t, "a-release", ("s", "ws")),
        vec![1, 0, t + 1, 0]
    );
    assert_eq!(lua.dump(&[]), before, "a re-sent release changed a key");
    assert_eq!(lua.hash(), s_holds);

    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// A take-over (`lua/hold_release.lua` with `ARGV[14]` set: the successor asks by this very
/// call) when the queue's head has waited the limit: the release grants the lock to the head
/// (its grant ms, the next token, grant event in its inbox) and the successor joins the queue
/// behind it, as a busy `hold_acquire` would: its line (its waiter id, its client's inbox tag,
/// its owner, its lease, grant ms = max(min(its lease, `ARGV[14]`), 0), since = the server
/// clock) appended to what is left of the queue; the reply is the busy reply of
/// `hold_acquire` behind the granted holder, {2, its grant ms, its token}. The successor's
/// line is written with the grant, so the grant event's queued flag counts it (1 even when
/// nobody else was queued). A re-sent release (same op id) changes nothing and is answered
/// only "released" ({1, 0}: the hold is not the successor's). The next release grants the
/// lock to the successor's line (grant event in its client's inbox). A hold granted from the
/// queue (`t` = "1") is handed to its take-over all the same, once, unless the head has waited
/// twice the limit: the release after that grants again. A successor whose waiter id is queued already keeps its line (and its since)
/// and gets no second one.
#[test]
fn a_take_over_joins_the_queue_behind_the_head_that_waited_the_limit() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "c", "e", "g", "s"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait", "wb")),
        busy(LEASE, t)
    );
    // The head wb has waited the limit; a's token ahead of the clock, so that the tokens from
    // here on are exactly one above the last.
    lua.set_since("wb", lua.clock().div_euclid(1000) - LIMIT);
    let t = lua.push_ahead();

    // a's release, taken over by s (waiter ws, grant ms 3000): wb is granted the lock, ws
    // queues behind it.
    assert_eq!(
        lua.take_over("a", t, "a-release", ("s", "ws"), 3_000),
        vec![2, WAITER_LEASE, t + 1]
    );
    let s_line = lua.line("ws", "s", SUCCESSOR_LEASE, 3_000);
    let b_holds = HoldHash {
        x: "a-release".to_owned(),
        q: s_line.clone(),
        i: String::new(),
        ..granted("b", t + 1, WAITER_LEASE, "wb")
    };
    lua.assert_hold(&b_holds, WAITER_LEASE, "wb's grant, ws queued behind it");
    assert_eq!(
        lua.hash().q.split(' ').count(),
        6,
        "one line of six columns"
    );
    assert_eq!(
        lua.inbox_events("b"),
        [grant("wb", t + 1, WAITER_LEASE, 1)],
        "the queued flag counts ws's line, written with the grant"
    );
    assert!(lua.inbox_events("s").is_empty(), "s was sent to");

    // The release, re-sent: answered as the first time (ws queued behind b's grant), nothing
    // changed (no second line for ws).
    let before = lua.dump(&[&inbox("b"), &inbox("s")]);
    assert_eq!(
        lua.take_over("a", t, "a-release", ("s", "ws"), 3_000),
        vec![2, WAITER_LEASE, t + 1]
    );
    assert_eq!(
        lua.dump(&[&inbox("b"), &inbox("s")]),
        before,
        "a re-sent release changed a key"
    );
    assert_eq!(lua.hash(), b_holds);

    // b's release grants the lock to ws, for its grant ms; nobody is left queued.
    assert_eq!(lua.release("b", t + 1, "b-release"), vec![1, 0]);
    let s_holds = HoldHash {
        x: "b-release,a-release".to_owned(),
        ..granted("s", t + 2, 3_000, "ws")
    };
    lua.assert_hold(&s_holds, 3_000, "ws's grant");
    assert_eq!(lua.inbox_events("s"), [grant("ws", t + 2, 3_000, 0)]);

    // c (the head, overdue) and g queue. s's hold is the queue's turn (a grant): its release,
    // taken over by e, hands e the lock all the same, once; wc's and wg's lines stay. (A
    // take-over's successor is never queued: it asks by this call, before any attempt.)
    for (owner, waiter, lease) in [("c", "wc", LEASE), ("g", "wg", SUCCESSOR_LEASE)] {
        let op = format!("{owner}-wait");
        let ask = Ask::waiting(owner, &op, waiter).lease(lease);
        assert_eq!(lua.acquire(ask), busy(3_000, t + 2));
    }
    lua.set_since("wc", lua.clock().div_euclid(1000) - LIMIT);
    let wc_line = lua.line("wc", "c", LEASE, WAITER_LEASE);
    let wg_line = lua.line("wg", "g", SUCCESSOR_LEASE, WAITER_LEASE);
    assert_eq!(
        lua.take_over("s", t + 2, "s-release", ("e", "we"), 3_000),
        vec![1, 0, t + 3, 2]
    );
    lua.assert_hold(
        &HoldHash {
            x: "s-release,b-release,a-release".to_owned(),
            q: [wc_line.as_str(), wg_line.as_str()].concat(),
            ..handed_over("e", t + 3, SUCCESSOR_LEASE, "we")
        },
        SUCCESSOR_LEASE,
        "we's hand-over after a grant, wc overdue",
    );

    // e's hold was handed over: its release, taken over by g (queued, not the head), grants
    // the lock to the overdue wc; wg's line stays as it was (its since too) and no second one
    // is added.
    assert_eq!(
        lua.take_over("e", t + 3, "e-release", ("g", "wg"), 3_000),
        vec![2, WAITER_LEASE, t + 4]
    );
    lua.assert_hold(
        &HoldHash {
            x: "e-release,s-release,b-release,a-release".to_owned(),
            q: wg_line,
            i: String::new(),
            ..granted("c", t + 4, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "wc's grant, wg's line kept as it was",
    );
    assert_eq!(lua.inbox_events("c"), [grant("wc", t + 4, WAITER_LEASE, 1)]);
    for owner in ["e", "g"] {
        assert!(lua.inbox_events(owner).is_empty(), "{owner} was sent to");
    }

    // wc's hold is a grant too, but the head wg has waited twice the limit: c's release,
    // taken over by e (a new waiter, we2), grants the lock to wg and queues we2 behind it.
    lua.set_since("wg", lua.clock().div_euclid(1000) - 2 * LIMIT);
    assert_eq!(
        lua.take_over("c", t + 4, "c-release", ("e", "we2"), 3_000),
        vec![2, WAITER_LEASE, t + 5]
    );
    lua.assert_hold(
        &HoldHash {
            x: "c-release,e-release,s-release,b-release,a-release".to_owned(),
            q: lua.line("we2", "e", SUCCESSOR_LEASE, 3_000),
            i: String::new(),
            ..granted("g", t + 5, WAITER_LEASE, "wg")
        },
        WAITER_LEASE,
        "wg's grant after a grant: it waited twice the limit",
    );
    assert_eq!(lua.inbox_events("g"), [grant("wg", t + 5, WAITER_LEASE, 1)]);
    assert!(lua.inbox_events("e").is_empty(), "e was sent to");

    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// A waiter's queue member holds nothing that changes between the attempts of its
/// acquisition, so a repeated attempt (a later one, or a call re-sent after a broken
/// connection) keeps its place and adds nobody; and a queue that outlived its hold (the hash
/// expired first) goes with the next take, whose waiters queue again when they look.
#[test]
fn a_repeated_attempt_keeps_its_place_and_a_take_clears_a_queue_its_hold_left() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    for (owner, op, waiter) in [("b", "b-wait", "wb"), ("c", "c-wait", "wc")] {
        assert_eq!(lua.acquire(Ask::waiting(owner, op, waiter)), busy(LEASE, t));
    }
    let queue = format!(
        "{}{}",
        lua.line("wb", "b", LEASE, WAITER_LEASE),
        lua.line("wc", "c", LEASE, WAITER_LEASE)
    );
    for op in ["b-wait", "b-again"] {
        assert_eq!(lua.acquire(Ask::waiting("b", op, "wb")), busy(LEASE, t));
        assert_eq!(lua.queue_of(HOLD), queue, "{op}");
    }
    assert_eq!(lua.hash().q, queue);

    // The hash goes (as if it expired before the queue): the next take clears the queue.
    server.cmd(&["DEL", HOLD]);
    let taken = lua.acquire(Ask::once("d", "d-take"));
    assert_eq!(taken[0], 1, "{taken:?}");
    assert!(!exists(&server, QUEUE), "the queue went with the take");
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-back", "wb")),
        busy(LEASE, taken[1])
    );
    assert_eq!(lua.hash().q, lua.line("wb", "b", LEASE, WAITER_LEASE));
}

/// A release that names a floor (the last token its client issued for the hold within its
/// process, by hand-overs without a call) continues the lock's tokens above it: the tombstone
/// keeps the floor as its token, so the next take goes above it, and a hand-over's token goes
/// above it too. A floor at or below the hold's token changes nothing, and a release of another
/// hold (a stale token) is refused whatever floor it names.
#[test]
fn a_release_naming_a_floor_continues_the_tokens_above_it() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");

    // Freed with a floor 5 s ahead of the clock: only the floor can put the next token there.
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let floor = t + 5_000_000;
    let released = lua.release_with_floor("a", t, Some(floor), "a-release", false, None);
    assert_eq!(ints(released), vec![1, 0]);
    let freed = tombstone(floor, LEASE, "a-release", "a-release");
    lua.assert_hold(&freed, WINDOW, "the tombstone carries the floor");
    let next = lua.acquire(Ask::once("b", "b-take"))[1];
    assert_eq!(next, floor + 1, "the next take continues above the floor");

    // A stale token is refused, whatever the floor; nothing changes.
    let before = lua.dump(&[]);
    let stale = lua.release_with_floor("b", next - 1, Some(next + 10), "b-stale", false, None);
    assert_eq!(ints(stale), vec![-1, 0]);
    assert_eq!(lua.dump(&[]), before, "a refused release changed a key");

    // Handed over to a task of the releasing process, with a floor: its token goes above.
    let floor = next + 5_000_000;
    let to = Successor {
        owner: "c",
        waiter: "c-wait",
        limit: LIMIT,
        queues: None,
    };
    let handed = ints(lua.release_with_floor("b", next, Some(floor), "b-release", false, Some(to)));
    assert_eq!(handed, vec![1, 0, floor + 1, 0]);
    let expected = HoldHash {
        x: "b-release,a-release".to_owned(),
        ..handed_over("c", floor + 1, SUCCESSOR_LEASE, "c-wait")
    };
    assert_eq!(lua.hash(), expected);

    // A floor below the hold's token: the tombstone keeps the hold's own.
    let c = floor + 1;
    let released = lua.release_with_floor("c", c, Some(c - 7), "c-release", false, None);
    assert_eq!(ints(released), vec![1, 0]);
    let x = "c-release,b-release,a-release";
    lua.assert_hold(
        &tombstone(c, SUCCESSOR_LEASE, "c-release", x),
        WINDOW,
        "the hold's token",
    );
}

/// The `held` notice (`hold_acquire.lua`, `ARGV[10]`; field `i` of `lib/hold.lua`). A take
/// that asks for it keeps its client's inbox tag in `i`; the join that queues the hold's first
/// waiter sends that client `0|held|<token>|<lock id>` and clears `i`, so a later waiter, or
/// one that queues again after the queue emptied, sends nothing more for this hold. A try
/// (which never queues) sends nothing; nor does a hold taken without asking. A hand-over
/// passes `i` to the successor's client (a task of the releasing process); a grant that leaves
/// nobody queued gives it to the grantee's client (one that leaves waiters clears it).
#[test]
fn the_first_waiter_behind_a_hold_tells_its_holders_client_once() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["a", "b", "c", "d"]);
    let held_notice = |token: i64| format!("0|held|{token}|{LOCK_ID}");

    // Not asked: a waiter behind the hold tells nobody.
    let t = lua.acquire(Ask::once("d", "d-take"))[1];
    assert_eq!(lua.hash(), held("d", t, LEASE, "d-take"));
    assert_eq!(lua.acquire(Ask::waiting("b", "b-0", "wb0")), busy(LEASE, t));
    assert_eq!(lua.leave("wb0"), vec![1]);
    assert_eq!(lua.release("d", t, "d-free"), vec![1, 0]);
    assert!(lua.inbox_events("d").is_empty(), "d did not ask");

    // Asked: a try tells nobody, the first waiter tells a's client once.
    let t = lua.acquire(Ask::once("a", "a-take").notice())[1];
    let taken = HoldHash {
        i: tag("a"),
        x: "d-free".to_owned(),
        ..held("a", t, LEASE, "a-take")
    };
    assert_eq!(lua.hash(), taken);
    assert_eq!(lua.acquire(Ask::once("b", "b-try")), busy(LEASE, t));
    assert!(lua.inbox_events("a").is_empty(), "a try queues nobody");
    assert_eq!(lua.acquire(Ask::waiting("b", "b-1", "wb")), busy(LEASE, t));
    assert_eq!(lua.inbox_events("a"), vec![held_notice(t)]);
    assert_eq!(lua.hash().i, "", "told once: i is cleared");
    assert_eq!(lua.acquire(Ask::waiting("c", "c-1", "wc")), busy(LEASE, t));
    assert_eq!(lua.leave("wb"), vec![1]);
    assert_eq!(lua.leave("wc"), vec![1]);
    assert_eq!(lua.acquire(Ask::waiting("c", "c-2", "wc")), busy(LEASE, t));
    assert_eq!(
        lua.inbox_events("a"),
        vec![held_notice(t)],
        "one notice per hold, however often its queue fills again"
    );

    // A grant that leaves nobody queued gives i to the grantee's client: it hears of the first
    // waiter that queues behind the granted hold, once.
    assert_eq!(lua.release("a", t, "a-free"), vec![1, 0]);
    let granted_token = lua.token();
    assert_eq!(lua.hash().i, tag("c"));
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-2", "wb2")),
        busy(WAITER_LEASE, granted_token)
    );
    let notices = |owner: &str| -> Vec<String> {
        let events = lua.inbox_events(owner);
        events
            .into_iter()
            .filter(|e| e.contains("|held|"))
            .collect()
    };
    assert_eq!(notices("c"), vec![held_notice(granted_token)]);
    assert_eq!(lua.hash().i, "", "told once: i is cleared");

    // A hand-over passes i to the successor's client, which hears of the next first waiter.
    let handed = lua.hand_over("c", granted_token, "c-free", ("c", "wc-next"));
    assert_eq!((handed[0], handed[1]), (1, 0), "{handed:?}");
    assert_eq!(lua.hash().i, tag("c"));
    assert_eq!(lua.leave("wb2"), vec![1]);
    let next = lua.token();
    assert_eq!(
        lua.acquire(Ask::waiting("d", "d-1", "wd")),
        busy(SUCCESSOR_LEASE, next)
    );
    assert_eq!(
        lua.inbox_events("c").last(),
        Some(&held_notice(next)),
        "the handed hold's notice names its own token"
    );
    lua.assert_no_stray_keys();
}

/// A hand-over reply `{1, 0, token, queued, quiet}` whose quiet ms (when the queue's first
/// waiter other than the successor will be due) is `expected`, less what the test's own calls
/// took (at most 5 s on a loaded machine).
fn assert_quiet(reply: &[i64], expected: i64) {
    assert_eq!(reply.len(), 5, "no quiet ms in {reply:?}");
    assert!(
        reply[4] > expected - 5_000 && reply[4] <= expected,
        "quiet ms {} against about {expected}: {reply:?}",
        reply[4]
    );
}
