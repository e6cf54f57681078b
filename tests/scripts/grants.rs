//! Grants to the first live waiter (Stream and Pub/Sub), waiters that are only woken, the grant
//! written before its event, leaving the queue, force unlock (`lib/hold.lua`'s `fl_grant_next`,
//! `hold_leave.lua`, `hold_force_unlock.lua`).

use crate::lua::*;
use crate::support::*;

/// Stream mode: a release that frees the lock grants it to the first queued waiter whose
/// client's inbox stream exists (`inbox_keep.lua` keeps it): the hold in the waiter's name
/// (token max(f + 1, clock), its grant ms = min(lease, waiter lease) as l and as the hold's
/// ttl, its waiter id as r), and one event `0|grant|<waiter>,<token>,<grant ms>,<queued>|<lock
/// id>` into that inbox alone (queued: 1 when other lines stay in the queue after the grant,
/// else 0). Waiters with no inbox, or a foreign value there (left alone), are dropped
/// from the queue; the hold written in a dropped waiter's name is overwritten by the next
/// one's, or by the free when nobody is left (the tombstone keeps the token drawn for it). The
/// waiter's next attempt is answered with the grant; a busy attempt is given the grant ms.
#[test]
fn a_release_grants_the_lock_to_the_first_waiter_whose_inbox_exists() {
    grants_to_the_first_waiter_whose_inbox_exists("stream");
    // Redis 6.2+: the check and the event are one XADD NOMKSTREAM.
    if server_version() >= (6, 2, 0) {
        grants_to_the_first_waiter_whose_inbox_exists("stream6");
    }
}

fn grants_to_the_first_waiter_whose_inbox_exists(mode: &'static str) {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, mode);
    // b's client died (no inbox); x's inbox holds a foreign value; c and d are alive.
    lua.open_inboxes(&["c", "d"]);
    server.cmd(&["SET", &inbox("x"), "planted"]);
    let planted = snapshot(&server, &inbox("x"));
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for ask in [
        Ask::waiting("b", "b-wait", "wb"),
        Ask::waiting("x", "x-wait", "wx"),
        Ask::waiting("c", "c-wait", "wc"),
        Ask::waiting("d", "d-wait", "wd").lease(2_000),
    ] {
        assert_eq!(lua.acquire(ask), busy(LEASE, t));
    }

    let clock = lua.clock();
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tc = lua.token();
    assert_drawn(tc, t, clock, "c's grant");
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: lua.line("wd", "d", 2_000, 2_000),
            i: String::new(),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant",
    );
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE, 1)]);
    assert!(lua.inbox_events("d").is_empty(), "d was told");
    assert!(
        !exists(&server, &inbox("b")),
        "a dead client's inbox created"
    );
    assert_eq!(
        snapshot(&server, &inbox("x")),
        planted,
        "foreign inbox changed"
    );
    // The inbox keeps its ttl (its reader's sign of life).
    let ttl = server.cmd(&["PTTL", &inbox("c")]).as_int();
    assert!(ttl > 0 && ttl <= 30_000, "the inbox's ttl: {ttl}");
    // The bound a busy attempt is given is now the grant's.
    assert_eq!(lua.acquire(Ask::once("z", "z-try")), busy(WAITER_LEASE, tc));

    // c's next attempt is answered with the grant: what is left of it, no second level.
    let answered = lua.acquire(Ask::waiting("c", "c-recheck", "wc"));
    assert_eq!(answered[..3], [1, tc, 1], "{answered:?}");
    assert!(
        answered[3] > 0 && answered[3] <= WAITER_LEASE,
        "{answered:?}"
    );
    // A retried release of a is answered, and c is unharmed.
    let before = lua.dump(&[]);
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    assert_eq!(lua.dump(&[]), before);

    // c's release grants to d, for d's lease (shorter than the waiter lease). c's token set
    // ahead of the clock: d's is exactly one above it.
    let tc = lua.push_ahead();
    assert_eq!(lua.release("c", tc, "c-release"), vec![1, 0]);
    let td = tc + 1;
    lua.assert_hold(
        &HoldHash {
            x: "c-release,a-release".to_owned(),
            ..granted("d", td, 2_000, "wd")
        },
        2_000,
        "d's grant",
    );
    assert_eq!(lua.inbox_events("d"), [grant("wd", td, 2_000, 0)]);
    assert_eq!(lua.inbox_events("c").len(), 1, "c was told twice");

    // Nobody alive is queued: d's release writes the hold in e's name, then in x's (grant ms
    // 2500), and frees the lock: the tombstone keeps the token drawn for them and x's l.
    for ask in [
        Ask::waiting("e", "e-wait", "we"),
        Ask::waiting("x", "x-wait-2", "wx").lease(2_500),
    ] {
        assert_eq!(lua.acquire(ask), busy(2_000, td));
    }
    assert_eq!(lua.release("d", td, "d-release"), vec![1, 0]);
    lua.assert_hold(
        &tombstone(td + 1, 2_500, "d-release", "d-release,c-release,a-release"),
        WINDOW,
        "freed: nobody alive queued",
    );
    assert!(!exists(&server, &inbox("e")));
    assert_eq!(
        snapshot(&server, &inbox("x")),
        planted,
        "foreign inbox changed"
    );
    // The next take continues from that token.
    assert_eq!(lua.acquire(Ask::once("f", "f-take")), vec![1, td + 2, 1]);
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// Waiter lease -1 (a Redlock round): a busy attempt queues a line whose grant ms is 0. A
/// release that reaches such a line sends `0|name|<waiter>|<lock id>` to its client's inbox
/// (when the inbox exists: nothing is created for a dead client), takes nothing for it (no
/// token drawn, no hold written) and goes on: it grants the lock to the next real waiter, or
/// frees it when none is left. Such a waiter is never granted the lock; when the lock is free
/// its attempt is a take like any other.
#[test]
fn a_release_wakes_the_waiters_that_are_only_woken_and_grants_the_next() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    // s's client died (no inbox).
    lua.open_inboxes(&["r", "c", "z"]);
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    for ask in [
        Ask::woken("r", "r-wait", "wr"),
        Ask::woken("r", "r-wait-2", "wr"),
        Ask::woken("s", "s-wait", "ws"),
        Ask::waiting("c", "c-wait", "wc"),
        Ask::woken("z", "z-wait", "wz").lease(2_000),
    ] {
        assert_eq!(lua.acquire(ask), busy(LEASE, t));
    }
    let queued = HoldHash {
        q: [
            lua.line("wr", "r", LEASE, 0),
            lua.line("ws", "s", LEASE, 0),
            lua.line("wc", "c", LEASE, WAITER_LEASE),
            lua.line("wz", "z", 2_000, 0),
        ]
        .concat(),
        ..held("a", t, LEASE, "a-take")
    };
    lua.assert_hold(&queued, LEASE, "three woken waiters and c queued");

    // a's release wakes r (s has no inbox) and grants the lock to c; z stays queued.
    let clock = lua.clock();
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tc = lua.token();
    assert_drawn(tc, t, clock, "c's grant");
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: lua.line("wz", "z", 2_000, 0),
            i: String::new(),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant after r was woken",
    );
    assert_eq!(lua.inbox_events("r"), [wake("wr")]);
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE, 1)]);
    assert!(lua.inbox_events("z").is_empty(), "z was woken early");
    assert!(
        !exists(&server, &inbox("s")),
        "a dead client's inbox created"
    );

    // c's release wakes z, and with nobody left to grant it to frees the lock: no token was
    // drawn for z, no hold written in its name.
    assert_eq!(lua.release("c", tc, "c-release"), vec![1, 0]);
    lua.assert_hold(
        &tombstone(tc, WAITER_LEASE, "c-release", "c-release,a-release"),
        WINDOW,
        "freed after z was woken",
    );
    assert_eq!(lua.inbox_events("z"), [wake("wz")]);
    assert_eq!(lua.inbox_events("r").len(), 1, "r was woken twice");
    assert_eq!(lua.inbox_events("c").len(), 1, "c was told twice");

    // z's next attempt finds the lock free: a take like any other.
    let clock = lua.clock();
    let taken = lua.acquire(Ask::woken("z", "z-wait-2", "wz").lease(2_000));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    assert_drawn(taken[1], tc, clock, "z's take");
    lua.assert_hold(
        &HoldHash {
            x: "c-release,a-release".to_owned(),
            ..held("z", taken[1], 2_000, "z-wait-2")
        },
        2_000,
        "z's take",
    );
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}

/// Pub/Sub modes: a grant is published on the waiter's inbox channel; a waiter whose client
/// nobody hears for (PUBLISH reached no subscriber) is dropped from the queue and the next one
/// gets the lock; a waiter that is only woken (waiter lease -1) is sent its `name` event and
/// passed over. No inbox key is created. In a cluster before Redis 7 ("bpubsub", where
/// PUBLISH counts one node's subscribers only) the head always counts as there.
#[test]
fn pubsub_grants_go_to_the_first_waiter_whose_inbox_has_a_subscriber() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "pubsub");
    let mut subscriber = server.connect().expect("subscriber");
    for owner in ["c", "r"] {
        let subscribed = subscriber
            .cmd(&["SUBSCRIBE", &inbox(owner)])
            .expect("SUBSCRIBE");
        assert_eq!(
            subscribed.as_array()[0].as_str().as_deref(),
            Some("subscribe")
        );
    }
    let mut next_message = || -> Vec<Option<String>> {
        let message = subscriber.read_reply().expect("a message").as_array();
        message.iter().map(Resp::as_str).collect()
    };
    let message = |owner: &str, payload: String| {
        vec![
            Some("message".to_owned()),
            Some(inbox(owner)),
            Some(payload),
        ]
    };

    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    for ask in [
        Ask::woken("r", "r-wait", "wr"),
        Ask::waiting("b", "b-wait", "wb"),
        Ask::waiting("c", "c-wait", "wc"),
        Ask::waiting("d", "d-wait", "wd"),
    ] {
        assert_eq!(lua.acquire(ask), busy(LEASE, t));
    }
    let clock = lua.clock();
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tc = lua.token();
    assert_drawn(tc, t, clock, "c's grant");
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            q: lua.line("wd", "d", LEASE, WAITER_LEASE),
            i: String::new(),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant (r woken, b has no subscriber)",
    );
    assert_eq!(next_message(), message("r", wake("wr")));
    assert_eq!(
        next_message(),
        message("c", grant("wc", tc, WAITER_LEASE, 1))
    );

    // Nobody hears for d: c's release writes the hold in d's name (the token drawn for it),
    // then frees the lock.
    let tc = lua.push_ahead();
    assert_eq!(lua.release("c", tc, "c-release"), vec![1, 0]);
    lua.assert_hold(
        &tombstone(tc + 1, WAITER_LEASE, "c-release", "c-release,a-release"),
        WINDOW,
        "freed: no subscriber",
    );
    assert!(
        server.keys(&format!("{EVENTS}:to:*")).is_empty(),
        "an inbox key was created"
    );
    lua.assert_no_stray_keys();

    // bpubsub: the head gets the lock though its PUBLISH reached nobody here.
    let broadcast = Lua::new(&server, "bpubsub");
    assert_eq!(
        broadcast.acquire(Ask::once("e", "e-take")),
        vec![1, tc + 2, 1]
    );
    assert_eq!(
        broadcast.acquire(Ask::waiting("b", "b-wait-2", "wb")),
        busy(LEASE, tc + 2)
    );
    assert_eq!(broadcast.release("e", tc + 2, "e-release"), vec![1, 0]);
    broadcast.assert_hold(
        &HoldHash {
            x: "e-release,c-release,a-release".to_owned(),
            ..granted("b", tc + 3, WAITER_LEASE, "wb")
        },
        WAITER_LEASE,
        "b's grant in bpubsub mode",
    );
    // The subscriber heard nothing more: the next message is one published here.
    assert_eq!(server.cmd(&["PUBLISH", &inbox("c"), "probe"]).as_int(), 1);
    assert_eq!(next_message(), message("c", "probe".to_owned()));
}

/// A grant writes the hold before it sends its event: when the write is refused (the server
/// is out of memory, so its first write in a script fails), the release fails as a whole
/// before anything is published, and no key changes; so does a take-over, whose first write
/// queues its successor. Pub/Sub shows it (PUBLISH itself is
/// never refused for want of memory). With memory again, the same release grants the lock.
#[test]
fn a_grant_writes_the_hold_before_it_publishes_the_event() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "pubsub");
    let mut subscriber = server.connect().expect("subscriber");
    let subscribed = subscriber
        .cmd(&["SUBSCRIBE", &inbox("c")])
        .expect("SUBSCRIBE");
    assert_eq!(
        subscribed.as_array()[0].as_str().as_deref(),
        Some("subscribe")
    );
    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    assert_eq!(
        lua.acquire(Ask::waiting("c", "c-wait", "wc")),
        busy(LEASE, t)
    );
    let before = lua.dump(&[]);

    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let refused = lua.release_raw("a", t, "a-release", false, None);
    // A take-over, whose first write queues its successor behind the grant: refused as well.
    let to = Successor {
        owner: "e",
        waiter: "we",
        limit: 0,
        queues: Some(WAITER_LEASE),
    };
    let taken_over = lua.release_to("a", t, "a-release", false, Some(to));
    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    for (call, reply) in [("release", refused), ("take-over", taken_over)] {
        assert!(
            reply.error_message().is_some_and(|e| e.contains("OOM")),
            "{call}: {reply:?}"
        );
    }
    assert_eq!(lua.dump(&[]), before, "a refused release changed a key");
    // Nothing was published on c's inbox: the next message is one published here.
    assert_eq!(server.cmd(&["PUBLISH", &inbox("c"), "probe"]).as_int(), 1);
    let probe = subscriber.read_reply().expect("the probe").as_array();
    assert_eq!(probe[2].as_str().as_deref(), Some("probe"), "{probe:?}");

    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let tc = lua.token();
    assert!(tc > t, "c's grant: token {tc} after {t}");
    lua.assert_hold(
        &HoldHash {
            x: "a-release".to_owned(),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant",
    );
    let granted = subscriber.read_reply().expect("the grant").as_array();
    assert_eq!(
        granted[2].as_str(),
        Some(grant("wc", tc, WAITER_LEASE, 0)),
        "{granted:?}"
    );
    lua.assert_no_stray_keys();
}

/// `hold_leave.lua`: a waiter that gives up leaves its line (only its own: not a waiter whose
/// id it prefixes); a waiter that a release had granted the lock to (never taken up) passes it
/// on to the next live waiter (token max(f + 1, clock)), or frees it; the waiter id joins the
/// freed-by chain, so earlier releases stay answered. Leaving twice, or a lock with no hash,
/// changes nothing and creates nothing.
#[test]
fn a_waiter_that_leaves_drops_its_line_or_passes_its_grant_on() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "c", "d"]);
    assert_eq!(lua.leave("wb"), vec![0]);
    assert!(!exists(&server, HOLD), "leaving created the hold");

    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    for (owner, waiter) in [("b", "wb"), ("c", "wc"), ("d", "wd")] {
        assert_eq!(
            lua.acquire(Ask::waiting(owner, &format!("{owner}-wait"), waiter)),
            busy(LEASE, t)
        );
    }
    assert_eq!(lua.leave("wc"), vec![1]);
    let queue = [
        lua.line("wb", "b", LEASE, WAITER_LEASE),
        lua.line("wd", "d", LEASE, WAITER_LEASE),
    ]
    .concat();
    let a_holds = HoldHash {
        q: queue,
        ..held("a", t, LEASE, "a-take")
    };
    assert_eq!(lua.hash(), a_holds);
    let before = lua.dump(&[]);
    for waiter in ["wc", "w", "wz"] {
        assert_eq!(lua.leave(waiter), vec![0], "{waiter}");
    }
    assert_eq!(lua.dump(&[]), before, "a leave of nobody changed a key");

    // a's release grants to b; b gives up before taking it up: d gets it.
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    assert_eq!(hold_owner(&server, HOLD).as_deref(), Some("b"));
    let tb = lua.token();
    assert!(tb > t, "b's grant: token {tb} after {t}");
    let clock = lua.clock();
    assert_eq!(lua.leave("wb"), vec![1]);
    let td = lua.token();
    assert_drawn(td, tb, clock, "d's grant from b");
    lua.assert_hold(
        &HoldHash {
            x: "wb,a-release".to_owned(),
            ..granted("d", td, WAITER_LEASE, "wd")
        },
        WAITER_LEASE,
        "d's grant from b",
    );
    assert_eq!(lua.inbox_events("b"), [grant("wb", tb, WAITER_LEASE, 1)]);
    assert_eq!(lua.inbox_events("d"), [grant("wd", td, WAITER_LEASE, 0)]);
    assert!(lua.inbox_events("c").is_empty());
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let before = lua.dump(&[]);
    assert_eq!(lua.leave("wb"), vec![0]);
    assert_eq!(lua.dump(&[]), before, "a second leave changed a key");

    // d gives up too, with nobody queued: the lock is freed, the token kept.
    assert_eq!(lua.leave("wd"), vec![1]);
    lua.assert_hold(
        &tombstone(td, WAITER_LEASE, "wd", "wd,wb,a-release"),
        WINDOW,
        "freed by the last grant's leave",
    );
    assert_eq!(lua.release("a", t, "a-release"), vec![1, 0]);
    let clock = lua.clock();
    let taken = lua.acquire(Ask::once("e", "e-take"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    assert_drawn(taken[1], td, clock, "e's take");
    lua.assert_no_stray_keys();
}

/// `hold_force_unlock.lua`: a free lock (no hash, or a tombstone) is left as it is; a held one
/// goes to the first live waiter (token max(f + 1, clock), grant event; a waiter that is only
/// woken is sent its `name` event on the way) or is freed (a tombstone, r = "force"); the
/// removed holder's release is refused; the token continues.
#[test]
fn force_unlock_grants_to_the_queue_head_or_frees_the_lock() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["b", "r"]);
    assert_eq!(lua.force_unlock(), vec![0]);
    assert!(!exists(&server, HOLD), "force unlock created the hold");

    let t = lua.acquire(Ask::once("a", "a-take"))[1];
    let fence = snapshot(&server, FENCE);
    assert_eq!(lua.acquire(Ask::once("a", "a-again")), vec![1, t, 2]);
    for ask in [
        Ask::woken("r", "r-wait", "wr"),
        Ask::waiting("b", "b-wait", "wb"),
    ] {
        assert_eq!(lua.acquire(ask), busy(LEASE, t));
    }
    let clock = lua.clock();
    assert_eq!(lua.force_unlock(), vec![1]);
    let tb = lua.token();
    assert_drawn(tb, t, clock, "b's grant by force");
    lua.assert_hold(
        &granted("b", tb, WAITER_LEASE, "wb"),
        WAITER_LEASE,
        "b's grant by force",
    );
    assert_eq!(lua.inbox_events("r"), [wake("wr")]);
    assert_eq!(lua.inbox_events("b"), [grant("wb", tb, WAITER_LEASE, 0)]);
    let before = lua.dump(&[]);
    assert_eq!(lua.release("a", t, "a-release"), vec![-1, 0]);
    assert_eq!(
        lua.dump(&[]),
        before,
        "the removed holder's release changed a key"
    );

    // Nobody queued: freed, the token kept.
    assert_eq!(lua.force_unlock(), vec![1]);
    let freed = tombstone(tb, WAITER_LEASE, "force", "");
    lua.assert_hold(&freed, WINDOW, "freed by force");
    assert_eq!(lua.release("b", tb, "b-release"), vec![0, 0]);
    let before = lua.dump(&[]);
    assert_eq!(lua.force_unlock(), vec![0]);
    assert_eq!(
        lua.dump(&[]),
        before,
        "force unlock of a free lock changed a key"
    );
    assert_eq!(lua.hash(), freed);
    // The token continues: exactly one above a tombstone's that runs ahead of the clock.
    let ahead = lua.push_ahead();
    assert_eq!(lua.acquire(Ask::once("c", "c-take")), vec![1, ahead + 1, 1]);
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    lua.assert_no_stray_keys();
}
