//! The Lua protocol itself: the scripts as `src/scripts.rs` composes them, run with `EVAL` on
//! the keys of one lock, with KEYS and ARGV in the canonical order of `lua/README.md`. A real
//! redis-server; no client of the crate in between, so each test can replay, drop or re-send a
//! single script call and look at every key after it.

mod support;

use support::{composed, init_tracing, RedisServer, Resp};

const HOLD_LIB: &str = include_str!("../lua/lib/hold.lua");
const FENCE_LIB: &str = include_str!("../lua/lib/fence.lua");
const QUEUE_LIB: &str = include_str!("../lua/lib/queue.lua");
const NOTIFY_LIB: &str = include_str!("../lua/lib/notify.lua");
const FAIR_LIB: &str = include_str!("../lua/lib/fair.lua");
const RW_LIB: &str = include_str!("../lua/lib/rw.lua");

/// The layout stamp the tests pass in their fence argument (any fixed string works: the
/// scripts only compare it with the fence key's stamp).
const LAYOUT: &str = "v-test shards=1 notification=stream";

/// The fence argument `"<0|1><layout>"` (`lua/lib/fence.lua`): `create` lets a script create a
/// missing fence key (a client passes it only after checking the layout record; a release
/// never does).
fn fence_arg(create: bool) -> String {
    format!("{}{LAYOUT}", u8::from(create))
}

/// A reply that must be an array of integers.
fn ints(reply: Resp) -> Vec<i64> {
    assert!(!reply.is_error(), "{reply:?}");
    reply.as_array().iter().map(Resp::as_int).collect()
}

/// The DUMP of each key, for "nothing changed" checks.
fn dump_keys(server: &RedisServer, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    keys.iter()
        .map(|key| server.cmd(&["DUMP", key]).as_bytes())
        .collect()
}

/// A fence key's value, `"<last token>|<layout>"`.
fn fence_value(server: &RedisServer, fence: &str) -> Option<String> {
    server.cmd(&["GET", fence]).as_str()
}

/// Every fencing token issued in one shard, checked to strictly increase.
#[derive(Default)]
struct Tokens(Vec<i64>);

impl Tokens {
    /// Records a newly issued `token`: above every earlier one.
    fn issued(&mut self, token: i64, what: &str) -> i64 {
        assert!(
            self.0.iter().all(|&earlier| token > earlier),
            "{what}: token {token} not above every earlier one {:?}",
            self.0
        );
        self.0.push(token);
        token
    }
}

/// The keys of fair lock `x` under prefix `t` (one shard), in the order its scripts take them
/// (`lua/README.md`): hold, bids, fence (the shard's, `lua/lib/fence.lua`), events, seq, queue,
/// alive.
const FAIR_X_KEYS: [&str; 7] = [
    "{t:0}:fair:x",
    "{t:0}:fair.bids:x",
    "{t:0}:fence",
    "{t:0}:events",
    "{t:0}:events:seq",
    "{t:0}:fair.queue:x",
    "{t:0}:fair.alive:x",
];

/// The fair lock's scripts (and the shared `queue_leave`) run with `EVAL` on [`FAIR_X_KEYS`].
struct LuaFair<'a> {
    server: &'a RedisServer,
    acquire: String,
    release: String,
    leave: String,
}

impl<'a> LuaFair<'a> {
    fn new(server: &'a RedisServer) -> Self {
        let granting = [HOLD_LIB, FENCE_LIB, QUEUE_LIB, NOTIFY_LIB, FAIR_LIB];
        LuaFair {
            server,
            acquire: composed(&granting, include_str!("../lua/fair_acquire.lua")),
            release: composed(&granting, include_str!("../lua/fair_release.lua")),
            leave: composed(
                &[QUEUE_LIB, NOTIFY_LIB, RW_LIB],
                include_str!("../lua/queue_leave.lua"),
            ),
        }
    }

    fn eval(&self, script: &str, args: &[&str]) -> Resp {
        let count = FAIR_X_KEYS.len().to_string();
        let mut command = vec!["EVAL", script, &count];
        command.extend(FAIR_X_KEYS);
        command.extend(args);
        self.server.cmd(&command)
    }

    /// `fair_acquire` (lease 30 s) with the inbox tag `inbox` and the fence argument
    /// `fence_arg`; the raw reply.
    fn attempt(
        &self,
        owner: &str,
        op: &str,
        waiter: &str,
        waiter_lease: &str,
        inbox: &str,
        fence_arg: &str,
    ) -> Resp {
        self.eval(
            &self.acquire,
            &[
                owner,
                "30000",
                op,
                waiter,
                waiter_lease,
                "stream",
                "1000",
                "fair:x",
                inbox,
                fence_arg,
            ],
        )
    }

    /// `fair_release` of one hold; a release never may create the fence key (the client
    /// passes 0).
    fn give_back(&self, owner: &str, token: &str, op: &str) -> Resp {
        let no_create = fence_arg(false);
        self.eval(
            &self.release,
            &[
                owner, token, op, "0", "5000", "stream", "1000", "fair:x", &no_create,
            ],
        )
    }

    /// `queue_leave` of `waiter`, for a lock of kind `kind`.
    fn leave(&self, waiter: &str, kind: &str) -> Resp {
        self.eval(
            &self.leave,
            &["", "", "", waiter, "", "stream", "1000", "fair:x", kind],
        )
    }
}

/// The hand-off protocol at the Lua level (`lua/lib/fair.lua`), step by step: a release grants
/// the lock to the live head (its owner, its waiter id as op id, a lease no longer than what is
/// left of its waiter lease, the next fencing token) and emits one `grant` event; a head whose
/// event was lost is answered "acquired" by its next attempt without a second hold level; a
/// head that gives up frees the grant it never took up; re-sent releases stay answered. The
/// shard's fence key (`lua/lib/fence.lua`) refuses to issue a token when it is missing (unless
/// the call may create it) or stamped with another layout, and a release then only names the
/// head instead of granting.
#[test]
fn a_release_grants_the_lock_to_the_live_head_in_one_script() {
    init_tracing();
    let server = RedisServer::start();
    let lua = LuaFair::new(&server);
    let [hold, bids, fence, events, _, queue, alive] = FAIR_X_KEYS;
    // Grants go to the inbox of the head's client alone (the bid's tag, "in-<owner>" here).
    let attempt = |owner: &str, op: &str, waiter: &str, waiter_lease: &str, fence_arg: &str| {
        lua.attempt(
            owner,
            op,
            waiter,
            waiter_lease,
            &format!("in-{owner}"),
            fence_arg,
        )
    };
    let try_take = |owner: &str, op: &str, waiter: &str, waiter_lease: &str| {
        ints(attempt(owner, op, waiter, waiter_lease, &fence_arg(true)))
    };
    let give_back =
        |owner: &str, token: i64, op: &str| ints(lua.give_back(owner, &token.to_string(), op));
    let leave_queue = |waiter: &str| ints(lua.leave(waiter, "fair"));
    let field = |name: &str| server.cmd(&["HGET", hold, name]).as_str();
    let held_token = || -> i64 {
        field("f")
            .expect("a hold")
            .parse()
            .expect("a numeric token")
    };
    let inbox = |owner: &str| format!("{events}:to:in-{owner}");
    let last_grant = |owner: &str| server.last_event(&inbox(owner));
    let dump = || dump_keys(&server, &FAIR_X_KEYS);
    // Every token issued so far (they strictly increase: one shard).
    let mut tokens = Tokens::default();
    let mut issued = |token: i64, what: &str| {
        tokens.issued(token, what);
    };

    // The shard's first token: a call that may not create the fence key is refused, and so is
    // a fence key stamped with another layout; neither changes anything.
    let refused = attempt("a", "a-take", "wa", "3000", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(dump(), vec![None; FAIR_X_KEYS.len()], "a key was written");
    server.cmd(&["SET", fence, "17|v-other shards=2 notification=stream"]);
    let stamped = dump();
    for create in [false, true] {
        let refused = attempt("a", "a-take", "wa", "3000", &fence_arg(create));
        assert_eq!(
            refused.error_message(),
            Some("FLFENCE layout v-other shards=2 notification=stream"),
            "{refused:?}"
        );
        assert_eq!(dump(), stamped, "a key changed");
    }
    server.cmd(&["DEL", fence]);

    let taken = try_take("a", "a-take", "wa", "3000");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_a = taken[1];
    issued(token_a, "a");
    assert_eq!(
        fence_value(&server, fence),
        Some(format!("{token_a}|{LAYOUT}"))
    );
    // A retry of the same call is answered with the same token.
    assert_eq!(try_take("a", "a-take", "wa", "3000"), vec![1, token_a, 1]);
    let busy = try_take("b", "b-try", "wb", "3000");
    assert_eq!((busy.len(), busy[0]), (3, 0), "b queues: {busy:?}");
    assert_eq!(
        server.cmd(&["HGET", bids, "wb"]).as_str().as_deref(),
        Some("30000|in-b|b")
    );

    // a's release grants the lock to b, the head: b's owner, b's waiter id, the next token,
    // and no longer than b's waiter lease. The queue is empty and one `grant` event names b.
    assert_eq!(give_back("a", token_a, "a-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("b"));
    assert_eq!(field("r").as_deref(), Some("wb"));
    let token_b = held_token();
    issued(token_b, "b's grant");
    assert_eq!(
        fence_value(&server, fence),
        Some(format!("{token_b}|{LAYOUT}"))
    );
    assert_eq!(field("c").as_deref(), Some("1"));
    let lasts = server.cmd(&["PTTL", hold]).as_int();
    assert!(lasts > 0 && lasts <= 3000, "granted for {lasts} ms");
    assert_eq!(server.cmd(&["LLEN", queue]).as_int(), 0);
    assert_eq!(server.cmd(&["EXISTS", alive, bids]).as_int(), 0);
    let (rule, target) = last_grant("b");
    assert_eq!(rule, "grant");
    assert_eq!(
        server.cmd(&["XLEN", events]).as_int(),
        0,
        "nothing on the stream every process reads"
    );
    // The inbox numbers its events itself (its reader checks them for gaps); the inbox and
    // its counter expire.
    let counter = format!("{}:seq", inbox("b"));
    assert_eq!(
        server.cmd(&["GET", &counter]).as_str().as_deref(),
        Some("1")
    );
    for key in [inbox("b"), counter] {
        let ttl = server.cmd(&["PTTL", &key]).as_int();
        assert!(ttl > 0 && ttl <= 300_000, "{key}: {ttl}");
    }
    let parts: Vec<&str> = target.split(',').collect();
    let token_b_text = token_b.to_string();
    assert_eq!(
        (parts.len(), parts[0], parts[1]),
        (4, "wb", token_b_text.as_str()),
        "{target}"
    );

    // b never saw the event: its next attempt (another op) is answered with the grant (the
    // same token), and the hold count stays 1.
    let answered = try_take("b", "b-recheck", "wb", "3000");
    assert_eq!(answered[..3], [1, token_b, 1], "{answered:?}");
    assert!(answered[3] > 0 && answered[3] <= 3000, "{answered:?}");
    assert_eq!(field("c").as_deref(), Some("1"));
    // a's release, re-sent after the grant, is still answered "released"; b is unharmed.
    assert_eq!(give_back("a", token_a, "a-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("b"));
    assert_eq!(held_token(), token_b);

    // c queues; b's release grants to c; c gives up before taking it up: the hold is freed,
    // the tombstone of b's release stays, and b's re-sent release is still answered.
    let busy = try_take("c", "c-try", "wc", "3000");
    assert_eq!(busy[0], 0);
    assert_eq!(give_back("b", token_b, "b-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("c"));
    let token_c = held_token();
    issued(token_c, "c's grant");
    assert_eq!(leave_queue("wc"), vec![1]);
    assert_eq!(field("o"), None, "the unused grant is freed");
    // The tombstone keeps the ids of the releases that freed the lock, b's first.
    let freed_by = field("x").unwrap_or_default();
    assert_eq!(freed_by.split(',').next(), Some("b-release"), "{freed_by}");
    assert_eq!(give_back("b", token_b, "b-release"), vec![1, 0]);
    // Giving up took no token.
    assert_eq!(
        fence_value(&server, fence),
        Some(format!("{token_c}|{LAYOUT}"))
    );

    // A head whose waiter lease is short gets the lock for no longer than that lease.
    let taken = try_take("d", "d-take", "wd", "3000");
    assert_eq!(taken[0], 1);
    let token_d = taken[1];
    issued(token_d, "d");
    assert_eq!(try_take("e", "e-try", "we", "200")[0], 0);
    assert_eq!(give_back("d", token_d, "d-release"), vec![1, 0]);
    assert_eq!(field("o").as_deref(), Some("e"));
    let token_e = held_token();
    issued(token_e, "e's grant");
    let lasts = server.cmd(&["PTTL", hold]).as_int();
    assert!(lasts > 0 && lasts <= 200, "granted for {lasts} ms");
    assert_eq!(server.cmd(&["EXISTS", queue, alive, bids]).as_int(), 0);
    assert_eq!(last_grant("e").0, "grant");
    assert_eq!(give_back("e", token_e, "e-release"), vec![1, 0]);

    // A foreign value under the head's inbox, or under its counter, is left alone, and the
    // grant goes to the shared stream instead: nothing is lost.
    let foreign = [inbox("g"), format!("{}:seq", inbox("h"))];
    for key in &foreign {
        server.cmd(&["SADD", key, "foreign"]);
    }
    let taken = try_take("f", "f-take", "wf", "3000");
    assert_eq!(taken[0], 1);
    let mut token = taken[1];
    issued(token, "f");
    // f's release grants to g (foreign inbox), g's to h (foreign counter).
    for (holder, next) in [("f", "g"), ("g", "h")] {
        assert_eq!(
            try_take(next, &format!("{next}-try"), &format!("w{next}"), "3000")[0],
            0
        );
        assert_eq!(
            give_back(holder, token, &format!("{holder}-release")),
            vec![1, 0]
        );
        assert_eq!(field("o").as_deref(), Some(next));
        token = held_token();
        issued(token, &format!("{next}'s grant"));
        let (rule, target) = server.last_event(events);
        let head = format!("w{next}");
        let token_text = token.to_string();
        assert_eq!(
            (rule.as_str(), target.split(',').next()),
            ("grant", Some(head.as_str()))
        );
        assert_eq!(target.split(',').nth(1), Some(token_text.as_str()));
    }
    for key in &foreign {
        let kept = server.cmd(&["SMEMBERS", key]).as_array();
        assert_eq!(kept.len(), 1, "{key}: {kept:?}");
    }
    assert_eq!(server.cmd(&["EXISTS", &inbox("h")]).as_int(), 0);
    assert_eq!(give_back("h", token, "h-release"), vec![1, 0]);

    // A release that finds the fence key missing (a data loss) or stamped with another layout
    // issues no token: it frees the lock and only names the head (rule `name`), whose own
    // attempt then needs a token from a fence key it may create (after the layout check).
    let taken = try_take("i", "i-take", "wi", "3000");
    assert_eq!(taken[0], 1);
    let token_i = taken[1];
    issued(token_i, "i");
    assert_eq!(try_take("j", "j-try", "wj", "3000")[0], 0);
    server.cmd(&["DEL", fence]);
    assert_eq!(give_back("i", token_i, "i-release"), vec![1, 0]);
    assert_eq!(field("o"), None, "no grant without a token");
    assert_eq!(server.cmd(&["EXISTS", fence]).as_int(), 0, "fence created");
    assert_eq!(
        server.last_event(events),
        ("name".to_owned(), "wj".to_owned())
    );
    assert_eq!(
        server.cmd(&["LINDEX", queue, "0"]).as_str().as_deref(),
        Some("wj")
    );
    let before = dump();
    let refused = attempt("j", "j-retry", "wj", "3000", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(dump(), before, "a refused attempt changed a key");
    let taken = try_take("j", "j-retry", "wj", "3000");
    assert_eq!(taken[0], 1, "{taken:?}");
    let token_j = taken[1];
    // The fence key was lost: the new one starts from the server clock, above every token
    // issued before (as long as the clock does not step back).
    issued(token_j, "j after the loss");
    assert_eq!(server.cmd(&["LLEN", queue]).as_int(), 0);

    assert_eq!(try_take("k", "k-try", "wk", "3000")[0], 0);
    let other = format!("{token_j}|v-other shards=2 notification=stream");
    server.cmd(&["SET", fence, &other]);
    assert_eq!(give_back("j", token_j, "j-release"), vec![1, 0]);
    assert_eq!(field("o"), None, "no grant under another layout");
    assert_eq!(server.cmd(&["GET", fence]).as_str(), Some(other.clone()));
    assert_eq!(
        server.last_event(events),
        ("name".to_owned(), "wk".to_owned())
    );
    let before = dump();
    let refused = attempt("k", "k-retry", "wk", "3000", &fence_arg(true));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE layout v-other shards=2 notification=stream"),
        "{refused:?}"
    );
    assert_eq!(dump(), before, "a refused attempt changed a key");
}

/// The fair scripts check each key's type before their first write, mostly through typed reads
/// instead of `TYPE` calls (`lua/fair_release.lua`, `lua/lib/queue.lua`). For every key a
/// release (that grants the lock to a queued head) and a queueing attempt touch: with a foreign
/// value there, the script fails with WRONGTYPE and no key changes, neither ours nor the
/// foreign one.
#[test]
fn fair_scripts_refuse_a_foreign_key_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let lua = LuaFair::new(&server);
    let [hold, bids, fence, events, seq, queue, alive] = FAIR_X_KEYS;
    let all = FAIR_X_KEYS;
    let create = fence_arg(true);
    let attempt =
        |owner: &str, waiter: &str| lua.attempt(owner, waiter, waiter, "3000", "", &create);
    let give_back = |owner: &str, token: &str| lua.give_back(owner, token, "a-release");
    let dump = || dump_keys(&server, &all);
    // A foreign value of a type none of our keys has; at the fence key also strings that are
    // not "<token>|<layout>".
    let plant = |key: &str, value: &str| {
        server.cmd(&["DEL", key]);
        if value.is_empty() {
            server.cmd(&["SADD", key, "foreign"]);
        } else {
            server.cmd(&["SET", key, value]);
        }
    };
    let mut last_token = 0;
    for key in all {
        let values: &[&str] = if key == fence {
            &["", "hello", "12"]
        } else {
            &[""]
        };
        for &value in values {
            for &(script, queued) in &[("release", true), ("release", false), ("acquire", true)] {
                server.cmd(&["DEL", hold, queue, alive, bids, events, seq]);
                // a holds the lock; with `queued`, b waits at the head of the queue.
                let taken = attempt("a", "wa").as_array();
                assert_eq!(taken[0].as_int(), 1, "{taken:?}");
                let token = taken[1].as_int();
                assert!(token > last_token, "token {token} after {last_token}");
                last_token = token;
                if queued {
                    assert_eq!(attempt("b", "wb").as_array()[0].as_int(), 0);
                }
                server.cmd(&["XADD", events, "*", "k", "v"]); // so that the stream exists
                plant(key, value);
                let before = dump();
                let reply = match script {
                    "release" => give_back("a", &token.to_string()),
                    _ => attempt("c", "wc"),
                };
                let what = format!("{script} (queued: {queued}) with a foreign {key} {value:?}");
                // Keys a call does not need stay unread: a release nobody waits for needs only
                // the hold and the queue; an attempt on a held lock never needs the fence or
                // the events.
                let needed = match (script, queued) {
                    ("release", false) => [hold, queue].contains(&key),
                    ("acquire", _) => ![fence, events, seq].contains(&key),
                    _ => true,
                };
                if needed {
                    assert!(
                        reply
                            .error_message()
                            .is_some_and(|e| e.contains("WRONGTYPE")),
                        "{what}: {reply:?}"
                    );
                    assert_eq!(dump(), before, "{what}: a key changed");
                } else {
                    assert!(!reply.is_error(), "{what}: {reply:?}");
                    let at = all.iter().position(|k| *k == key).unwrap_or_default();
                    assert_eq!(dump()[at], before[at], "{what}: the foreign value changed");
                }
                if key == fence {
                    // The next round's first token comes from a fence key created anew.
                    server.cmd(&["DEL", fence]);
                }
            }
        }
    }
}

/// The barging mutex's scripts as `src/scripts.rs` composes them, run with `EVAL` on the keys
/// of one lock (`mutex:x`, shard 0 of prefix `t`), for tests of the Lua protocol itself.
struct LuaMutex<'a> {
    server: &'a RedisServer,
    acquire: String,
    release: String,
}

impl<'a> LuaMutex<'a> {
    const HOLD: &'static str = "{t:0}:mutex:x";
    const WAIT: &'static str = "{t:0}:mutex.wait:x";
    /// The shard's fence key (`lua/lib/fence.lua`).
    const FENCE: &'static str = "{t:0}:fence";
    /// Every key of the lock, in the order its scripts take them (`lua/README.md`): hold,
    /// marker, fence, events, seq.
    const KEYS: [&'static str; 5] = [
        Self::HOLD,
        Self::WAIT,
        Self::FENCE,
        "{t:events}",
        "{t:events}:seq",
    ];

    fn new(server: &'a RedisServer) -> Self {
        LuaMutex {
            server,
            acquire: composed(
                &[HOLD_LIB, FENCE_LIB],
                include_str!("../lua/mutex_acquire.lua"),
            ),
            release: composed(
                &[HOLD_LIB, FENCE_LIB, NOTIFY_LIB],
                include_str!("../lua/mutex_release.lua"),
            ),
        }
    }

    /// `mutex_acquire` for `owner` with op id `op` and waiter id `waiter` ("" for a try), with
    /// the fence argument `fence_arg`; the raw reply.
    fn attempt(&self, owner: &str, op: &str, waiter: &str, fence_arg: &str) -> Resp {
        let [hold, wait, fence, ..] = Self::KEYS;
        self.server.cmd(&[
            "EVAL",
            &self.acquire,
            "3",
            hold,
            wait,
            fence,
            owner,
            "30000",
            op,
            waiter,
            "0",
            "0",
            fence_arg,
        ])
    }

    /// `mutex_acquire` that may create the fence key (as after the layout check).
    fn take(&self, owner: &str, op: &str, waiter: &str) -> Vec<i64> {
        ints(self.attempt(owner, op, waiter, &fence_arg(true)))
    }

    /// `mutex_release`, handing over to `to` = (owner, waiter id) if given (lease 20 s, at most
    /// 2 hand-overs in a row).
    fn give(&self, owner: &str, token: i64, op: &str, to: Option<(&str, &str)>) -> Vec<i64> {
        let (next, waiter) = to.unwrap_or(("", ""));
        let [hold, wait, fence, events, seq] = Self::KEYS;
        ints(self.server.cmd(&[
            "EVAL",
            &self.release,
            "5",
            hold,
            wait,
            fence,
            events,
            seq,
            owner,
            &token.to_string(),
            op,
            "0",
            "5000",
            "stream",
            "1000",
            "mutex:x",
            next,
            waiter,
            "20000",
            "2",
            &fence_arg(false),
        ]))
    }

    fn field(&self, name: &str) -> Option<String> {
        self.server.cmd(&["HGET", Self::HOLD, name]).as_str()
    }

    /// The token of the current hold.
    fn held_token(&self) -> i64 {
        self.field("f")
            .expect("a hold")
            .parse()
            .expect("a numeric token")
    }

    /// The fence key's value, `"<last token>|<layout>"`.
    fn fence(&self) -> Option<String> {
        fence_value(self.server, Self::FENCE)
    }

    /// The DUMP of each key of the lock, for "nothing changed" checks.
    fn dump(&self) -> Vec<Option<Vec<u8>>> {
        dump_keys(self.server, &Self::KEYS)
    }
}

/// fred re-sends the commands of a broken connection, so a release that freed the lock can
/// arrive a second time after another owner took it. The re-sent release (same op id) must be
/// answered "released", not "held by another", and must leave the new holder alone.
#[test]
fn a_release_resent_after_another_owner_took_the_lock_is_answered_released() {
    init_tracing();
    let server = RedisServer::start();
    let lua = LuaMutex::new(&server);
    let mut tokens = Tokens::default();
    let taken = lua.take("a", "a-take", "");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_a = tokens.issued(taken[1], "a");
    assert_eq!(lua.give("a", token_a, "a-release", None), vec![1, 0]);
    let taken = lua.take("b", "b-take", "");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_b = tokens.issued(taken[1], "b");
    // A retried take is answered with the same token.
    assert_eq!(lua.take("b", "b-take", ""), vec![1, token_b, 1]);
    // The re-sent release of a: answered as the release it was.
    assert_eq!(lua.give("a", token_a, "a-release", None), vec![1, 0]);
    assert_eq!(lua.field("o").as_deref(), Some("b"));
    assert_eq!(lua.field("c").as_deref(), Some("1"));
    // A new release by a (another op) is still refused: b holds the lock.
    assert_eq!(lua.give("a", token_a, "a-again", None), vec![-1, 0]);
    assert_eq!(lua.field("o").as_deref(), Some("b"));
    assert_eq!(lua.give("b", token_b, "b-release", None), vec![1, 0]);

    // The re-send takes a reconnect; hand-offs are faster. After several owners took and freed
    // the lock meanwhile (freed, handed over, freed...), the last releases that freed it (as
    // many ids as fit in 64 bytes: two of 30 characters, the length of the crate's op ids) are
    // still answered "released", and the holder is unharmed; older ones are not.
    let release = |n: usize| format!("{n:0>30}");
    let mut handed = None;
    for n in 0..6 {
        let (owner, next) = (format!("o{n}"), format!("o{}", n + 1));
        let token = match handed.take() {
            Some(token) => token,
            None => tokens.issued(lua.take(&owner, &format!("{owner}-take"), "")[1], &owner),
        };
        let to = (n % 2 == 0).then_some((next.as_str(), "w"));
        let given = lua.give(&owner, token, &release(n), to);
        assert_eq!(given[..2], [1, 0], "{owner}");
        handed = given
            .get(2)
            .map(|&token| tokens.issued(token, &format!("{next}'s hand-over")));
        assert_eq!(given.len(), if to.is_some() { 3 } else { 2 }, "{given:?}");
    }
    let taken = lua.take("last", "last-take", "");
    assert_eq!(taken[0], 1);
    tokens.issued(taken[1], "last");
    let holder = lua.field("o");
    for n in 0..6 {
        let resent = lua.give(&format!("o{n}"), 0, &release(n), None);
        let expected = if n >= 4 { vec![1, 0] } else { vec![-1, 0] };
        assert_eq!(resent, expected, "release {n}");
    }
    assert_eq!(lua.field("o"), holder, "the holder is unharmed");
}

/// The hand-over protocol at the Lua level (`lua/mutex_release.lua`): a release that frees the
/// lock may take it for a named successor (the next token, the successor's waiter id as op,
/// the streak counted in `h`); the successor's re-check is answered without a second level; a
/// re-sent release stays answered; after `cap` hand-overs in a row the lock is freed for all.
/// The shard's fence key (`lua/lib/fence.lua`) refuses a token when it is missing (unless the
/// call may create it) or stamped with another layout, changing nothing; a release then frees
/// the lock instead of handing it over.
#[test]
fn a_release_hands_the_lock_to_a_local_successor_at_most_cap_times_in_a_row() {
    init_tracing();
    let server = RedisServer::start();
    let lua = LuaMutex::new(&server);
    let hold = LuaMutex::HOLD;
    let mut tokens = Tokens::default();
    let layout = LAYOUT;
    let other_layout = "v-other shards=2 notification=stream";

    // The shard's first token: refused (and nothing written) unless the call may create the
    // fence key; refused under another layout's stamp whatever the call.
    let refused = lua.attempt("a", "a-take", "", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(lua.dump(), vec![None; 5], "a key was written");
    server.cmd(&["SET", LuaMutex::FENCE, &format!("17|{other_layout}")]);
    let stamped = lua.dump();
    for create in [false, true] {
        let refused = lua.attempt("a", "a-take", "", &fence_arg(create));
        let expected = format!("FLFENCE layout {other_layout}");
        assert_eq!(
            refused.error_message(),
            Some(expected.as_str()),
            "{refused:?}"
        );
        assert_eq!(lua.dump(), stamped, "a key changed");
    }
    server.cmd(&["DEL", LuaMutex::FENCE]);

    let taken = lua.take("a", "a-take", "");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_a = tokens.issued(taken[1], "a");
    assert_eq!(lua.fence(), Some(format!("{token_a}|{layout}")));
    let given = lua.give("a", token_a, "a-release", Some(("b", "wb")));
    assert_eq!((given.len(), given[0], given[1]), (3, 1, 0), "{given:?}");
    let token_b = tokens.issued(given[2], "b's hand-over");
    assert_eq!(lua.held_token(), token_b);
    assert_eq!(lua.fence(), Some(format!("{token_b}|{layout}")));
    assert_eq!(lua.field("o").as_deref(), Some("b"));
    assert_eq!(lua.field("r").as_deref(), Some("wb"));
    assert_eq!(lua.field("h").as_deref(), Some("1"));
    let lease = server.cmd(&["PTTL", hold]).as_int();
    assert!(
        lease > 15_000 && lease <= 20_000,
        "the successor's lease: {lease}"
    );
    // b never heard of it: its next attempt (another op, same waiter id) is answered, with
    // the same token.
    let answered = lua.take("b", "b-recheck", "wb");
    assert_eq!(answered[..3], [1, token_b, 1], "{answered:?}");
    assert_eq!(lua.field("c").as_deref(), Some("1"));
    // a's release, re-sent as fred re-sends the commands of a broken connection, still reports
    // the hand-over it made (else b would never learn of it); b is unharmed.
    assert_eq!(
        lua.give("a", token_a, "a-release", Some(("b", "wb"))),
        vec![1, 0, token_b]
    );
    assert_eq!(lua.field("c").as_deref(), Some("1"));
    // Re-sent with another successor (a later claim), it is only answered as released.
    assert_eq!(
        lua.give("a", token_a, "a-release", Some(("c", "wc"))),
        vec![1, 0]
    );
    assert_eq!(lua.field("o").as_deref(), Some("b"));
    assert_eq!(lua.held_token(), token_b);

    // Second hand-over in a row, then the cap (2): c's release frees the lock for everyone.
    let given = lua.give("b", token_b, "b-release", Some(("c", "wc")));
    assert_eq!((given.len(), given[0], given[1]), (3, 1, 0), "{given:?}");
    let token_c = tokens.issued(given[2], "c's hand-over");
    assert_eq!(lua.field("h").as_deref(), Some("2"));
    assert_eq!(
        lua.give("c", token_c, "c-release", Some(("d", "wd"))),
        vec![1, 0]
    );
    assert_eq!(lua.field("o"), None, "freed after two hand-overs in a row");
    assert_eq!(lua.fence(), Some(format!("{token_c}|{layout}")), "no token");
    // A fresh take starts a new streak.
    let taken = lua.take("d", "d-take", "wd");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let token_d = tokens.issued(taken[1], "d");
    assert_eq!(lua.field("h"), None);
    let given = lua.give("d", token_d, "d-release", Some(("e", "we")));
    assert_eq!((given.len(), given[0], given[1]), (3, 1, 0), "{given:?}");
    let token_e = tokens.issued(given[2], "e's hand-over");
    assert_eq!(lua.field("h").as_deref(), Some("1"));

    // The fence key is lost (a data loss): the release frees the lock instead of handing it
    // over, and does not create the key; the next take must be allowed to create it, and its
    // token (the server clock) is above every earlier one.
    server.cmd(&["DEL", LuaMutex::FENCE]);
    assert_eq!(
        lua.give("e", token_e, "e-release", Some(("f", "wf"))),
        vec![1, 0]
    );
    assert_eq!(lua.field("o"), None, "no hand-over without a token");
    assert_eq!(lua.fence(), None, "a release created the fence key");
    let before = lua.dump();
    let refused = lua.attempt("f", "f-take", "wf", &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(lua.dump(), before, "a refused take changed a key");
    let taken = lua.take("f", "f-take", "wf");
    assert_eq!(taken[0], 1, "{taken:?}");
    let token_f = tokens.issued(taken[1], "f after the loss");
    assert_eq!(lua.fence(), Some(format!("{token_f}|{layout}")));

    // A fence key stamped with another layout: no hand-over either, and no take.
    let stamp = format!("{token_f}|{other_layout}");
    server.cmd(&["SET", LuaMutex::FENCE, &stamp]);
    assert_eq!(
        lua.give("f", token_f, "f-release", Some(("g", "wg"))),
        vec![1, 0]
    );
    assert_eq!(lua.field("o"), None, "no hand-over under another layout");
    assert_eq!(lua.fence(), Some(stamp.clone()));
    let before = lua.dump();
    let refused = lua.attempt("g", "g-take", "wg", &fence_arg(true));
    let expected = format!("FLFENCE layout {other_layout}");
    assert_eq!(
        refused.error_message(),
        Some(expected.as_str()),
        "{refused:?}"
    );
    assert_eq!(lua.dump(), before, "a refused take changed a key");
}

/// The queue scripts serve the fair and the read-write lock and take the lock kind as an
/// argument, not from the lock id: an unknown kind is refused before anything changes, in
/// `queue_leave` and in `queue_heartbeat` alike.
#[test]
fn queue_scripts_refuse_an_unknown_kind_before_changing_anything() {
    init_tracing();
    let server = RedisServer::start();
    let lua = LuaFair::new(&server);
    let heartbeat = composed(
        &[QUEUE_LIB, NOTIFY_LIB, RW_LIB],
        include_str!("../lua/queue_heartbeat.lua"),
    );
    let [hold, bids, _, events, seq, queue, alive] = FAIR_X_KEYS;
    let beat = |kind: &str| {
        server.cmd(&[
            "EVAL", &heartbeat, "6", hold, bids, queue, alive, events, seq, "3000", "stream",
            "1000", kind, "fair:x", "1", "wb",
        ])
    };
    // a holds the lock, b waits.
    let taken = ints(lua.attempt("a", "a-take", "wa", "3000", "", &fence_arg(true)));
    assert_eq!(taken[0], 1, "{taken:?}");
    let busy = ints(lua.attempt("b", "b-try", "wb", "3000", "", &fence_arg(true)));
    assert_eq!(busy[0], 0, "{busy:?}");
    let before = dump_keys(&server, &FAIR_X_KEYS);
    for kind in ["", "mutex", "RW", "rw:", "fair:x"] {
        for refused in [lua.leave("wb", kind), beat(kind)] {
            assert!(
                refused
                    .error_message()
                    .is_some_and(|e| e.contains("unknown lock kind")),
                "{kind:?}: {refused:?}"
            );
            assert_eq!(
                dump_keys(&server, &FAIR_X_KEYS),
                before,
                "{kind:?}: a key changed"
            );
        }
    }
    assert_eq!(ints(beat("fair")), vec![1]);
    assert_eq!(ints(lua.leave("wb", "fair")), vec![1]);
    assert_eq!(ints(lua.leave("wb", "fair")), vec![0]);
}
