//! The fence key's rules, renewal, the heartbeat's read-only check, foreign values and the inbox
//! keeper, for the exclusive locks' scripts and the read-write lock's.

use crate::lua::*;
use crate::support::*;

/// The fence key (`lua/lib/fence.lua`) is read only by a take of a lock with no hash: missing
/// (unless the call may create it) or stamped with another layout, the take is refused and
/// nothing changes; a foreign string there is WRONGTYPE; otherwise the token is max(last + 1,
/// server clock in us). A take from a tombstone, a re-entry and a busy attempt never read it
/// (whatever it holds), and continue the lock's token (max(f + 1, clock)).
#[test]
fn only_a_take_of_a_lock_with_no_hash_reads_the_fence_key() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");

    let refused = lua.attempt(Ask::once("a", "a-take"), &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(lua.dump(&[]), vec![None; 5], "a key was written");
    server.cmd(&["SET", FENCE, &format!("17|{OTHER_LAYOUT}")]);
    let stamped = lua.dump(&[]);
    for create in [false, true] {
        let refused = lua.attempt(Ask::waiting("a", "a-take", "wa"), &fence_arg(create));
        let expected = format!("FLFENCE layout {OTHER_LAYOUT}");
        assert_eq!(
            refused.error_message(),
            Some(expected.as_str()),
            "{refused:?}"
        );
        assert_eq!(lua.dump(&[]), stamped, "a key changed");
    }
    server.cmd(&["DEL", FENCE]);

    // The shard's first token: the server clock.
    let clock = server_micros(&server);
    let taken = lua.acquire(Ask::once("a", "a-take"));
    let t = taken[1];
    assert!(t >= clock, "token {t} below the clock {clock}");
    assert_eq!(fence_value(&server, FENCE), (t as u64, LAYOUT.to_owned()));
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);

    // From the tombstone, whatever the fence key holds (missing, another layout, a foreign
    // value), the token continues and the fence key is left as it is.
    let mut token = t;
    let mut freed_by = vec!["a-release".to_owned()];
    for (n, value) in fence_states(t).into_iter().enumerate() {
        set_fence(&server, value.as_deref());
        let fence = snapshot(&server, FENCE);
        // Op ids are unique per call (a reused one would be answered as a retry).
        let owner = format!("b{n}");
        let op = |what: &str| format!("{owner}-{what}");
        let clock = lua.clock();
        let taken = ints(lua.attempt(Ask::once(&owner, &op("take")), &fence_arg(false)));
        assert_eq!((taken[0], taken[2]), (1, 1), "fence {value:?}: {taken:?}");
        assert_drawn(taken[1], token, clock, &format!("fence {value:?}"));
        token = taken[1];
        // A re-entry and a busy attempt (that queues) do not read it either.
        assert_eq!(
            ints(lua.attempt(Ask::once(&owner, &op("again")), &fence_arg(false))),
            vec![1, token, 2]
        );
        assert_eq!(
            ints(lua.attempt(Ask::waiting("w", &op("wait"), "ww"), &fence_arg(false))),
            busy(LEASE, token)
        );
        assert_eq!(snapshot(&server, FENCE), fence, "fence {value:?} changed");
        assert_eq!(
            lua.release_raw(&owner, token, &op("release"), true, None),
            ints_of(&[1, 0])
        );
        // Nobody alive in the queue (w has no inbox): freed again, with the token drawn for
        // w's grant (the hold written in w's name, then overwritten by the free).
        freed_by.insert(0, op("release"));
        let drawn = lua.token();
        assert!(
            drawn > token,
            "fence {value:?}: token {drawn} after {token}"
        );
        lua.assert_hold(
            &tombstone(drawn, WAITER_LEASE, &op("release"), &freed_by.join(",")),
            WINDOW,
            &format!("fence {value:?}: freed"),
        );
        token = drawn;
    }

    // With the hash gone (expired), a take reads the fence key again: foreign strings (not
    // "<last>|<layout>", with last a whole number in decimal digits without a leading zero:
    // tokens are compared as text, lib/fence.lua) and values of another type are WRONGTYPE,
    // and nothing changes.
    server.cmd(&["DEL", HOLD]);
    for value in [
        "hello",
        "12",
        "x12|stamp",
        "|stamp",
        "007|stamp",
        "-5|stamp",
        "1.5|stamp",
        "1e3|stamp",
        " 12|stamp",
    ] {
        let value = value.replace("stamp", LAYOUT);
        server.cmd(&["SET", FENCE, &value]);
        let before = lua.dump(&[]);
        assert_wrongtype(
            &lua.attempt(Ask::once("c", "c-take"), &fence_arg(true)),
            &format!("fence {value:?}"),
        );
        assert_eq!(lua.dump(&[]), before, "fence {value:?}: a key changed");
    }
    server.cmd(&["DEL", FENCE]);
    server.cmd(&["RPUSH", FENCE, "planted"]);
    let before = lua.dump(&[]);
    assert_wrongtype(
        &lua.attempt(Ask::once("c", "c-take"), &fence_arg(true)),
        "a list at the fence key",
    );
    assert_eq!(
        lua.dump(&[]),
        before,
        "a list at the fence key: a key changed"
    );

    // A last token ahead of the clock: last + 1. Behind it: the clock.
    server.cmd(&["DEL", FENCE]);
    let ahead: i64 = 5_000_000_000_000_000;
    server.cmd(&["SET", FENCE, &format!("{ahead}|{LAYOUT}")]);
    assert_eq!(
        ints(lua.attempt(Ask::once("c", "c-take"), &fence_arg(false))),
        vec![1, ahead + 1, 1]
    );
    assert_eq!(
        fence_value(&server, FENCE),
        ((ahead + 1) as u64, LAYOUT.to_owned())
    );
    for (n, last) in ["100", "0"].into_iter().enumerate() {
        server.cmd(&["DEL", HOLD]);
        server.cmd(&["SET", FENCE, &format!("{last}|{LAYOUT}")]);
        let clock = server_micros(&server);
        let taken = ints(lua.attempt(Ask::once("d", &format!("d-take-{n}")), &fence_arg(false)));
        assert!(
            taken[1] >= clock,
            "last {last}: {taken:?} below the clock {clock}"
        );
        assert_eq!(
            fence_value(&server, FENCE),
            (taken[1] as u64, LAYOUT.to_owned())
        );
    }
    lua.assert_no_stray_keys();
}

/// `hold_renew.lua`, a batch over holds of one slot: a renewal of the holder (owner and token
/// match) sets field `l` and the hold's ttl to the new lease (longer or shorter), so that busy
/// attempts are given it as their bound; lease 0 only checks. A free lock (no hash, or a
/// tombstone) is 0, another owner -1, the same owner under another token -2: neither changes
/// or creates anything.
#[test]
fn hold_renew_sets_the_lease_field_and_the_ttl() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let renew_script = hold_renew_script();
    let other = "{t:0}:mutex:y";
    let renew = |lease: i64, holds: &[(&str, &str, i64)]| {
        let lease = lease.to_string();
        let tokens: Vec<String> = holds.iter().map(|(_, _, t)| t.to_string()).collect();
        let queues: Vec<String> = holds.iter().map(|(key, _, _)| queue_key(key)).collect();
        let keys: Vec<&str> = holds
            .iter()
            .zip(&queues)
            .flat_map(|((key, _, _), queue)| [*key, queue.as_str()])
            .collect();
        let mut args = vec![lease.as_str()];
        for ((_, owner, _), token) in holds.iter().zip(&tokens) {
            args.push(owner);
            args.push(token);
        }
        ints(eval(&server, &renew_script, &keys, &args))
    };

    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    assert_eq!(renew(2 * LEASE, &[(HOLD, "a", t), (other, "a", t)]), [1, 0]);
    let renewed = held("a", t, 2 * LEASE, "a-take");
    lua.assert_hold(&renewed, 2 * LEASE, "renewed for twice the lease");
    assert!(lua.pttl() > LEASE, "the ttl was not pushed forward");
    assert!(!exists(&server, other), "the renewal created a hold");
    assert_eq!(
        lua.acquire(Ask::once("b", "b-try")),
        busy(2 * LEASE, t),
        "the bound is the renewed lease"
    );

    // A shorter lease shortens the hold.
    assert_eq!(renew(2_000, &[(HOLD, "a", t)]), [1]);
    lua.assert_hold(
        &held("a", t, 2_000, "a-take"),
        2_000,
        "renewed for a shorter lease",
    );
    // Lease 0 checks only; the refusals change nothing.
    let before = lua.dump(&[]);
    assert_eq!(renew(0, &[(HOLD, "a", t)]), [1]);
    assert_eq!(
        renew(
            LEASE,
            &[(HOLD, "b", t), (HOLD, "a", t - 1), (other, "a", t)]
        ),
        [-1, -2, 0]
    );
    assert_eq!(lua.dump(&[]), before, "a check or a refusal changed a key");
    assert!(lua.pttl() <= 2_000, "a check or a refusal pushed the ttl");

    // With a waiter queued, a renewal that takes the hold past its queue's end extends the
    // queue too (to twice the lease), and one that stays within it leaves the queue alone.
    assert_eq!(
        lua.acquire(Ask::waiting("b", "b-wait", "wb")),
        busy(2_000, t)
    );
    let queue_ttl = || server.cmd(&["PTTL", QUEUE]).as_int();
    assert!(
        queue_ttl() <= 4_000,
        "a new queue lasts twice l: {}",
        queue_ttl()
    );
    assert_eq!(renew(3 * LEASE, &[(HOLD, "a", t)]), [1]);
    lua.assert_queue_outlives_the_hold();
    assert!(
        queue_ttl() > 5 * LEASE,
        "extended to twice the lease: {}",
        queue_ttl()
    );
    let extended = queue_ttl();
    assert_eq!(renew(LEASE, &[(HOLD, "a", t)]), [1]);
    lua.assert_queue_outlives_the_hold();
    assert!(
        queue_ttl() <= extended,
        "a renewal within the queue's end extended the queue"
    );
    assert_eq!(lua.leave("wb"), vec![1]);

    // A tombstone is a free lock: 0, unchanged.
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let before = lua.dump(&[]);
    assert_eq!(renew(LEASE, &[(HOLD, "a", t)]), [0]);
    assert_eq!(
        lua.dump(&[]),
        before,
        "a renewal of a free lock changed a key"
    );
    assert!(lua.pttl() <= WINDOW, "the tombstone's ttl was pushed");
    assert!(!exists(&server, other), "the renewal created a hold");
    lua.assert_no_stray_keys();
}

/// `hold_heartbeat.lua`, read only, a batch over the locks of one slot: per waiter id, 1 when
/// its line is in the lock's queue or the lock is granted or handed to it (held, `g` = its
/// id), else 0: an id only prefixing a queued one, an op id in `r`, a waiter of another lock,
/// a former grantee once the lock moved on or was freed (a tombstone), every waiter of a lock
/// whose hash expired or was deleted (its queue went with it), a lock with no hash. Several
/// locks and several waiters in one call, a lock with no id, a key given twice. No call writes,
/// creates or refreshes a key; a foreign value at any hold key is WRONGTYPE.
#[test]
fn hold_heartbeat_finds_queued_and_granted_waiters_and_writes_nothing() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "c", "f", "k", "n"]);
    const Y: &str = "{t:0}:mutex:y";
    const Z: &str = "{t:0}:mutex:z";
    const GONE: &str = "{t:0}:mutex:gone";
    // hold_acquire and hold_release on lock y or z: the same scripts on that lock's keys.
    let acquire_on = |hold: &str, ask: Ask| ints(lua.attempt_on(hold, ask, &fence_arg(true)));
    let release_on = |hold: &str, owner: &str, token: i64, op: &str, to: (&str, &str)| {
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let (lease, limit) = (SUCCESSOR_LEASE.to_string(), LIMIT.to_string());
        let lock_id = hold.trim_start_matches("{t:0}:");
        ints(lua.eval(
            &lua.release,
            &[hold, &queue_key(hold), FENCE, EVENTS],
            &[
                owner, &token, op, "0", &window, "stream", "1000", lock_id, to.0, to.1, &lease,
                &limit,
            ],
        ))
    };
    // Every key, its DUMP and its ttl: a heartbeat changes none (a ttl only runs down).
    let state = || {
        let keys = server.keys("*");
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let dumps = dump_keys(&server, &refs);
        let ttls: Vec<i64> = refs
            .iter()
            .map(|key| server.cmd(&["PTTL", key]).as_int())
            .collect();
        (keys, dumps, ttls)
    };
    let unchanged = |before: (Vec<String>, Vec<Option<Vec<u8>>>, Vec<i64>), what: &str| {
        let (keys, dumps, ttls) = state();
        assert_eq!(keys, before.0, "{what}: the keys changed");
        assert_eq!(dumps, before.1, "{what}: a key's value changed");
        for ((key, ttl), was) in keys.iter().zip(&ttls).zip(&before.2) {
            assert!(
                (*was == -1 && *ttl == -1) || (*was > 0 && *ttl > 0 && ttl <= was),
                "{what}: {key}'s ttl went from {was} to {ttl}"
            );
        }
    };
    let beat = |locks: &[(&str, &[&str])], what: &str| {
        let before = state();
        let codes = ints(lua.heartbeat_raw(locks));
        unchanged(before, what);
        codes
    };

    // Lock x: a holds it (a take: granted to nobody), wb and wc queued.
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    for (owner, waiter) in [("b", "wb"), ("c", "wc")] {
        assert_eq!(
            lua.acquire(Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, t)
        );
    }
    assert_eq!(
        beat(&[(HOLD, &["wb", "wc", "w", "a-take", "wz"])], "x queued"),
        [1, 1, 0, 0, 0]
    );
    // No hash at all (y not yet used): 0, and nothing created.
    assert_eq!(beat(&[(Y, &["wf", "wb"])], "y missing"), [0, 0]);

    // a's release grants x to wb (wc stays queued); another task of b re-enters (r is its op).
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tb = lua.token();
    assert_eq!(lua.acquire(Ask::once("b", "b-inner")), vec![1, tb, 2]);
    lua.assert_hold(
        &HoldHash {
            c: "2".to_owned(),
            l: LEASE.to_string(),
            r: "b-inner".to_owned(),
            x: "a-release".to_owned(),
            q: lua.line("wc", "c", LEASE, WAITER_LEASE),
            i: String::new(),
            ..granted("b", tb, WAITER_LEASE, "wb")
        },
        LEASE,
        "wb's grant, re-entered",
    );

    // Lock y: e holds it, wf and wk queued; e hands it over to h (wh, never queued).
    let te = acquire_on(Y, Ask::once("e", "e-take"))[1];
    for (owner, waiter) in [("f", "wf"), ("k", "wk")] {
        assert_eq!(
            acquire_on(Y, Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, te)
        );
    }
    // The hand-over reply: {1, 0, token, 2} (wf and wk stay queued).
    let handed = release_on(Y, "e", te, "e-release", ("h", "wh"));
    assert_eq!(
        (handed.len(), handed[0], handed[1], handed[3]),
        (5, 1, 0, 2),
        "{handed:?}"
    );
    assert!(handed[2] > te, "h's token {} after {te}", handed[2]);
    // Lock z: m holds it, wn queued; m's release grants it to wn.
    let tm = acquire_on(Z, Ask::once("m", "m-take"))[1];
    assert_eq!(
        acquire_on(Z, Ask::waiting("n", "n-wait", "wn")),
        busy(LEASE, tm)
    );
    assert_eq!(release_on(Z, "m", tm, "m-release", ("", "")), vec![1, 0]);
    assert_eq!(hold_owner(&server, Z).as_deref(), Some("n"));
    let tn = server.cmd(&["HGET", Z, "f"]).as_str().expect("z's token");
    assert_eq!(
        lua.inbox_events("n"),
        [format!("0|grant|wn,{tn},{WAITER_LEASE},0|mutex:z")]
    );

    // One call over every lock, several waiters each, a lock with no id, a key twice, a lock
    // with no hash: granted (wb, wh, wn) and queued (wc, wf, wk) are 1; r's op ids, waiters of
    // another lock, unknown ids 0.
    assert_eq!(
        beat(
            &[
                (HOLD, &["wb", "b-inner", "wc", "wf", "wz"]),
                (Y, &["wf", "wh", "wb", "e-release", "wk"]),
                (GONE, &[]),
                (Z, &["wn", "wc", "m-release"]),
                (GONE, &["wb", "wn"]),
                (HOLD, &["wc"]),
            ],
            "every lock"
        ),
        [1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    );

    // b's releases: the second grants x to wc; wb is 0 from then on. c's release frees x (a
    // tombstone, granted to nobody): wc is 0 too.
    assert_eq!(lua.release("b", tb, "b-release-1"), vec![1, 1]);
    assert_eq!(beat(&[(HOLD, &["wb", "wc"])], "x counted down"), [1, 1]);
    assert_eq!(lua.release("b", tb, "b-release-2"), vec![1, 0]);
    let tc = lua.token();
    assert_eq!(hold_owner(&server, HOLD).as_deref(), Some("c"));
    assert_eq!(beat(&[(HOLD, &["wb", "wc"])], "x granted to wc"), [0, 1]);
    assert_eq!(lua.release("c", tc, "c-release"), vec![1, 0]);
    lua.assert_hold(
        &tombstone(
            tc,
            WAITER_LEASE,
            "c-release",
            "c-release,b-release-2,a-release",
        ),
        WINDOW,
        "x freed",
    );
    assert_eq!(beat(&[(HOLD, &["wb", "wc", ""])], "x freed"), [0, 0, 0]);

    // y's hash expires (the hand-over lapsed; the queue with it); z's is deleted. Nothing
    // is created for them.
    server.cmd(&["PEXPIRE", Y, "1"]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    server.cmd(&["DEL", Z]);
    assert_eq!(
        beat(
            &[(Y, &["wh", "wf", "wk"]), (Z, &["wn"]), (HOLD, &["wb"])],
            "y expired, z deleted"
        ),
        [0, 0, 0, 0, 0]
    );
    for key in [Y, Z, GONE] {
        assert!(!exists(&server, key), "{key} was created");
    }

    // A foreign value at one hold key of the batch: WRONGTYPE, nothing changed.
    server.cmd(&["SET", GONE, "planted"]);
    let before = state();
    assert_wrongtype(
        &lua.heartbeat_raw(&[(HOLD, &["wc"]), (GONE, &["wb"])]),
        "a string at the second hold key",
    );
    unchanged(before, "a string at the second hold key");
    lua.assert_no_stray_keys();
}

/// A foreign value at the hold key (another type than a hash): every hold script (and the
/// renewal and inspection that read the hold) fails with WRONGTYPE before writing anything,
/// and the foreign value, the fence key and the inboxes stay as they are.
#[test]
fn hold_scripts_refuse_a_foreign_value_at_the_hold_key_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let renew = hold_renew_script();
    let inspect = hold_inspect_script();
    lua.open_inboxes(&["b"]);
    server.cmd(&["SET", FENCE, &format!("17|{LAYOUT}")]);
    let inbox_b = inbox("b");
    for kind in ["string", "list", "set", "zset", "stream"] {
        server.cmd(&["DEL", HOLD]);
        plant(&server, HOLD, kind);
        let before = lua.dump(&[&inbox_b]);
        let calls = [
            (
                "take",
                lua.attempt(Ask::once("a", "a-take"), &fence_arg(true)),
            ),
            (
                "waiting attempt",
                lua.attempt(Ask::waiting("b", "b-wait", "wb"), &fence_arg(true)),
            ),
            ("release", lua.release_raw("a", 17, "a-rel", false, None)),
            (
                "hand-over",
                lua.release_raw("a", 17, "a-rel", false, Some(("b", "wb"))),
            ),
            ("leave", lua.leave_raw("wb")),
            ("force unlock", lua.force_raw()),
            ("heartbeat", lua.heartbeat_raw(&[(HOLD, &["wb"])])),
            (
                "renew",
                server.cmd(&["EVAL", &renew, "2", HOLD, QUEUE, "30000", "a", "17"]),
            ),
            ("inspect", server.cmd(&["EVAL", &inspect, "1", HOLD])),
        ];
        for (call, reply) in calls {
            let what = format!("{call} with a {kind} at the hold key");
            assert_wrongtype(&reply, &what);
            assert_eq!(lua.dump(&[&inbox_b]), before, "{what}: a key changed");
        }
    }
}

/// A foreign value at an exclusive lock's queue key (another type than a sorted set): every
/// call that queues a waiter, grants, looks for a waiter or renews through the queue fails with
/// WRONGTYPE before writing anything, and the foreign value, the hold and the inboxes stay as
/// they are. A take of a lock with no hash, which clears a queue left behind, refuses too.
#[test]
fn hold_scripts_refuse_a_foreign_value_at_the_queue_key_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    let renew = hold_renew_script();
    lua.open_inboxes(&["b"]);
    let inbox_b = inbox("b");
    for kind in ["string", "list", "set", "stream"] {
        server.cmd(&["DEL", HOLD, QUEUE]);
        let t = lua.acquire(Ask::once("a", "a-take"))[1].to_string();
        plant(&server, QUEUE, kind);
        // As if a waiter had queued before the foreign value replaced the queue.
        server.cmd(&["HSET", HOLD, "q", "1"]);
        let before = lua.dump(&[&inbox_b]);
        let calls = [
            (
                "waiting attempt",
                lua.attempt(Ask::waiting("b", "b-wait", "wb"), &fence_arg(true)),
            ),
            ("leave", lua.leave_raw("wb")),
            ("force unlock", lua.force_raw()),
            ("heartbeat", lua.heartbeat_raw(&[(HOLD, &["wb"])])),
            (
                "renew",
                server.cmd(&["EVAL", &renew, "2", HOLD, QUEUE, "30000", "a", &t]),
            ),
        ];
        for (call, reply) in calls {
            let what = format!("{call} with a {kind} at the queue key");
            assert_wrongtype(&reply, &what);
            assert_eq!(lua.dump(&[&inbox_b]), before, "{what}: a key changed");
        }
        let held = lua.release_raw("a", t.parse().expect("a token"), "a-rel", false, None);
        assert_wrongtype(
            &held,
            &format!("the holder's release with a {kind} at the queue key"),
        );
        assert_eq!(
            lua.dump(&[&inbox_b]),
            before,
            "the holder's release: a key changed"
        );

        server.cmd(&["DEL", HOLD]);
        let before = lua.dump(&[&inbox_b]);
        let take = lua.attempt(Ask::once("c", "c-take"), &fence_arg(true));
        assert_wrongtype(
            &take,
            &format!("a take of a lock with no hash and a {kind} queue"),
        );
        assert_eq!(lua.dump(&[&inbox_b]), before, "the take: a key changed");
    }
}

/// `inbox_keep.lua`: creates the missing inboxes as empty streams with the ttl, refreshes the
/// ttl of the others (their entries kept), and refuses a foreign value at any of them before
/// creating or refreshing anything.
#[test]
fn inbox_keep_creates_empty_streams_and_refreshes_their_ttl() {
    init_tracing();
    let server = RedisServer::start();
    let (first, second) = (inbox("a"), inbox("b"));
    assert_eq!(
        ints(keep_inboxes(&server, &[&first, &second], "30000")),
        vec![2]
    );
    for key in [&first, &second] {
        assert_eq!(
            server.cmd(&["TYPE", key]).as_str().as_deref(),
            Some("stream")
        );
        assert_eq!(server.cmd(&["XLEN", key]).as_int(), 0, "{key}");
        let ttl = server.cmd(&["PTTL", key]).as_int();
        assert!(ttl > 0 && ttl <= 30_000, "{key}: {ttl}");
    }
    // An inbox with an event and a ttl running low: kept, entry and all, ttl pushed forward.
    server.cmd(&["XADD", &first, "*", "e", "0|grant|w,1,3000,0|mutex:x"]);
    server.cmd(&["PEXPIRE", &first, "1000"]);
    assert_eq!(
        ints(keep_inboxes(&server, &[&first, &second], "30000")),
        vec![0]
    );
    assert_eq!(server.cmd(&["XLEN", &first]).as_int(), 1);
    assert!(
        server.cmd(&["PTTL", &first]).as_int() > 1000,
        "ttl not refreshed"
    );

    // A foreign value at one inbox: refused before the other is created or refreshed.
    let (missing, foreign) = (inbox("c"), inbox("d"));
    server.cmd(&["SET", &foreign, "planted"]);
    server.cmd(&["PEXPIRE", &second, "1000"]);
    let before = dump_keys(&server, &[&second, &foreign]);
    let second_ttl = server.cmd(&["PTTL", &second]).as_int();
    let reply = keep_inboxes(&server, &[&missing, &second, &foreign], "30000");
    assert_wrongtype(&reply, "a string at an inbox");
    assert!(!exists(&server, &missing), "created before the refusal");
    assert_eq!(dump_keys(&server, &[&second, &foreign]), before);
    assert!(
        server.cmd(&["PTTL", &second]).as_int() <= second_ttl,
        "refreshed before the refusal"
    );
    assert_eq!(server.cmd(&["PTTL", &foreign]).as_int(), -1);
}

// ---------------------------------------------------------------------------
// the read-write lock's scripts
// ---------------------------------------------------------------------------

/// `rw_acquire` reads the fence key only for a take of a lock with no hash (a read take draws
/// the lock's first token from it as a write take does): missing (unless the call may create
/// it) or stamped with another layout, the take is refused and nothing changes; a foreign
/// value there is WRONGTYPE. While the hash exists (held, or a tombstone), every take, re-entry
/// and busy attempt leaves the fence key alone, whatever it holds: a read hold and a write hold
/// alike draw max(f + 1, clock) from the lock's `f`.
#[test]
fn only_an_rw_take_of_a_lock_with_no_hash_reads_the_fence_key() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let nothing = rw.dump(&[]);
    for bid in [Bid::read("a", "a-read"), Bid::write("a", "a-write")] {
        let refused = rw.attempt(bid, &fence_arg(false));
        assert_eq!(
            refused.error_message(),
            Some("FLFENCE missing"),
            "{bid:?}: {refused:?}"
        );
        assert_eq!(rw.dump(&[]), nothing, "{bid:?}: a key was written");
    }
    server.cmd(&["SET", FENCE, &format!("17|{OTHER_LAYOUT}")]);
    let stamped = rw.dump(&[]);
    let expected = format!("FLFENCE layout {OTHER_LAYOUT}");
    for bid in [Bid::read("a", "a-read"), Bid::write("a", "a-write")] {
        for create in [false, true] {
            let refused = rw.attempt(bid, &fence_arg(create));
            assert_eq!(
                refused.error_message(),
                Some(expected.as_str()),
                "{bid:?}: {refused:?}"
            );
            assert_eq!(rw.dump(&[]), stamped, "{bid:?}: a key changed");
        }
    }
    // Foreign strings (not "<last>|<layout>") and values of another type: WRONGTYPE.
    for value in ["hello", "12", "x12|stamp", "|stamp", "list"] {
        server.cmd(&["DEL", FENCE]);
        if value == "list" {
            server.cmd(&["RPUSH", FENCE, "planted"]);
        } else {
            server.cmd(&["SET", FENCE, &value.replace("stamp", LAYOUT)]);
        }
        let before = rw.dump(&[]);
        for bid in [Bid::read("a", "a-read"), Bid::write("a", "a-write")] {
            let what = format!("{bid:?} with {value:?} at the fence key");
            assert_wrongtype(&rw.attempt(bid, &fence_arg(true)), &what);
            assert_eq!(rw.dump(&[]), before, "{what}: a key changed");
        }
    }

    // The shard's first token, drawn by a read take: the server clock, stored as f.
    server.cmd(&["DEL", FENCE]);
    let clock = rw.clock();
    let t = rw.acquire(Bid::read("a", "a-read"))[1];
    assert_drawn(t, 0, clock, "the first read take");
    assert_eq!(fence_value(&server, FENCE), (t as u64, LAYOUT.to_owned()));
    assert_eq!(rw.token(), t);

    // While the hash exists, whatever the fence key holds: another read take draws from f, a
    // re-entry counts up, a busy write attempt queues; after the reads' releases (a tombstone)
    // a write take continues the token. The fence key is left as it is.
    let mut token = t;
    for (n, value) in fence_states(t).into_iter().enumerate() {
        set_fence(&server, value.as_deref());
        let fence = snapshot(&server, FENCE);
        let what = format!("fence {value:?}");
        let (reader, writer) = (format!("b{n}"), format!("w{n}"));
        let op = |owner: &str, what: &str| format!("{owner}-{what}");
        let take = |bid: Bid| ints(rw.attempt(bid, &fence_arg(false)));
        let clock = rw.clock();
        let read = take(Bid::read(&reader, &op(&reader, "read")));
        assert_eq!((read[0], read[2]), (1, 1), "{what}: {read:?}");
        assert_drawn(read[1], token, clock, &format!("{what}: the read take"));
        token = read[1];
        assert_eq!(
            take(Bid::read(&reader, &op(&reader, "again"))),
            vec![1, token, 2],
            "{what}"
        );
        let busy = take(Bid::write(&writer, &op(&writer, "try")));
        assert_eq!(busy, vec![0, busy[1], token], "{what}: {busy:?}");
        assert_eq!(
            rw.release_all(Side::Read, &reader, token, &op(&reader, "release")),
            vec![1, 0]
        );
        if n == 0 {
            assert_eq!(rw.release(Side::Read, "a", t, "a-release"), vec![1, 0]);
        }
        let clock = rw.clock();
        let taken = take(Bid::write(&writer, &op(&writer, "take")));
        assert_eq!((taken[0], taken[2]), (1, 1), "{what}: {taken:?}");
        assert_drawn(taken[1], token, clock, &what);
        token = taken[1];
        assert_eq!(
            rw.release(Side::Write, &writer, token, &op(&writer, "release")),
            vec![1, 0]
        );
        assert_eq!(
            snapshot(&server, FENCE),
            fence,
            "{what}: the fence key changed"
        );
    }
    rw.assert_no_stray_keys();
}

/// A foreign value at the read-write lock's hash key (another type than a hash): every
/// read-write script fails with WRONGTYPE before writing anything (its first access is one
/// HMGET of the hash), and the foreign value, the fence key and the inboxes stay as they are.
#[test]
fn rw_scripts_refuse_a_foreign_value_at_the_hold_key_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b"]);
    server.cmd(&["SET", FENCE, &format!("17|{LAYOUT}")]);
    let inbox_b = inbox("b");
    for kind in ["string", "list", "set", "zset", "stream"] {
        server.cmd(&["DEL", RW_HOLD]);
        plant(&server, RW_HOLD, kind);
        let before = rw.dump(&[&inbox_b]);
        let calls = [
            (
                "read take",
                rw.attempt(Bid::read("a", "a-read"), &fence_arg(true)),
            ),
            (
                "write take",
                rw.attempt(Bid::write("a", "a-write"), &fence_arg(true)),
            ),
            (
                "waiting write attempt",
                rw.attempt(Bid::write("b", "b-wait").waiting("wb"), &fence_arg(true)),
            ),
            (
                "read release",
                rw.release_raw(Side::Read, "a", 17, "a-rel", false, None),
            ),
            (
                "write release",
                rw.release_raw(Side::Write, "a", 17, "a-rel", true, None),
            ),
            (
                "take-over",
                rw.release_raw(Side::Write, "a", 17, "a-rel", false, Some(("b", "wb"))),
            ),
            ("leave", rw.leave_raw("wb")),
            ("force unlock", rw.force_raw()),
            (
                "heartbeat",
                rw.heartbeat_raw(WAITER_LEASE, &[(RW_HOLD, &["wb"])]),
            ),
            (
                "read renewal",
                rw.renew_raw(LEASE, &[(RW_HOLD, Side::Read, "a", 17)]),
            ),
            (
                "write renewal",
                rw.renew_raw(LEASE, &[(RW_HOLD, Side::Write, "a", 17)]),
            ),
            ("inspect", rw.inspect_raw()),
        ];
        for (call, reply) in calls {
            let what = format!("{call} with a {kind} at the hold key");
            assert_wrongtype(&reply, &what);
            assert_eq!(rw.dump(&[&inbox_b]), before, "{what}: a key changed");
        }
    }
}

/// `rw_renew` over two locks of one slot, a foreign value at the second one: WRONGTYPE, and
/// nothing changed, not even the first lock's hash (its renewal would push the read hold's end
/// and the hash's ttl).
#[test]
fn rw_renew_refuses_a_foreign_value_at_any_hold_key_before_changing_anything() {
    batch_refuses_a_foreign_value_at_its_second_key("renewal", &|rw, t, second| {
        rw.renew_raw(
            LEASE,
            &[(RW_HOLD, Side::Read, "a", t), (second, Side::Read, "a", t)],
        )
    });
}

/// `rw_heartbeat` over two locks of one slot, a foreign value at the second one: WRONGTYPE,
/// and nothing changed, not even the first lock's hash (the heartbeat would move its queued
/// waiter's alive time on).
#[test]
fn rw_heartbeat_refuses_a_foreign_value_at_any_hold_key_before_changing_anything() {
    batch_refuses_a_foreign_value_at_its_second_key("heartbeat", &|rw, _, second| {
        rw.heartbeat_raw(WAITER_LEASE, &[(RW_HOLD, &["wb"]), (second, &["wb"])])
    });
}

/// Lock x read by a (token `t`, for 10 s) with b's writer queued; for each foreign type at the
/// second lock's key, `call(rw, t, second key)` must fail with WRONGTYPE and change no key, nor
/// push x's ttl.
fn batch_refuses_a_foreign_value_at_its_second_key(
    name: &str,
    call: &dyn Fn(&Rw, i64, &str) -> Resp,
) {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    const Y: &str = "{t:0}:rw:y";
    let t = rw.acquire(Bid::read("a", "a-read").lease(10_000))[1];
    let busy = rw.acquire(Bid::write("b", "b-wait").waiting("wb"));
    assert_eq!(busy[0], 0, "{busy:?}");
    for kind in ["string", "list", "set", "zset", "stream"] {
        server.cmd(&["DEL", Y]);
        plant(&server, Y, kind);
        let (before, hash, ttl) = (rw.dump(&[Y]), rw.hash(), rw.pttl());
        let what = format!("a {name} with a {kind} at the second hold key");
        assert_wrongtype(&call(&rw, t, Y), &what);
        assert_eq!(rw.hash(), hash, "{what}: x's hash changed");
        assert_eq!(rw.dump(&[Y]), before, "{what}: a key changed");
        assert!(rw.pttl() <= ttl, "{what}: x's ttl was pushed");
    }
}

/// Plants a value of another type than a hash under `key`: a `kind` ("string", "list", "set",
/// "zset" or "stream").
fn plant(server: &RedisServer, key: &str, kind: &str) {
    match kind {
        "string" => server.cmd(&["SET", key, "planted"]),
        "list" => server.cmd(&["RPUSH", key, "p"]),
        "set" => server.cmd(&["SADD", key, "m"]),
        "zset" => server.cmd(&["ZADD", key, "1", "m"]),
        _ => server.cmd(&["XADD", key, "*", "o", "a"]),
    };
}

/// What a shard's fence key may hold while a lock's hash exists: nothing (lost), another
/// layout's stamp (with the token `t`), a foreign string.
fn fence_states(t: i64) -> [Option<String>; 3] {
    [
        None,
        Some(format!("{t}|{OTHER_LAYOUT}")),
        Some("hello".to_owned()),
    ]
}

/// Sets the fence key to `value`, or deletes it.
fn set_fence(server: &RedisServer, value: Option<&str>) {
    server.cmd(&["DEL", FENCE]);
    if let Some(value) = value {
        server.cmd(&["SET", FENCE, value]);
    }
}
