//! The Lua protocol itself: the scripts as `src/scripts.rs` composes them, run with `EVAL` on
//! the keys of one lock, with KEYS and ARGV in the canonical order of `lua/README.md`. A real
//! redis-server; no client of the crate in between, so each test can replay, drop or re-send a
//! single script call and look at every key after it.
//!
//! The exclusive locks (`hold_*.lua`, `lua/lib/hold.lua`) keep their whole state in one hash
//! per lock: owner `o`, count `c`, token `f`, lease `l`, last op `r`, freed-by chain `x`,
//! hand-over streak `h`, the wait queue `q` and the waiter id `g` a release granted or handed
//! the hold to. [`HoldHash`] reads that hash field by field, so a test states the whole state
//! it expects after each call.
//!
//! Tokens follow the server clock (`fl_clock_after` in `lua/lib/hold.lua`): a token drawn by a
//! call is max(previous + 1, server clock in µs), so a test checks that it is above the
//! previous token and not below the clock read before the call ([`assert_drawn`]), or sets the
//! previous token far ahead of the clock ([`Lua::push_ahead`]) to expect exactly previous + 1.

mod support;

use std::collections::BTreeMap;

use support::{
    composed, exists, fence_value, hold_owner, init_tracing, queued_waiters, snapshot, RedisServer,
    Resp,
};

const HOLD_LIB: &str = include_str!("../lua/lib/hold.lua");
const FENCE_LIB: &str = include_str!("../lua/lib/fence.lua");
const QUEUE_LIB: &str = include_str!("../lua/lib/queue.lua");
const NOTIFY_LIB: &str = include_str!("../lua/lib/notify.lua");
const RW_LIB: &str = include_str!("../lua/lib/rw.lua");

/// The layout stamp the tests pass in their fence argument (any fixed string works: the
/// scripts only compare it with the fence key's stamp).
const LAYOUT: &str = "v-test shards=1 notification=stream";
/// Another layout's stamp, as a client with another shard count would write it.
const OTHER_LAYOUT: &str = "v-other shards=2 notification=stream";

/// The fence argument `"<0|1><layout>"` (`lua/lib/fence.lua`): `create` lets a script create a
/// missing fence key (a client passes it only after checking the layout record).
fn fence_arg(create: bool) -> String {
    format!("{}{LAYOUT}", u8::from(create))
}

/// A reply that must be an array of integers.
fn ints(reply: Resp) -> Vec<i64> {
    assert!(!reply.is_error(), "{reply:?}");
    reply.as_array().iter().map(Resp::as_int).collect()
}

/// Asserts that `reply` is a WRONGTYPE error.
fn assert_wrongtype(reply: &Resp, what: &str) {
    assert!(
        reply
            .error_message()
            .is_some_and(|e| e.contains("WRONGTYPE")),
        "{what}: {reply:?}"
    );
}

/// The DUMP of each key, for "nothing changed" checks.
fn dump_keys(server: &RedisServer, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    keys.iter()
        .map(|key| server.cmd(&["DUMP", key]).as_bytes())
        .collect()
}

/// The server clock in microseconds (what a fence key starts from).
fn server_micros(server: &RedisServer) -> i64 {
    let time = server.cmd(&["TIME"]).as_array();
    time[0].as_int() * 1_000_000 + time[1].as_int()
}

/// How far ahead of the server clock [`Lua::push_ahead`] sets a hold's token (µs: 1000 s, far
/// more than a test lasts), so that the next token drawn from it is exactly one above it.
const AHEAD: i64 = 1_000_000_000;

/// Asserts that `token`, drawn by a call made after the server clock read `clock` (µs), is
/// max(previous + 1, the clock at the call): above `previous`, and not below `clock`.
fn assert_drawn(token: i64, previous: i64, clock: i64, what: &str) {
    assert!(
        token > previous,
        "{what}: token {token} not above the previous one {previous}"
    );
    assert!(
        token >= clock,
        "{what}: token {token} below the server clock {clock}"
    );
}

// ---------------------------------------------------------------------------
// the exclusive locks: lua/hold_*.lua
// ---------------------------------------------------------------------------

/// The hold hash of barging mutex `x` under prefix `t` (shard 0).
const HOLD: &str = "{t:0}:mutex:x";
/// What the client passes at the kind's own position (`KEYS[2]`, unused by the hold scripts:
/// the old waiter marker's name). No script may create it.
const MARKER: &str = "{t:0}:mutex.wait:x";
/// The shard's fence key (`lua/lib/fence.lua`).
const FENCE: &str = "{t:0}:fence";
/// The shard's events key (a single Redis: one for every shard); the inboxes are beside it.
const EVENTS: &str = "{t:events}";
/// The shard's event counter (not a key of the hold scripts; no script may create it).
const SEQ: &str = "{t:events}:seq";
/// The KEYS of the hold scripts (`through(Key::Events)`; `hold_acquire` takes the first 3).
const KEYS: [&str; 4] = [HOLD, MARKER, FENCE, EVENTS];
const LOCK_ID: &str = "mutex:x";
/// The lease of every acquisition unless a test says otherwise (ms).
const LEASE: i64 = 30_000;
/// The waiter lease of a waiting acquisition unless a test says otherwise (ms).
const WAITER_LEASE: i64 = 3_000;
/// A hand-over successor's lease (ms).
const SUCCESSOR_LEASE: i64 = 20_000;
/// At most this many hand-overs in a row.
const STREAK: i64 = 2;
/// The retry window: the tombstone's ttl (ms).
const WINDOW: i64 = 5_000;

/// The inbox tag of `owner`'s client (each owner of these tests has a client of its own).
fn tag(owner: &str) -> String {
    format!("tag{owner}")
}

/// The inbox of `owner`'s client: the stream (or channel) `<events>:to:<tag>`.
fn inbox(owner: &str) -> String {
    format!("{EVENTS}:to:{}", tag(owner))
}

/// A queue line of the hold hash (`lua/lib/hold.lua`): waiter id, inbox tag, owner id, lease,
/// grant ms.
fn line(waiter: &str, owner: &str, lease: i64, grant: i64) -> String {
    format!("{waiter} {} {owner} {lease} {grant}\n", tag(owner))
}

/// The grant event a release sends to a waiter's inbox: not numbered (sequence 0).
fn grant(waiter: &str, token: i64, grant_ms: i64) -> String {
    format!("0|grant|{waiter},{token},{grant_ms}|{LOCK_ID}")
}

/// The event that wakes a waiter that is only woken (waiter lease -1: a Redlock round), never
/// granted the lock: not numbered either.
fn wake(waiter: &str) -> String {
    format!("0|name|{waiter}|{LOCK_ID}")
}

/// The busy reply of `hold_acquire`: the bound (the holder's lease as last set) and the
/// holder's token.
fn busy(bound: i64, token: i64) -> Vec<i64> {
    vec![0, bound, token]
}

/// One call of `hold_acquire.lua`: the inbox tag is always the owner's client's.
#[derive(Clone, Copy)]
struct Ask<'a> {
    owner: &'a str,
    lease: i64,
    op: &'a str,
    waiter: &'a str,
    waiter_lease: i64,
}

impl<'a> Ask<'a> {
    /// A try (`try_lock`): no waiter id, waiter lease 0.
    fn once(owner: &'a str, op: &'a str) -> Self {
        Ask {
            owner,
            lease: LEASE,
            op,
            waiter: "",
            waiter_lease: 0,
        }
    }

    /// An attempt of an acquisition that waits when the lock is busy.
    fn waiting(owner: &'a str, op: &'a str, waiter: &'a str) -> Self {
        Ask {
            owner,
            lease: LEASE,
            op,
            waiter,
            waiter_lease: WAITER_LEASE,
        }
    }

    /// An attempt of an acquisition that, when the lock is busy, queues to be woken only
    /// (waiter lease -1: a Redlock round), never granted the lock.
    fn woken(owner: &'a str, op: &'a str, waiter: &'a str) -> Self {
        Ask::waiting(owner, op, waiter).waiter_lease(-1)
    }

    fn lease(self, lease: i64) -> Self {
        Ask { lease, ..self }
    }

    fn waiter_lease(self, waiter_lease: i64) -> Self {
        Ask {
            waiter_lease,
            ..self
        }
    }
}

/// The whole hold hash, field by field (every field the library writes; no other).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HoldHash {
    o: String,
    c: String,
    f: String,
    l: String,
    r: String,
    x: String,
    h: String,
    q: String,
    g: String,
}

/// A hold of `owner` (count 1, no freed-by chain, no streak, nobody queued, granted to no
/// waiter): what a take writes, but for the fields a test sets with `..held(..)`.
fn held(owner: &str, token: i64, lease: i64, r: &str) -> HoldHash {
    HoldHash {
        o: owner.to_owned(),
        c: "1".to_owned(),
        f: token.to_string(),
        l: lease.to_string(),
        r: r.to_owned(),
        x: String::new(),
        h: "0".to_owned(),
        q: String::new(),
        g: String::new(),
    }
}

/// A hold that a release (or a leave, or a force unlock) granted or handed to `waiter` of
/// `owner`: the waiter id both as `r` and as `g`.
fn granted(owner: &str, token: i64, lease: i64, waiter: &str) -> HoldHash {
    HoldHash {
        g: waiter.to_owned(),
        ..held(owner, token, lease, waiter)
    }
}

/// A tombstone: free, the last hold's token and lease kept, `r` the op that freed it, granted
/// to no waiter (`g` = "").
fn tombstone(token: i64, lease: i64, r: &str, x: &str) -> HoldHash {
    HoldHash {
        o: String::new(),
        c: "0".to_owned(),
        r: r.to_owned(),
        x: x.to_owned(),
        ..held("", token, lease, "")
    }
}

/// The hold scripts as `src/scripts.rs` composes them (check prelude, FENCE, NOTIFY, HOLD), run with
/// `EVAL` on [`KEYS`] in one notification mode.
struct Lua<'a> {
    server: &'a RedisServer,
    mode: &'static str,
    acquire: String,
    release: String,
    leave: String,
    force: String,
    heartbeat: String,
}

impl<'a> Lua<'a> {
    fn new(server: &'a RedisServer, mode: &'static str) -> Self {
        let libraries = [FENCE_LIB, NOTIFY_LIB, HOLD_LIB];
        Lua {
            server,
            mode,
            acquire: composed(&libraries, include_str!("../lua/hold_acquire.lua")),
            release: composed(&libraries, include_str!("../lua/hold_release.lua")),
            leave: composed(&libraries, include_str!("../lua/hold_leave.lua")),
            force: composed(&libraries, include_str!("../lua/hold_force_unlock.lua")),
            heartbeat: composed(&libraries, include_str!("../lua/hold_heartbeat.lua")),
        }
    }

    fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Resp {
        let count = keys.len().to_string();
        let mut command = vec!["EVAL", script, &count];
        command.extend(keys);
        command.extend(args);
        self.server.cmd(&command)
    }

    /// `hold_acquire` with the fence argument `fence_arg`; the raw reply.
    fn attempt(&self, ask: Ask, fence_arg: &str) -> Resp {
        let (lease, waiter_lease) = (ask.lease.to_string(), ask.waiter_lease.to_string());
        let inbox_tag = tag(ask.owner);
        self.eval(
            &self.acquire,
            &KEYS[..3],
            &[
                ask.owner,
                &lease,
                ask.op,
                ask.waiter,
                &waiter_lease,
                &inbox_tag,
                fence_arg,
            ],
        )
    }

    /// `hold_acquire` that may create the fence key (as after the layout check).
    fn acquire(&self, ask: Ask) -> Vec<i64> {
        ints(self.attempt(ask, &fence_arg(true)))
    }

    /// `hold_release`, handing over to `to` = (owner, waiter id) if given; the raw reply.
    fn release_raw(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        to: Option<(&str, &str)>,
    ) -> Resp {
        let (successor, waiter) = to.unwrap_or(("", ""));
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let (lease, streak) = match to {
            Some(_) => (SUCCESSOR_LEASE.to_string(), STREAK.to_string()),
            None => ("0".to_owned(), "0".to_owned()),
        };
        self.eval(
            &self.release,
            &KEYS,
            &[
                owner,
                &token,
                op,
                if all { "1" } else { "0" },
                &window,
                self.mode,
                "1000",
                LOCK_ID,
                successor,
                waiter,
                &lease,
                &streak,
            ],
        )
    }

    /// `hold_release` of one hold, with no successor.
    fn release(&self, owner: &str, token: i64, op: &str) -> Vec<i64> {
        ints(self.release_raw(owner, token, op, false, None))
    }

    /// `hold_release` of one hold that may hand the lock to `to` = (owner, waiter id).
    fn hand_over(&self, owner: &str, token: i64, op: &str, to: (&str, &str)) -> Vec<i64> {
        ints(self.release_raw(owner, token, op, false, Some(to)))
    }

    /// `hold_leave` of `waiter`; the raw reply.
    fn leave_raw(&self, waiter: &str) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.leave,
            &KEYS,
            &["", "", "", waiter, &window, self.mode, "1000", LOCK_ID],
        )
    }

    fn leave(&self, waiter: &str) -> Vec<i64> {
        ints(self.leave_raw(waiter))
    }

    /// `hold_force_unlock`; the raw reply.
    fn force_raw(&self) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.force,
            &KEYS,
            &["", "", "", "", &window, self.mode, "1000", LOCK_ID],
        )
    }

    fn force_unlock(&self) -> Vec<i64> {
        ints(self.force_raw())
    }

    /// `hold_heartbeat` (a batch): for each (hold key, waiter ids) of `locks`, the key in KEYS
    /// and the count and the ids in ARGV; the raw reply.
    fn heartbeat_raw(&self, locks: &[(&str, &[&str])]) -> Resp {
        let keys: Vec<&str> = locks.iter().map(|(hold, _)| *hold).collect();
        let counts: Vec<String> = locks.iter().map(|(_, ids)| ids.len().to_string()).collect();
        let mut args = Vec::new();
        for ((_, ids), count) in locks.iter().zip(&counts) {
            args.push(count.as_str());
            args.extend(ids.iter().copied());
        }
        self.eval(&self.heartbeat, &keys, &args)
    }

    /// The hold hash, every field (panics on a missing or an unknown field).
    fn hash(&self) -> HoldHash {
        let items = self.server.cmd(&["HGETALL", HOLD]).as_array();
        let mut fields: BTreeMap<String, String> = items
            .chunks(2)
            .map(|pair| {
                (
                    pair[0].as_str().expect("a field name"),
                    pair[1].as_str().expect("a field value"),
                )
            })
            .collect();
        let mut take = |name: &str| {
            fields
                .remove(name)
                .unwrap_or_else(|| panic!("hold hash lacks {name}"))
        };
        let hash = HoldHash {
            o: take("o"),
            c: take("c"),
            f: take("f"),
            l: take("l"),
            r: take("r"),
            x: take("x"),
            h: take("h"),
            q: take("q"),
            g: take("g"),
        };
        assert!(fields.is_empty(), "unknown fields in the hold: {fields:?}");
        hash
    }

    /// The hold's remaining time in ms.
    fn pttl(&self) -> i64 {
        self.server.cmd(&["PTTL", HOLD]).as_int()
    }

    /// The hold's token (field `f`).
    fn token(&self) -> i64 {
        let f = self.hash().f;
        f.parse()
            .unwrap_or_else(|e| panic!("the hold's token {f:?}: {e}"))
    }

    /// The server clock in µs.
    fn clock(&self) -> i64 {
        server_micros(self.server)
    }

    /// Sets the hold's token `f` [`AHEAD`] of the server clock (the hash's other fields and ttl
    /// kept) and returns it: the next token drawn from the hash is exactly one above it.
    fn push_ahead(&self) -> i64 {
        let token = self.clock() + AHEAD;
        self.server.cmd(&["HSET", HOLD, "f", &token.to_string()]);
        assert_eq!(self.token(), token);
        token
    }

    /// Asserts the hold hash is `expected` and lasts at most `most` ms (more than 0).
    fn assert_hold(&self, expected: &HoldHash, most: i64, what: &str) {
        assert_eq!(&self.hash(), expected, "{what}");
        let pttl = self.pttl();
        assert!(
            pttl > 0 && pttl <= most,
            "{what}: ttl {pttl} ms, at most {most}"
        );
    }

    /// The DUMP of every key the hold scripts may touch, and of `more`.
    fn dump(&self, more: &[&str]) -> Vec<Option<Vec<u8>>> {
        let mut keys = KEYS.to_vec();
        keys.push(SEQ);
        keys.extend(more);
        dump_keys(self.server, &keys)
    }

    /// Every event in `owner`'s inbox stream, oldest first.
    fn inbox_events(&self, owner: &str) -> Vec<String> {
        self.server
            .cmd(&["XRANGE", &inbox(owner), "-", "+"])
            .as_array()
            .iter()
            .map(|entry| {
                let fields = entry.as_array()[1].as_array();
                assert_eq!(fields.len(), 2, "one field per entry: {fields:?}");
                assert_eq!(fields[0].as_str().as_deref(), Some("e"), "{fields:?}");
                fields[1].as_str().expect("an event string")
            })
            .collect()
    }

    /// Runs `inbox_keep` for the inboxes of `owners`, as their clients' readers do.
    fn open_inboxes(&self, owners: &[&str]) {
        let inboxes: Vec<String> = owners.iter().map(|owner| inbox(owner)).collect();
        let inboxes: Vec<&str> = inboxes.iter().map(String::as_str).collect();
        let kept = keep_inboxes(self.server, &inboxes, "30000");
        assert_eq!(ints(kept), vec![owners.len() as i64]);
    }

    /// Asserts that no script call created a key it has no business with: the unused marker
    /// position and the shard's event stream and counter (grants go to inboxes only).
    fn assert_no_stray_keys(&self) {
        for key in [MARKER, EVENTS, SEQ] {
            assert!(!exists(self.server, key), "{key} was created");
        }
    }
}

/// `inbox_keep.lua` (no library) on `inboxes` with the ttl `ttl` ms; the raw reply.
fn keep_inboxes(server: &RedisServer, inboxes: &[&str], ttl: &str) -> Resp {
    let script = composed(&[], include_str!("../lua/inbox_keep.lua"));
    let count = inboxes.len().to_string();
    let mut command = vec!["EVAL", script.as_str(), &count];
    command.extend(inboxes);
    command.push(ttl);
    server.cmd(&command)
}

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
    let inspect = composed(&[], include_str!("../lua/hold_inspect.lua"));
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

/// A reply array of integers, to compare with a raw reply.
fn ints_of(values: &[i64]) -> Resp {
    Resp::Array(Some(values.iter().map(|&v| Resp::Int(v)).collect()))
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
/// Stream mode: a release that frees the lock grants it to the first queued waiter whose
/// client's inbox stream exists (`inbox_keep.lua` keeps it): the hold in the waiter's name
/// (token max(f + 1, clock), its grant ms = min(lease, waiter lease) as l and as the hold's
/// ttl, its waiter id as r), and one event `0|grant|<waiter>,<token>,<grant ms>|<lock id>` into
/// that inbox alone. Waiters with no inbox, or a foreign value there (left alone), are dropped
/// from the queue; the hold written in a dropped waiter's name is overwritten by the next
/// one's, or by the free when nobody is left (the tombstone keeps the token drawn for it). The
/// waiter's next attempt is answered with the grant; a busy attempt is given the grant ms.
#[test]
fn a_release_grants_the_lock_to_the_first_waiter_whose_inbox_exists() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
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
            q: line("wd", "d", 2_000, 2_000),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant",
    );
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE)]);
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
    assert_eq!(lua.inbox_events("d"), [grant("wd", td, 2_000)]);
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
            line("wr", "r", LEASE, 0),
            line("ws", "s", LEASE, 0),
            line("wc", "c", LEASE, WAITER_LEASE),
            line("wz", "z", 2_000, 0),
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
            q: line("wz", "z", 2_000, 0),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant after r was woken",
    );
    assert_eq!(lua.inbox_events("r"), [wake("wr")]);
    assert_eq!(lua.inbox_events("c"), [grant("wc", tc, WAITER_LEASE)]);
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
            q: line("wd", "d", LEASE, WAITER_LEASE),
            ..granted("c", tc, WAITER_LEASE, "wc")
        },
        WAITER_LEASE,
        "c's grant (r woken, b has no subscriber)",
    );
    assert_eq!(next_message(), message("r", wake("wr")));
    assert_eq!(next_message(), message("c", grant("wc", tc, WAITER_LEASE)));

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
/// before anything is published, and no key changes. Pub/Sub shows it (PUBLISH itself is
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
    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(
        refused.error_message().is_some_and(|e| e.contains("OOM")),
        "{refused:?}"
    );
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
        Some(grant("wc", tc, WAITER_LEASE)),
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
        line("wb", "b", LEASE, WAITER_LEASE),
        line("wd", "d", LEASE, WAITER_LEASE),
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
    assert_eq!(lua.inbox_events("b"), [grant("wb", tb, WAITER_LEASE)]);
    assert_eq!(lua.inbox_events("d"), [grant("wd", td, WAITER_LEASE)]);
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
    assert_eq!(lua.inbox_events("b"), [grant("wb", tb, WAITER_LEASE)]);
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
    for (n, value) in [
        None,
        Some(format!("{t}|{OTHER_LAYOUT}")),
        Some("hello".to_owned()),
    ]
    .into_iter()
    .enumerate()
    {
        server.cmd(&["DEL", FENCE]);
        if let Some(value) = &value {
            server.cmd(&["SET", FENCE, value]);
        }
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
    // "<last>|<layout>") and values of another type are WRONGTYPE, and nothing changes.
    server.cmd(&["DEL", HOLD]);
    for value in ["hello", "12", "x12|stamp", "|stamp"] {
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
    server.cmd(&["DEL", HOLD]);
    server.cmd(&["SET", FENCE, &format!("100|{LAYOUT}")]);
    let clock = server_micros(&server);
    let taken = ints(lua.attempt(Ask::once("d", "d-take"), &fence_arg(false)));
    assert!(taken[1] >= clock, "{taken:?} below the clock {clock}");
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
    let renew_script = composed(&[], include_str!("../lua/hold_renew.lua"));
    let other = "{t:0}:mutex:y";
    let renew = |lease: i64, holds: &[(&str, &str, i64)]| {
        let lease = lease.to_string();
        let count = holds.len().to_string();
        let tokens: Vec<String> = holds.iter().map(|(_, _, t)| t.to_string()).collect();
        let mut command = vec!["EVAL", renew_script.as_str(), &count];
        command.extend(holds.iter().map(|(key, _, _)| *key));
        command.push(&lease);
        for ((_, owner, _), token) in holds.iter().zip(&tokens) {
            command.push(owner);
            command.push(token);
        }
        ints(server.cmd(&command))
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
    let acquire_on = |hold: &str, ask: Ask| {
        let (lease, waiter_lease) = (ask.lease.to_string(), ask.waiter_lease.to_string());
        let inbox_tag = tag(ask.owner);
        let create = fence_arg(true);
        ints(lua.eval(
            &lua.acquire,
            &[hold, MARKER, FENCE],
            &[
                ask.owner,
                &lease,
                ask.op,
                ask.waiter,
                &waiter_lease,
                &inbox_tag,
                &create,
            ],
        ))
    };
    let release_on = |hold: &str, owner: &str, token: i64, op: &str, to: (&str, &str)| {
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let (lease, streak) = (SUCCESSOR_LEASE.to_string(), STREAK.to_string());
        let lock_id = hold.trim_start_matches("{t:0}:");
        ints(lua.eval(
            &lua.release,
            &[hold, MARKER, FENCE, EVENTS],
            &[
                owner, &token, op, "0", &window, "stream", "1000", lock_id, to.0, to.1, &lease,
                &streak,
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
            q: line("wc", "c", LEASE, WAITER_LEASE),
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
    let handed = release_on(Y, "e", te, "e-release", ("h", "wh"));
    assert_eq!(
        (handed.len(), handed[0], handed[1]),
        (3, 1, 0),
        "{handed:?}"
    );
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
        [format!("0|grant|wn,{tn},{WAITER_LEASE}|mutex:z")]
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
    let renew = composed(&[], include_str!("../lua/hold_renew.lua"));
    let inspect = composed(&[], include_str!("../lua/hold_inspect.lua"));
    lua.open_inboxes(&["b"]);
    server.cmd(&["SET", FENCE, &format!("17|{LAYOUT}")]);
    let inbox_b = inbox("b");
    for kind in ["string", "list", "set", "zset", "stream"] {
        server.cmd(&["DEL", HOLD]);
        match kind {
            "string" => server.cmd(&["SET", HOLD, "planted"]),
            "list" => server.cmd(&["RPUSH", HOLD, "p"]),
            "set" => server.cmd(&["SADD", HOLD, "m"]),
            "zset" => server.cmd(&["ZADD", HOLD, "1", "m"]),
            _ => server.cmd(&["XADD", HOLD, "*", "o", "a"]),
        };
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
                server.cmd(&["EVAL", &renew, "1", HOLD, "30000", "a", "17"]),
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
    server.cmd(&["XADD", &first, "*", "e", "0|grant|w,1,3000|mutex:x"]);
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
// the queue scripts (read-write lock)
// ---------------------------------------------------------------------------

/// The keys of read-write lock `x` under prefix `t` (one shard), in the order its scripts take
/// them (`lua/README.md`): hold, readers, fence, events, seq, queue, alive.
const RW_X_KEYS: [&str; 7] = [
    "{t:0}:rw:x",
    "{t:0}:rw.readers:x",
    "{t:0}:fence",
    "{t:events}",
    "{t:events}:seq",
    "{t:0}:rw.queue:x",
    "{t:0}:rw.alive:x",
];

/// The queue scripts serve only the read-write lock (the exclusive locks keep their queue in
/// their hash) and take the kind as an argument, not from the lock id: any other kind, "fair"
/// included, is refused before anything changes, in `queue_leave` and in `queue_heartbeat`
/// alike.
#[test]
fn queue_scripts_refuse_an_unknown_kind_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let libraries = [QUEUE_LIB, NOTIFY_LIB, RW_LIB];
    let acquire = composed(
        &[FENCE_LIB, QUEUE_LIB, NOTIFY_LIB, RW_LIB],
        include_str!("../lua/rw_acquire.lua"),
    );
    let leave = composed(&libraries, include_str!("../lua/queue_leave.lua"));
    let heartbeat = composed(&libraries, include_str!("../lua/queue_heartbeat.lua"));
    let [hold, readers, _, events, seq, queue, alive] = RW_X_KEYS;
    let eval = |script: &str, keys: &[&str], args: &[&str]| {
        let count = keys.len().to_string();
        let mut command = vec!["EVAL", script, &count];
        command.extend(keys);
        command.extend(args);
        server.cmd(&command)
    };
    let create = fence_arg(true);
    let write = |owner: &str, waiter: &str| {
        ints(eval(
            &acquire,
            &RW_X_KEYS,
            &[
                owner, "30000", waiter, waiter, "3000", "stream", "1000", "rw:x", "write", "5000",
                &create,
            ],
        ))
    };
    let leave_queue = |waiter: &str, kind: &str| {
        eval(
            &leave,
            &RW_X_KEYS,
            &["", "", "", waiter, "", "stream", "1000", "rw:x", kind],
        )
    };
    let beat = |kind: &str| {
        eval(
            &heartbeat,
            &[hold, readers, queue, alive, events, seq],
            &["3000", "stream", "1000", kind, "rw:x", "1", "wb"],
        )
    };
    // a holds the write lock, b waits.
    assert_eq!(write("a", "wa")[0], 1);
    assert_eq!(write("b", "wb")[0], 0);
    let before = dump_keys(&server, &RW_X_KEYS);
    for kind in ["", "fair", "mutex", "RW", "rw:", "fair:x"] {
        for refused in [leave_queue("wb", kind), beat(kind)] {
            assert!(
                refused
                    .error_message()
                    .is_some_and(|e| e.contains("unknown lock kind")),
                "{kind:?}: {refused:?}"
            );
            assert_eq!(
                dump_keys(&server, &RW_X_KEYS),
                before,
                "{kind:?}: a key changed"
            );
        }
    }
    assert_eq!(ints(beat("rw")), vec![1]);
    assert_eq!(ints(leave_queue("wb", "rw")), vec![1]);
    assert_eq!(ints(leave_queue("wb", "rw")), vec![0]);
}
