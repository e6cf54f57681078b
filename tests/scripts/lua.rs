//! The test harness: the composed scripts run with `EVAL`, the expected hash, the calls.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

pub(crate) use crate::support::queue_key;
use crate::support::{composed, exists, queue_members, RedisServer, Resp};

pub(crate) const HOLD_LIB: &str = include_str!("../../lua/lib/hold.lua");
pub(crate) const FENCE_LIB: &str = include_str!("../../lua/lib/fence.lua");
pub(crate) const NOTIFY_LIB: &str = include_str!("../../lua/lib/notify.lua");
pub(crate) const RW_LIB: &str = include_str!("../../lua/lib/rw.lua");

/// The layout stamp the tests pass in their fence argument (any fixed string works: the
/// scripts only compare it with the fence key's stamp).
pub(crate) const LAYOUT: &str = "v-test shards=1 notification=stream";
/// Another layout's stamp, as a client with another shard count would write it.
pub(crate) const OTHER_LAYOUT: &str = "v-other shards=2 notification=stream";

/// `EVAL script` with `keys` and `args` on `server`: the raw reply.
pub(crate) fn eval(server: &RedisServer, script: &str, keys: &[&str], args: &[&str]) -> Resp {
    let count = keys.len().to_string();
    let mut command = vec!["EVAL", script, &count];
    command.extend(keys);
    command.extend(args);
    server.cmd(&command)
}

/// The ARGV of a script without a call of its own (a leave: `waiter` at the waiter id's
/// place; a force unlock: `""`): the retry window and the event arguments.
pub(crate) fn no_call<'a>(
    waiter: &'a str,
    window: &'a str,
    mode: &'a str,
    lock_id: &'a str,
) -> [&'a str; 8] {
    ["", "", "", waiter, window, mode, "1000", lock_id]
}

/// The fence argument `"<0|1><layout>"` (`lua/lib/fence.lua`): `create` lets a script create a
/// missing fence key (a client passes it only after checking the layout record).
pub(crate) fn fence_arg(create: bool) -> String {
    format!("{}{LAYOUT}", u8::from(create))
}

/// `hold_renew.lua` as `src/scripts.rs` composes it (the clock from FENCE, the queue's ttl rule
/// from HOLD).
pub(crate) fn hold_renew_script() -> String {
    composed(
        &[FENCE_LIB, HOLD_LIB],
        include_str!("../../lua/hold_renew.lua"),
    )
}

/// `hold_inspect.lua` as `src/scripts.rs` composes it (no library).
pub(crate) fn hold_inspect_script() -> String {
    composed(&[], include_str!("../../lua/hold_inspect.lua"))
}

/// A reply that must be an array of integers.
pub(crate) fn ints(reply: Resp) -> Vec<i64> {
    assert!(!reply.is_error(), "{reply:?}");
    reply.as_array().iter().map(Resp::as_int).collect()
}

/// Asserts that `reply` is a WRONGTYPE error.
pub(crate) fn assert_wrongtype(reply: &Resp, what: &str) {
    assert!(
        reply
            .error_message()
            .is_some_and(|e| e.contains("WRONGTYPE")),
        "{what}: {reply:?}"
    );
}

/// The value of each key ([`key_value`]), for "nothing changed" checks.
pub(crate) fn dump_keys(server: &RedisServer, keys: &[&str]) -> Vec<Option<Vec<u8>>> {
    keys.iter().map(|key| key_value(server, key)).collect()
}

/// A key's value, comparable across calls: its `DUMP`, but for a hash its fields and values in
/// field order. A hash's `DUMP` also records the order of its table, which a mere read can
/// change before Redis 7 (a lookup moves an incremental rehash on).
fn key_value(server: &RedisServer, key: &str) -> Option<Vec<u8>> {
    if server.cmd(&["TYPE", key]).as_str().as_deref() != Some("hash") {
        return server.cmd(&["DUMP", key]).as_bytes();
    }
    let items = server.cmd(&["HGETALL", key]).as_array();
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = items
        .chunks(2)
        .map(|pair| {
            let bytes = |item: &Resp| item.as_bytes().expect("a hash field or value");
            (bytes(&pair[0]), bytes(&pair[1]))
        })
        .collect();
    pairs.sort();
    let mut value = b"hash".to_vec();
    for (field, content) in pairs {
        for part in [field, content] {
            value.extend((part.len() as u64).to_be_bytes());
            value.extend(part);
        }
    }
    Some(value)
}

/// The server clock in microseconds (what a fence key starts from).
pub(crate) fn server_micros(server: &RedisServer) -> i64 {
    let time = server.cmd(&["TIME"]).as_array();
    time[0].as_int() * 1_000_000 + time[1].as_int()
}

/// How far ahead of the server clock [`Lua::push_ahead`] sets a hold's token (µs: 1000 s, far
/// more than a test lasts), so that the next token drawn from it is exactly one above it.
pub(crate) const AHEAD: i64 = 1_000_000_000;

/// Asserts that `token`, drawn by a call made after the server clock read `clock` (µs), is
/// max(previous + 1, the clock at the call): above `previous`, and not below `clock`.
pub(crate) fn assert_drawn(token: i64, previous: i64, clock: i64, what: &str) {
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
pub(crate) const HOLD: &str = "{t:0}:mutex:x";
/// The wait queue of [`HOLD`] (`KEYS[2]`, a sorted set: `lua/lib/hold.lua`).
pub(crate) const QUEUE: &str = "{t:0}:mutex.wait:x";
/// The shard's fence key (`lua/lib/fence.lua`).
pub(crate) const FENCE: &str = "{t:0}:fence";
/// The shard's events key (a single Redis: one for every shard); the inboxes are beside it.
pub(crate) const EVENTS: &str = "{t:events}";
/// The shard's event counter (not a key of the hold scripts; no script may create it).
pub(crate) const SEQ: &str = "{t:events}:seq";
/// The KEYS of the hold scripts (`through(Key::Events)`; `hold_acquire` takes the first 3).
pub(crate) const KEYS: [&str; 4] = [HOLD, QUEUE, FENCE, EVENTS];
pub(crate) const LOCK_ID: &str = "mutex:x";
/// The lease of every acquisition unless a test says otherwise (ms).
pub(crate) const LEASE: i64 = 30_000;
/// The waiter lease of a waiting acquisition unless a test says otherwise (ms).
pub(crate) const WAITER_LEASE: i64 = 3_000;
/// A hand-over successor's lease (ms).
pub(crate) const SUCCESSOR_LEASE: i64 = 20_000;
/// The hand-over limit (ms) the tests pass unless they say otherwise: far longer than a test
/// lasts, so that a hand-over passes over a queue head only when a test has set its since
/// column back (or passes another limit).
pub(crate) const LIMIT: i64 = 60_000;
/// The retry window: the tombstone's ttl (ms).
pub(crate) const WINDOW: i64 = 5_000;

/// The inbox tag of `owner`'s client (each owner of these tests has a client of its own).
pub(crate) fn tag(owner: &str) -> String {
    format!("tag{owner}")
}

/// The inbox of `owner`'s client: the stream (or channel) `<events>:to:<tag>`.
pub(crate) fn inbox(owner: &str) -> String {
    format!("{EVENTS}:to:{}", tag(owner))
}

/// A queue line as the tests compare queues: the queue member (`lua/lib/hold.lua`: waiter id,
/// inbox tag, owner id, lease, grant ms), then since ms (its score, the server clock when the
/// waiter queued, in ms). [`Lua::line`] fills in the since column the waiter's attempt wrote.
pub(crate) fn queue_line(waiter: &str, owner: &str, lease: i64, grant: i64, since: i64) -> String {
    format!("{waiter} {} {owner} {lease} {grant} {since}\n", tag(owner))
}

/// The since column (ms) of `waiter`'s line in `queue`, if it is queued there.
pub(crate) fn queued_since(queue: &str, waiter: &str) -> Option<i64> {
    queue.lines().find_map(|line| {
        let columns: Vec<&str> = line.split(' ').collect();
        (columns[0] == waiter).then(|| {
            assert_eq!(columns.len(), 6, "a queue line of six columns: {line:?}");
            columns[5]
                .parse()
                .unwrap_or_else(|e| panic!("the since column of {line:?}: {e}"))
        })
    })
}

/// The grant event a release sends to a waiter's inbox: not numbered (sequence 0); `queued`
/// how many waiters stay in the queue after the grant.
pub(crate) fn grant(waiter: &str, token: i64, grant_ms: i64, queued: usize) -> String {
    grant_of(LOCK_ID, waiter, token, grant_ms, queued)
}

/// The grant event of lock `lock_id` (an exclusive lock's, a read-write lock's write hold).
fn grant_of(lock_id: &str, waiter: &str, token: i64, grant_ms: i64, queued: usize) -> String {
    format!("0|grant|{waiter},{token},{grant_ms},{queued}|{lock_id}")
}

/// The event that wakes a waiter that is only woken (waiter lease -1: a Redlock round), never
/// granted the lock: not numbered either.
pub(crate) fn wake(waiter: &str) -> String {
    format!("0|name|{waiter}|{LOCK_ID}")
}

/// The busy reply of `hold_acquire`: the bound (the holder's lease as last set) and the
/// holder's token.
pub(crate) fn busy(bound: i64, token: i64) -> Vec<i64> {
    vec![0, bound, token]
}

/// One call of `hold_acquire.lua`: the inbox tag is always the owner's client's.
#[derive(Clone, Copy)]
pub(crate) struct Ask<'a> {
    pub(crate) owner: &'a str,
    pub(crate) lease: i64,
    pub(crate) op: &'a str,
    pub(crate) waiter: &'a str,
    pub(crate) waiter_lease: i64,
    /// Whether the owner's client asks to hear of the first waiter queued behind the hold
    /// this call takes (`ARGV[10]`); no unless a test says so.
    pub(crate) notice: bool,
}

impl<'a> Ask<'a> {
    /// A try (`try_lock`): no waiter id, waiter lease 0.
    pub(crate) fn once(owner: &'a str, op: &'a str) -> Self {
        Ask {
            owner,
            lease: LEASE,
            op,
            waiter: "",
            waiter_lease: 0,
            notice: false,
        }
    }

    /// An attempt of an acquisition that waits when the lock is busy.
    pub(crate) fn waiting(owner: &'a str, op: &'a str, waiter: &'a str) -> Self {
        Ask {
            owner,
            lease: LEASE,
            op,
            waiter,
            waiter_lease: WAITER_LEASE,
            notice: false,
        }
    }

    /// An attempt of an acquisition that, when the lock is busy, queues to be woken only
    /// (waiter lease -1: a Redlock round), never granted the lock.
    pub(crate) fn woken(owner: &'a str, op: &'a str, waiter: &'a str) -> Self {
        Ask::waiting(owner, op, waiter).waiter_lease(-1)
    }

    pub(crate) fn lease(self, lease: i64) -> Self {
        Ask { lease, ..self }
    }

    /// Asks to hear of the hold's first waiter (`ARGV[10]` "1").
    pub(crate) fn notice(self) -> Self {
        Ask {
            notice: true,
            ..self
        }
    }

    pub(crate) fn waiter_lease(self, waiter_lease: i64) -> Self {
        Ask {
            waiter_lease,
            ..self
        }
    }
}

/// The successor a `hold_release` call names (`ARGV[9..14]`); its client's inbox tag is always
/// its owner's, its lease [`SUCCESSOR_LEASE`].
#[derive(Clone, Copy)]
pub(crate) struct Successor<'a> {
    pub(crate) owner: &'a str,
    pub(crate) waiter: &'a str,
    /// The hand-over limit (ms).
    pub(crate) limit: i64,
    /// `None` for a successor that waits already (a local waiter: `ARGV[14]` ""); `Some(grant
    /// ms)` for one that asks by this very call (a take-over), which joins the queue when the
    /// queue's turn comes.
    pub(crate) queues: Option<i64>,
}

/// The whole hold hash, field by field (every field the library writes; no other).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldHash {
    pub(crate) o: String,
    pub(crate) c: String,
    pub(crate) f: String,
    pub(crate) l: String,
    pub(crate) r: String,
    pub(crate) x: String,
    pub(crate) q: String,
    pub(crate) g: String,
    pub(crate) t: String,
    /// The inbox tag of the holder's client if it is to hear of the hold's first waiter.
    pub(crate) i: String,
}

/// A hold of `owner` (count 1, no freed-by chain, nobody queued, granted to no waiter): what a take writes, but for the fields a test sets with `..held(..)`.
pub(crate) fn held(owner: &str, token: i64, lease: i64, r: &str) -> HoldHash {
    HoldHash {
        o: owner.to_owned(),
        c: "1".to_owned(),
        f: token.to_string(),
        l: lease.to_string(),
        r: r.to_owned(),
        x: String::new(),
        q: String::new(),
        g: String::new(),
        t: String::new(),
        i: String::new(),
    }
}

/// A hold that a release handed over to `waiter` of `owner`, a task of the releasing process:
/// the waiter id both as `r` and as `g`.
pub(crate) fn handed_over(owner: &str, token: i64, lease: i64, waiter: &str) -> HoldHash {
    HoldHash {
        g: waiter.to_owned(),
        i: tag(owner),
        ..held(owner, token, lease, waiter)
    }
}

/// A hold that a release (or a leave, or a force unlock) granted to `waiter` of `owner`, the
/// first waiter of the queue: handed (see [`handed_over`]) and the queue's turn (`t` = "1").
/// With nobody left queued behind it, `owner`'s client is to hear of the next waiter (`i`);
/// a test that leaves waiters queued sets `q` and clears `i`.
pub(crate) fn granted(owner: &str, token: i64, lease: i64, waiter: &str) -> HoldHash {
    HoldHash {
        t: "1".to_owned(),
        ..handed_over(owner, token, lease, waiter)
    }
}

/// A tombstone: free, the last hold's token and lease kept, `r` the op that freed it, granted
/// to no waiter (`g` = "").
pub(crate) fn tombstone(token: i64, lease: i64, r: &str, x: &str) -> HoldHash {
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
///
/// Every `hold_acquire` call goes through [`Lua::attempt_on`], which reads the server clock
/// before and after it: a call that queues its waiter must stamp the line's since column within
/// those two readings (in ms), and the harness keeps that stamp (per hold key and waiter id) for
/// [`Lua::line`], so that a test compares whole queue lines.
pub(crate) struct Lua<'a> {
    pub(crate) server: &'a RedisServer,
    pub(crate) mode: &'static str,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) leave: String,
    pub(crate) force: String,
    pub(crate) heartbeat: String,
    /// The fast paths of an uncontended take and release.
    pub(crate) take: String,
    pub(crate) free: String,
    /// The since column each waiter's line got when it queued, by (hold key, waiter id).
    since: RefCell<BTreeMap<(String, String), i64>>,
}

impl<'a> Lua<'a> {
    pub(crate) fn new(server: &'a RedisServer, mode: &'static str) -> Self {
        let libraries = [FENCE_LIB, NOTIFY_LIB, HOLD_LIB];
        Lua {
            server,
            mode,
            acquire: composed(&libraries, include_str!("../../lua/hold_acquire.lua")),
            release: composed(&libraries, include_str!("../../lua/hold_release.lua")),
            leave: composed(&libraries, include_str!("../../lua/hold_leave.lua")),
            force: composed(&libraries, include_str!("../../lua/hold_force_unlock.lua")),
            heartbeat: composed(&libraries, include_str!("../../lua/hold_heartbeat.lua")),
            take: composed(&libraries, include_str!("../../lua/hold_take.lua")),
            free: composed(&libraries, include_str!("../../lua/hold_free.lua")),
            since: RefCell::new(BTreeMap::new()),
        }
    }

    pub(crate) fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Resp {
        eval(self.server, script, keys, args)
    }

    /// `hold_acquire` with the fence argument `fence_arg`; the raw reply.
    pub(crate) fn attempt(&self, ask: Ask, fence_arg: &str) -> Resp {
        self.attempt_on(HOLD, ask, fence_arg)
    }

    /// `hold_acquire` on the lock whose hash is `hold` (same slot as [`HOLD`]). When the call
    /// queues the waiter (its line was not in `q` before the call and is after it), asserts that
    /// the line's since column is the server clock (ms) of the call: within the clock read
    /// before it and the clock read after it; and keeps it for [`Lua::line`].
    pub(crate) fn attempt_on(&self, hold: &str, ask: Ask, fence_arg: &str) -> Resp {
        let (lease, waiter_lease) = (ask.lease.to_string(), ask.waiter_lease.to_string());
        let inbox_tag = tag(ask.owner);
        let was_queued = queued_since(&self.queue_of(hold), ask.waiter).is_some();
        let before = self.clock().div_euclid(1000);
        let reply = self.eval(
            &self.acquire,
            &[hold, &queue_key(hold), FENCE, EVENTS],
            &[
                ask.owner,
                &lease,
                ask.op,
                ask.waiter,
                &waiter_lease,
                self.mode,
                "",
                LOCK_ID,
                &inbox_tag,
                if ask.notice { "1" } else { "" },
                fence_arg,
            ],
        );
        let after = self.clock().div_euclid(1000);
        if ask.waiter.is_empty() || was_queued {
            return reply;
        }
        if let Some(since) = queued_since(&self.queue_of(hold), ask.waiter) {
            assert!(
                (before..=after).contains(&since),
                "{} queued at {since} ms, not within the server clock {before}..={after} ms \
                 around the call",
                ask.waiter
            );
            self.since
                .borrow_mut()
                .insert((hold.to_owned(), ask.waiter.to_owned()), since);
        }
        reply
    }

    /// The wait queue of the lock whose hash is `hold`, as text: one [`queue_line`] per member,
    /// oldest first ("" when nobody is queued, or when the key holds no sorted set: the read
    /// is a plain ZRANGE, which changes nothing).
    pub(crate) fn queue_of(&self, hold: &str) -> String {
        queue_members(self.server, hold)
            .iter()
            .map(|(member, score)| format!("{member} {}\n", score.div_euclid(1000)))
            .collect()
    }

    /// The queue line of `waiter` of `owner` in [`HOLD`]'s queue (lease, grant ms), with the
    /// since column its attempt wrote when it queued (panics if it never queued).
    pub(crate) fn line(&self, waiter: &str, owner: &str, lease: i64, grant: i64) -> String {
        queue_line(waiter, owner, lease, grant, self.since_of(waiter))
    }

    /// The since column (ms) `waiter`'s attempt wrote when it last queued in [`HOLD`].
    pub(crate) fn since_of(&self, waiter: &str) -> i64 {
        *self
            .since
            .borrow()
            .get(&(HOLD.to_owned(), waiter.to_owned()))
            .unwrap_or_else(|| panic!("{waiter} never queued"))
    }

    /// Sets the score of `waiter`'s member in [`HOLD`]'s queue to `since` (ms), the rest of the
    /// queue, the hash and the ttls kept, as if it had queued then.
    pub(crate) fn set_since(&self, waiter: &str, since: i64) {
        let queue = self.queue_of(HOLD);
        let line = queue
            .lines()
            .find(|line| line.split(' ').next() == Some(waiter))
            .unwrap_or_else(|| panic!("{waiter} is not queued: {queue:?}"));
        let member = &line[..line.rfind(' ').expect("a since column")];
        let ttl = self.server.cmd(&["PTTL", QUEUE]).as_int();
        let score = (since * 1000).to_string();
        let changed = self
            .server
            .cmd(&["ZADD", QUEUE, "XX", "CH", &score, member]);
        assert_eq!(changed.as_int(), 1, "{waiter}'s score is set");
        assert!(
            self.server.cmd(&["PTTL", QUEUE]).as_int() <= ttl,
            "ZADD changed the queue's ttl"
        );
        self.since
            .borrow_mut()
            .insert((HOLD.to_owned(), waiter.to_owned()), since);
        assert_eq!(queued_since(&self.queue_of(HOLD), waiter), Some(since));
    }

    /// `hold_acquire` that may create the fence key (as after the layout check).
    pub(crate) fn acquire(&self, ask: Ask) -> Vec<i64> {
        ints(self.attempt(ask, &fence_arg(true)))
    }

    /// `hold_release`, handing over to `to` = (owner, waiter id) if given (hand-over limit
    /// [`LIMIT`]); the raw reply.
    pub(crate) fn release_raw(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        to: Option<(&str, &str)>,
    ) -> Resp {
        self.release_limited(owner, token, op, all, to.map(|(o, w)| (o, w, LIMIT)))
    }

    /// `hold_release`, handing over to `to` = (owner, waiter id, hand-over limit in ms) if
    /// given, a successor that waits already (`ARGV[14]` ""); the raw reply. With no
    /// successor, the successor's lease and the limit are 0 (as the client passes them).
    pub(crate) fn release_limited(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        to: Option<(&str, &str, i64)>,
    ) -> Resp {
        let to = to.map(|(owner, waiter, limit)| Successor {
            owner,
            waiter,
            limit,
            queues: None,
        });
        self.release_to(owner, token, op, all, to)
    }

    /// `hold_release`, naming the successor `to` if given (`ARGV[9..14]`: its owner, waiter
    /// id, lease [`SUCCESSOR_LEASE`], the limit, its client's inbox tag, and its grant ms when
    /// it queues, else ""); the raw reply. With no successor, the successor's lease and the
    /// limit are 0 and the inbox tag "" (as the client passes them).
    ///
    /// When the call queues a successor that queues (its line was not in `q` before the call
    /// and is after it), asserts that the line's since column is the server clock (ms) of the
    /// call, within the clock read before it and the clock read after it, and keeps it for
    /// [`Lua::line`], as [`Lua::attempt_on`] does.
    pub(crate) fn release_to(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        to: Option<Successor>,
    ) -> Resp {
        self.release_with_floor(owner, token, None, op, all, to)
    }

    /// [`Lua::release_to`] naming `floor` (`ARGV[15]`), the highest token the releasing client
    /// issued for the hold within its process, if given.
    pub(crate) fn release_with_floor(
        &self,
        owner: &str,
        token: i64,
        floor: Option<i64>,
        op: &str,
        all: bool,
        to: Option<Successor>,
    ) -> Resp {
        let (successor, waiter) = to.map_or(("", ""), |s| (s.owner, s.waiter));
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let (lease, limit, inbox_tag, queues) = match to {
            Some(s) => (
                SUCCESSOR_LEASE.to_string(),
                s.limit.to_string(),
                tag(s.owner),
                s.queues.map(|grant| grant.to_string()).unwrap_or_default(),
            ),
            None => ("0".to_owned(), "0".to_owned(), String::new(), String::new()),
        };
        let joins = to.is_some_and(|s| s.queues.is_some())
            && queued_since(&self.queue_of(HOLD), waiter).is_none();
        let before = self.clock().div_euclid(1000);
        let floor = floor.map(|floor| floor.to_string());
        let mut args = vec![
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
            &limit,
            &inbox_tag,
            &queues,
        ];
        args.extend(floor.as_deref());
        let reply = self.eval(&self.release, &KEYS, &args);
        let after = self.clock().div_euclid(1000);
        if joins {
            if let Some(since) = queued_since(&self.queue_of(HOLD), waiter) {
                assert!(
                    (before..=after).contains(&since),
                    "{waiter} queued at {since} ms, not within the server clock \
                     {before}..={after} ms around the release"
                );
                self.since
                    .borrow_mut()
                    .insert((HOLD.to_owned(), waiter.to_owned()), since);
            }
        }
        reply
    }

    /// `hold_release` of one hold, with no successor.
    pub(crate) fn release(&self, owner: &str, token: i64, op: &str) -> Vec<i64> {
        ints(self.release_raw(owner, token, op, false, None))
    }

    /// `hold_release` of one hold that may hand the lock to `to` = (owner, waiter id), with the
    /// hand-over limit [`LIMIT`].
    pub(crate) fn hand_over(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        to: (&str, &str),
    ) -> Vec<i64> {
        self.hand_over_within(owner, token, op, to, LIMIT)
    }

    /// `hold_release` of one hold that may hand the lock to `to` = (owner, waiter id), with the
    /// hand-over limit `limit` ms.
    pub(crate) fn hand_over_within(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        to: (&str, &str),
        limit: i64,
    ) -> Vec<i64> {
        let (successor, waiter) = to;
        ints(self.release_limited(owner, token, op, false, Some((successor, waiter, limit))))
    }

    /// `hold_release` of one hold naming `to` = (owner, waiter id) a successor that asks by
    /// this very call (a take-over: `ARGV[14]` its grant ms `grant`), with the hand-over limit
    /// [`LIMIT`].
    pub(crate) fn take_over(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        to: (&str, &str),
        grant: i64,
    ) -> Vec<i64> {
        let (successor, waiter) = to;
        let to = Successor {
            owner: successor,
            waiter,
            limit: LIMIT,
            queues: Some(grant),
        };
        ints(self.release_to(owner, token, op, false, Some(to)))
    }

    /// `hold_take` (the fast take) by `owner` with lease [`LEASE`]; `notice`: the inbox tag
    /// it passes to hear of the hold's first waiter, "" for none.
    pub(crate) fn take_fast(&self, owner: &str, op: &str, notice: &str) -> Vec<i64> {
        let lease = LEASE.to_string();
        ints(self.eval(&self.take, &[HOLD], &[owner, &lease, op, "", "0", notice]))
    }

    /// `hold_free` (the fast release) of `owner`'s hold `token`, one level or all of them.
    pub(crate) fn free_fast(&self, owner: &str, token: i64, op: &str, all: bool) -> Vec<i64> {
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let all = if all { "1" } else { "0" };
        ints(self.eval(&self.free, &[HOLD], &[owner, &token, op, all, &window]))
    }

    /// `hold_leave` of `waiter`; the raw reply.
    pub(crate) fn leave_raw(&self, waiter: &str) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.leave,
            &KEYS,
            &no_call(waiter, &window, self.mode, LOCK_ID),
        )
    }

    pub(crate) fn leave(&self, waiter: &str) -> Vec<i64> {
        ints(self.leave_raw(waiter))
    }

    /// `hold_force_unlock`; the raw reply.
    pub(crate) fn force_raw(&self) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.force,
            &KEYS,
            &no_call("", &window, self.mode, LOCK_ID),
        )
    }

    pub(crate) fn force_unlock(&self) -> Vec<i64> {
        ints(self.force_raw())
    }

    /// `hold_heartbeat` (a batch): for each (hold key, waiter ids) of `locks`, the hold and its
    /// queue in KEYS and the count and the ids in ARGV; the raw reply.
    pub(crate) fn heartbeat_raw(&self, locks: &[(&str, &[&str])]) -> Resp {
        let queues: Vec<String> = locks.iter().map(|(hold, _)| queue_key(hold)).collect();
        let keys: Vec<&str> = locks
            .iter()
            .zip(&queues)
            .flat_map(|((hold, _), queue)| [*hold, queue.as_str()])
            .collect();
        let counts: Vec<String> = locks.iter().map(|(_, ids)| ids.len().to_string()).collect();
        let mut args = Vec::new();
        for ((_, ids), count) in locks.iter().zip(&counts) {
            args.push(count.as_str());
            args.extend(ids.iter().copied());
        }
        self.eval(&self.heartbeat, &keys, &args)
    }

    /// The hold hash, every field (panics on a missing or an unknown field).
    pub(crate) fn hash(&self) -> HoldHash {
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
        // When the queue expires, as the scripts last set it: checked through the ttls below.
        fields.remove("k");
        let mut take = |name: &str| {
            fields
                .remove(name)
                .unwrap_or_else(|| panic!("hold hash lacks {name}"))
        };
        let count = take("q");
        let hash = HoldHash {
            o: take("o"),
            c: take("c"),
            f: take("f"),
            l: take("l"),
            r: take("r"),
            x: take("x"),
            q: self.queue_of(HOLD),
            g: take("g"),
            t: take("t"),
            i: fields.remove("i").unwrap_or_default(),
        };
        // A free lock keeps its last holder's i, which nothing reads (a join needs a hold):
        // a tombstone compares without it.
        let hash = if hash.o.is_empty() {
            HoldHash {
                i: String::new(),
                ..hash
            }
        } else {
            hash
        };
        assert!(fields.is_empty(), "unknown fields in the hold: {fields:?}");
        let members = hash.q.lines().count();
        assert_eq!(
            count.parse::<usize>().unwrap_or(0),
            members,
            "field q ({count:?}) counts the queue's members"
        );
        assert!(
            count.is_empty() || count.parse::<usize>().is_ok(),
            "q: {count:?}"
        );
        self.assert_queue_outlives_the_hold();
        hash
    }

    /// A queue with members lasts at least as long as the hold (`lua/lib/hold.lua`): read
    /// first, its ttl is not below the hold's read after it.
    pub(crate) fn assert_queue_outlives_the_hold(&self) {
        let queue_ttl = self.server.cmd(&["PTTL", QUEUE]).as_int();
        let hold_ttl = self.pttl();
        if queue_ttl == -2 {
            return;
        }
        assert_ne!(queue_ttl, -1, "the queue has no ttl");
        assert!(
            queue_ttl >= hold_ttl,
            "the queue's ttl {queue_ttl} ms is below the hold's {hold_ttl} ms"
        );
    }

    /// The hold's remaining time in ms.
    pub(crate) fn pttl(&self) -> i64 {
        self.server.cmd(&["PTTL", HOLD]).as_int()
    }

    /// The hold's token (field `f`).
    pub(crate) fn token(&self) -> i64 {
        let f = self.hash().f;
        f.parse()
            .unwrap_or_else(|e| panic!("the hold's token {f:?}: {e}"))
    }

    /// The server clock in µs.
    pub(crate) fn clock(&self) -> i64 {
        server_micros(self.server)
    }

    /// Sets the hold's token `f` [`AHEAD`] of the server clock (the hash's other fields and ttl
    /// kept) and returns it: the next token drawn from the hash is exactly one above it.
    pub(crate) fn push_ahead(&self) -> i64 {
        let token = self.clock() + AHEAD;
        self.server.cmd(&["HSET", HOLD, "f", &token.to_string()]);
        assert_eq!(self.token(), token);
        token
    }

    /// Asserts the hold hash is `expected` and lasts at most `most` ms (more than 0).
    pub(crate) fn assert_hold(&self, expected: &HoldHash, most: i64, what: &str) {
        assert_eq!(&self.hash(), expected, "{what}");
        let pttl = self.pttl();
        assert!(
            pttl > 0 && pttl <= most,
            "{what}: ttl {pttl} ms, at most {most}"
        );
    }

    /// The DUMP of every key the hold scripts may touch, and of `more`.
    pub(crate) fn dump(&self, more: &[&str]) -> Vec<Option<Vec<u8>>> {
        let mut keys = KEYS.to_vec();
        keys.push(SEQ);
        keys.extend(more);
        dump_keys(self.server, &keys)
    }

    /// Every event in `owner`'s inbox stream, oldest first.
    pub(crate) fn inbox_events(&self, owner: &str) -> Vec<String> {
        inbox_events(self.server, owner)
    }

    /// Runs `inbox_keep` for the inboxes of `owners`, as their clients' readers do.
    pub(crate) fn open_inboxes(&self, owners: &[&str]) {
        open_inboxes(self.server, owners);
    }

    /// Asserts that no script call created a key it has no business with: the shard's event
    /// stream and counter (grants go to inboxes only); and that a queue left lasts as long as
    /// its hold.
    pub(crate) fn assert_no_stray_keys(&self) {
        for key in [EVENTS, SEQ] {
            assert!(!exists(self.server, key), "{key} was created");
        }
        self.assert_queue_outlives_the_hold();
    }
}

/// Every event in the inbox stream of `owner`'s client, oldest first.
pub(crate) fn inbox_events(server: &RedisServer, owner: &str) -> Vec<String> {
    server
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

/// Runs `inbox_keep` for the inboxes of the clients of `owners`, as their readers do.
pub(crate) fn open_inboxes(server: &RedisServer, owners: &[&str]) {
    let inboxes: Vec<String> = owners.iter().map(|owner| inbox(owner)).collect();
    let inboxes: Vec<&str> = inboxes.iter().map(String::as_str).collect();
    let kept = keep_inboxes(server, &inboxes, "30000");
    assert_eq!(ints(kept), vec![owners.len() as i64]);
}

/// `inbox_keep.lua` (no library) on `inboxes` with the ttl `ttl` ms; the raw reply.
pub(crate) fn keep_inboxes(server: &RedisServer, inboxes: &[&str], ttl: &str) -> Resp {
    let script = composed(&[], include_str!("../../lua/inbox_keep.lua"));
    eval(server, &script, inboxes, &[ttl])
}

/// A reply array of integers, to compare with a raw reply.
pub(crate) fn ints_of(values: &[i64]) -> Resp {
    Resp::Array(Some(values.iter().map(|&v| Resp::Int(v)).collect()))
}

// ---------------------------------------------------------------------------
// the read-write lock: lua/rw_*.lua
// ---------------------------------------------------------------------------

/// The hash of read-write lock `x` under prefix `t` (shard 0): the lock's whole state
/// (`lua/lib/rw.lua`).
pub(crate) const RW_HOLD: &str = "{t:0}:rw:x";
/// The wait queue of read-write lock `x`, a sorted set beside its hash (`lua/lib/rw.lua`).
pub(crate) const RW_QUEUE: &str = "{t:0}:rw.wait:x";
/// What the client passes at the `ops` position (`KEYS[5]`, unused): no script may create it.
pub(crate) const RW_OPS: &str = "{t:0}:rw.op:x";
/// The ends of the read holds of read-write lock `x`, a sorted set (`lua/lib/rw.lua`).
pub(crate) const RW_READS: &str = "{t:0}:rw.read:x";
/// The KEYS of the read-write scripts that work on one lock (`through(Key::Reads)`).
pub(crate) const RW_KEYS: [&str; 6] = [RW_HOLD, RW_QUEUE, FENCE, EVENTS, RW_OPS, RW_READS];
pub(crate) const RW_LOCK_ID: &str = "rw:x";
/// How far (ms) the expiry time of the hash may lie from the end it is meant to have: the
/// scripts compute ends from the server clock in whole ms, Redis sets the expiry from its own
/// reading of the clock in the same call.
const EXPIRY_SLACK: i64 = 3;

/// The side of a read-write lock a call is about (`ARGV[9]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Read,
    Write,
}

impl Side {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Read => "read",
            Side::Write => "write",
        }
    }
}

/// One call of `rw_acquire.lua`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bid<'a> {
    pub(crate) side: Side,
    pub(crate) owner: &'a str,
    /// Whose client the call comes from: it passes that client's inbox tag ([`tag`]). Each
    /// owner has a client of its own unless a test says otherwise.
    pub(crate) client: &'a str,
    pub(crate) lease: i64,
    pub(crate) op: &'a str,
    pub(crate) waiter: &'a str,
    pub(crate) waiter_lease: i64,
    /// Whether the client asks to hear of the first waiter queued behind the write hold this
    /// call takes (`ARGV[12]`); no unless a test says so.
    pub(crate) notice: bool,
    /// A semaphore's permit count (`ARGV[13]`, field `n` of `lua/lib/rw.lua`): the call is a
    /// semaphore's (read side, at most that many read holds); `None` for a read-write lock,
    /// whose calls pass `""`.
    pub(crate) permits: Option<u32>,
}

impl<'a> Bid<'a> {
    /// A try for a read hold: no waiter id, waiter lease 0 (it never queues); lease [`LEASE`].
    pub(crate) fn read(owner: &'a str, op: &'a str) -> Self {
        Bid::new(Side::Read, owner, op)
    }

    /// A try for the write hold.
    pub(crate) fn write(owner: &'a str, op: &'a str) -> Self {
        Bid::new(Side::Write, owner, op)
    }

    fn new(side: Side, owner: &'a str, op: &'a str) -> Self {
        Bid {
            side,
            owner,
            client: owner,
            lease: LEASE,
            op,
            waiter: "",
            waiter_lease: 0,
            notice: false,
            permits: None,
        }
    }

    /// An attempt of an acquisition that queues as `waiter` when it must wait, with the
    /// waiter lease [`WAITER_LEASE`].
    pub(crate) fn waiting(self, waiter: &'a str) -> Self {
        Bid {
            waiter,
            waiter_lease: WAITER_LEASE,
            ..self
        }
    }

    pub(crate) fn lease(self, lease: i64) -> Self {
        Bid { lease, ..self }
    }

    /// Asks to hear of the write hold's first waiter (`ARGV[12]` "1").
    pub(crate) fn notice(self) -> Self {
        Bid {
            notice: true,
            ..self
        }
    }

    pub(crate) fn waiter_lease(self, waiter_lease: i64) -> Self {
        Bid {
            waiter_lease,
            ..self
        }
    }

    /// The call comes from `client`'s client (its inbox tag).
    pub(crate) fn client(self, client: &'a str) -> Self {
        Bid { client, ..self }
    }

    /// The call is a semaphore's with `permits` permits (`ARGV[13]`): a read bid only.
    pub(crate) fn permits(self, permits: u32) -> Self {
        assert_eq!(self.side, Side::Read, "a semaphore has no write side");
        Bid {
            permits: Some(permits),
            ..self
        }
    }

    /// The grant ms of this bid's queue line: min(lease, waiter lease).
    pub(crate) fn grant_ms(&self) -> i64 {
        self.lease.min(self.waiter_lease).max(0)
    }
}

/// The server clock (ms) read right before and right after one call: whatever time the call
/// computed from its own reading of the clock lies within, shifted by the duration it added.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) from: i64,
    pub(crate) to: i64,
}

impl Span {
    pub(crate) fn shifted(self, ms: i64) -> Span {
        Span {
            from: self.from + ms,
            to: self.to + ms,
        }
    }

    pub(crate) fn assert_contains(self, value: i64, what: &str) {
        assert!(
            (self.from..=self.to).contains(&value),
            "{what}: {value} not within {}..={}",
            self.from,
            self.to
        );
    }
}

/// The read-write lock's hash, field by field (`None`: the hash lacks the field). The write
/// hold's fields and the queue are those of the exclusive locks ([`HoldHash`]); `e` is the
/// write hold's end (server ms) and `s` the read holds, one line per owner; a semaphore's
/// hash also keeps its permit count `n`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RwHash {
    pub(crate) o: Option<String>,
    pub(crate) c: Option<String>,
    pub(crate) f: Option<String>,
    pub(crate) l: Option<String>,
    pub(crate) r: Option<String>,
    pub(crate) x: Option<String>,
    pub(crate) q: Option<String>,
    pub(crate) g: Option<String>,
    pub(crate) e: Option<String>,
    pub(crate) s: Option<String>,
    /// A semaphore's permit count (absent on a read-write lock).
    pub(crate) n: Option<String>,
}

/// A field's value in an expected [`RwHash`].
pub(crate) fn v(value: impl ToString) -> Option<String> {
    Some(value.to_string())
}

/// The grant event a release sends to a writer's client (`lua/lib/rw.lua`).
pub(crate) fn rw_grant(waiter: &str, token: i64, grant_ms: i64, queued: usize) -> String {
    grant_of(RW_LOCK_ID, waiter, token, grant_ms, queued)
}

/// How many waiters a queue of `lines` holds: the count a grant event carries (`fl_rw_count` in
/// `lua/lib/rw.lua`).
pub(crate) fn rw_queued<S: AsRef<str>>(lines: &[S]) -> usize {
    lines.len()
}

/// The event that grants a wave of readers of one client: how many waiters stay queued, then
/// each reader's waiter id, grant ms and token (every granted read hold draws its own,
/// `lua/lib/rw.lua`).
pub(crate) fn rw_grants(queued: usize, readers: &[(&str, i64, i64)]) -> String {
    let readers: Vec<String> = readers
        .iter()
        .map(|(waiter, ms, token)| format!("{waiter}:{ms}:{token}"))
        .collect();
    format!("0|grants|{queued},{}|{RW_LOCK_ID}", readers.join(","))
}

/// The event that wakes a reader by name (its owner holds a read hold already).
pub(crate) fn rw_wake(waiter: &str) -> String {
    format!("0|name|{waiter}|{RW_LOCK_ID}")
}

/// Every time the hash holds, by name: the write end (`"e"`), each read line's end (`"s
/// <owner>"`) and each queue line's last column, the time its waiter is known alive until
/// (`"q <waiter>"`). Empty when the key holds no hash.
fn hash_times(server: &RedisServer) -> BTreeMap<String, i64> {
    let mut times = BTreeMap::new();
    if server.cmd(&["TYPE", RW_HOLD]).as_str().as_deref() != Some("hash") {
        return times;
    }
    let e = server
        .cmd(&["HGET", RW_HOLD, "e"])
        .as_str()
        .unwrap_or_default();
    let s = rw_reads_text(server);
    let q = rw_queue_text(server);
    if let Ok(e) = e.parse() {
        times.insert("e".to_owned(), e);
    }
    // A read line's end; a queue line's time it queued ("qat") and time it is alive until ("q").
    for (text, width, stamps) in [
        (&s, 6, &[("s", 3)][..]),
        (&q, 7, &[("qat", 5), ("q", 6)][..]),
    ] {
        for line in text.lines() {
            let columns: Vec<&str> = line.split(' ').collect();
            assert_eq!(columns.len(), width, "a line of {width} columns: {line:?}");
            for (prefix, at) in stamps {
                let time = columns[*at]
                    .parse()
                    .unwrap_or_else(|e| panic!("the time in {prefix} line {line:?}: {e}"));
                times.insert(format!("{prefix} {}", columns[0]), time);
            }
        }
    }
    times
}

/// The wait queue of read-write lock `x` as text, one line per waiter, head first: its place,
/// when it queued (server ms: its score in µs, floored) and the time it is known alive until
/// (its sign of life's score): "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>
/// <queued at> <alive until>\n" (`lua/lib/rw.lua`). Asserts that every place has its sign of life
/// and no sign of life is left without a place.
pub(crate) fn rw_queue_text(server: &RedisServer) -> String {
    let places = server
        .cmd(&["ZRANGEBYSCORE", RW_QUEUE, RW_PLACES, "+inf", "WITHSCORES"])
        .as_array();
    let mut text = String::new();
    for pair in places.chunks(2) {
        let place = pair[0].as_str().expect("a place");
        let score = pair[1].as_str().expect("a place's score");
        let since: i64 = score
            .parse()
            .unwrap_or_else(|e| panic!("the score {score:?} of {place:?}: {e}"));
        let waiter = place.split(' ').next().unwrap_or_default();
        let alive = server
            .cmd(&["ZSCORE", RW_QUEUE, waiter])
            .as_str()
            .unwrap_or_else(|| panic!("no sign of life of {place:?}"));
        text += &format!("{place} {} {alive}\n", since.div_euclid(1000));
    }
    let signs = server
        .cmd(&["ZCOUNT", RW_QUEUE, "-inf", "100000000000000"])
        .as_int();
    assert_eq!(
        signs as usize,
        places.len() / 2,
        "signs of life without a place: {text:?}"
    );
    text
}

/// The read holds of read-write lock `x` as text, one line per owner, sorted by owner: its
/// field `=<owner>` ("<count> <token> <op> <waiter>") with its end (its score in the read holds'
/// sorted set) after the token: "<owner> <count> <token> <end ms> <op> <waiter>\n"
/// (`lua/lib/rw.lua`). Asserts that every end has its field (a field whose end expired before the
/// hash, which only a hash kept past its holds by hand has, is not listed).
pub(crate) fn rw_reads_text(server: &RedisServer) -> String {
    let ends = server
        .cmd(&["ZRANGE", RW_READS, "0", "-1", "WITHSCORES"])
        .as_array();
    let mut lines: Vec<String> = Vec::new();
    for pair in ends.chunks(2) {
        let owner = pair[0].as_str().expect("an owner");
        let end = pair[1].as_str().expect("an end");
        let detail = server
            .cmd(&["HGET", RW_HOLD, &format!("={owner}")])
            .as_str()
            .unwrap_or_else(|| panic!("no field of the read hold of {owner:?}"));
        let columns: Vec<&str> = detail.split(' ').collect();
        assert_eq!(
            columns.len(),
            4,
            "a read hold's field of four columns: {detail:?}"
        );
        lines.push(format!(
            "{owner} {} {} {end} {} {}\n",
            columns[0], columns[1], columns[2], columns[3]
        ));
    }
    lines.sort();
    lines.concat()
}

/// `text`'s lines sorted (read holds compare whatever order they were written in).
pub(crate) fn sorted_lines(text: &Option<String>) -> Option<String> {
    text.as_ref().map(|text| {
        let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
        lines.sort_unstable();
        lines.concat()
    })
}

/// The lowest score of a place in a read-write queue (`FL_RW_PLACES` in `lua/lib/rw.lua`).
const RW_PLACES: &str = "(100000000000000";

/// The read-write scripts as `src/scripts.rs` composes them (check prelude, FENCE, NOTIFY,
/// HOLD, RW), run with `EVAL` on [`RW_KEYS`] in one notification mode.
///
/// Every call goes through [`Rw::eval`], which reads the server clock before and after it (its
/// [`Span`]) and notes, for each time in the hash that the call changed (the write end, a read
/// line's end, a queue line's alive time), that span: a test then states the duration it
/// expects ([`Rw::write_end`], [`Rw::reader`], [`Rw::queued`]) and the harness checks the
/// time against the clock of the call that wrote it.
pub(crate) struct Rw<'a> {
    pub(crate) server: &'a RedisServer,
    pub(crate) mode: &'static str,
    acquire: String,
    release: String,
    leave: String,
    force: String,
    heartbeat: String,
    renew: String,
    inspect: String,
    /// The span of the last call.
    span: Cell<Span>,
    /// The span of the call that last changed each time of the hash ([`hash_times`]).
    stamps: RefCell<BTreeMap<String, Span>>,
}

/// A write release's successor (`lua/rw_release.lua`): a writer of the releasing client.
#[derive(Clone, Copy)]
pub(crate) struct Heir<'h> {
    pub(crate) owner: &'h str,
    pub(crate) waiter: &'h str,
    /// The hand-over limit (ms): it passes a queued waiter that has waited less.
    pub(crate) limit: i64,
    /// It asks by this call (a take-over: it queues when the lock goes to the queue); false:
    /// it waits already.
    pub(crate) asks: bool,
}

impl<'a> Rw<'a> {
    pub(crate) fn new(server: &'a RedisServer, mode: &'static str) -> Self {
        let script = |source: &str| composed(&[FENCE_LIB, NOTIFY_LIB, HOLD_LIB, RW_LIB], source);
        Rw {
            server,
            mode,
            acquire: script(include_str!("../../lua/rw_acquire.lua")),
            release: script(include_str!("../../lua/rw_release.lua")),
            leave: script(include_str!("../../lua/rw_leave.lua")),
            force: script(include_str!("../../lua/rw_force_unlock.lua")),
            heartbeat: script(include_str!("../../lua/rw_heartbeat.lua")),
            renew: script(include_str!("../../lua/rw_renew.lua")),
            inspect: script(include_str!("../../lua/rw_inspect.lua")),
            span: Cell::new(Span::default()),
            stamps: RefCell::new(BTreeMap::new()),
        }
    }

    /// One script call with `EVAL`; notes its span, and the times of the hash it changed.
    fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Resp {
        let before = hash_times(self.server);
        let from = self.clock_ms();
        let reply = eval(self.server, script, keys, args);
        let span = Span {
            from,
            to: self.clock_ms(),
        };
        self.span.set(span);
        let mut stamps = self.stamps.borrow_mut();
        for (name, time) in hash_times(self.server) {
            if before.get(&name) != Some(&time) {
                stamps.insert(name, span);
            }
        }
        reply
    }

    /// `rw_acquire` with the fence argument `fence_arg`; the raw reply.
    pub(crate) fn attempt(&self, bid: Bid, fence_arg: &str) -> Resp {
        let (lease, waiter_lease) = (bid.lease.to_string(), bid.waiter_lease.to_string());
        let (inbox_tag, window) = (tag(bid.client), WINDOW.to_string());
        let permits = bid.permits.map(|n| n.to_string()).unwrap_or_default();
        self.eval(
            &self.acquire,
            &RW_KEYS,
            &[
                bid.owner,
                &lease,
                bid.op,
                bid.waiter,
                &waiter_lease,
                self.mode,
                "1000",
                RW_LOCK_ID,
                bid.side.name(),
                &inbox_tag,
                &window,
                if bid.notice { "1" } else { "" },
                &permits,
                fence_arg,
            ],
        )
    }

    /// `rw_acquire` that may create the fence key (as after the layout check).
    pub(crate) fn acquire(&self, bid: Bid) -> Vec<i64> {
        ints(self.attempt(bid, &fence_arg(true)))
    }

    /// `rw_release` of one level (or with `all`, every level) of `owner`'s hold of `side`,
    /// taken over by `heir` = (owner, waiter id) if given; the raw reply.
    pub(crate) fn release_raw(
        &self,
        side: Side,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        heir: Option<(&str, &str)>,
    ) -> Resp {
        let heir = heir.map(|(owner, waiter)| Heir {
            owner,
            waiter,
            limit: 0,
            asks: true,
        });
        self.release_named(side, owner, token, op, all, heir, None)
    }

    /// `rw_release` naming `heir` (`ARGV[10..15]`: its owner, waiter id, lease
    /// [`SUCCESSOR_LEASE`], the hand-over limit, its client's inbox tag, and the waiter lease
    /// when it asks by this call, else "") and `floor` (`ARGV[16]`) if given; the raw reply.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release_named(
        &self,
        side: Side,
        owner: &str,
        token: i64,
        op: &str,
        all: bool,
        heir: Option<Heir>,
        floor: Option<i64>,
    ) -> Resp {
        let (token, window) = (token.to_string(), WINDOW.to_string());
        let (successor, waiter, lease, limit, inbox_tag, queues) = match heir {
            Some(heir) => (
                heir.owner,
                heir.waiter,
                SUCCESSOR_LEASE.to_string(),
                heir.limit.to_string(),
                tag(heir.owner),
                if heir.asks {
                    WAITER_LEASE.to_string()
                } else {
                    String::new()
                },
            ),
            None => (
                "",
                "",
                "0".to_owned(),
                "0".to_owned(),
                String::new(),
                String::new(),
            ),
        };
        let floor = floor.map(|floor| floor.to_string()).unwrap_or_default();
        self.eval(
            &self.release,
            &RW_KEYS,
            &[
                owner,
                &token,
                op,
                if all { "1" } else { "0" },
                &window,
                self.mode,
                "1000",
                RW_LOCK_ID,
                side.name(),
                successor,
                waiter,
                &lease,
                &limit,
                &inbox_tag,
                &queues,
                &floor,
            ],
        )
    }

    /// `rw_release` of one level of `owner`'s hold of `side`.
    pub(crate) fn release(&self, side: Side, owner: &str, token: i64, op: &str) -> Vec<i64> {
        ints(self.release_raw(side, owner, token, op, false, None))
    }

    /// `rw_release` of every level of `owner`'s hold of `side`.
    pub(crate) fn release_all(&self, side: Side, owner: &str, token: i64, op: &str) -> Vec<i64> {
        ints(self.release_raw(side, owner, token, op, true, None))
    }

    /// `rw_release` of one level of `owner`'s write hold, taken over by `heir` = (owner,
    /// waiter id).
    pub(crate) fn take_over(
        &self,
        owner: &str,
        token: i64,
        op: &str,
        heir: (&str, &str),
    ) -> Vec<i64> {
        ints(self.release_raw(Side::Write, owner, token, op, false, Some(heir)))
    }

    /// `rw_leave` of `waiter`; the raw reply.
    pub(crate) fn leave_raw(&self, waiter: &str) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.leave,
            &RW_KEYS,
            &no_call(waiter, &window, self.mode, RW_LOCK_ID),
        )
    }

    pub(crate) fn leave(&self, waiter: &str) -> Vec<i64> {
        ints(self.leave_raw(waiter))
    }

    /// `rw_force_unlock`; the raw reply.
    pub(crate) fn force_raw(&self) -> Resp {
        let window = WINDOW.to_string();
        self.eval(
            &self.force,
            &RW_KEYS,
            &no_call("", &window, self.mode, RW_LOCK_ID),
        )
    }

    pub(crate) fn force_unlock(&self) -> Vec<i64> {
        ints(self.force_raw())
    }

    /// `rw_heartbeat` (a batch) with the waiter lease `waiter_lease`: for each (hold key,
    /// waiter ids) of `locks`, the key in KEYS and the count and the ids in ARGV; the raw
    /// reply.
    pub(crate) fn heartbeat_raw(&self, waiter_lease: i64, locks: &[(&str, &[&str])]) -> Resp {
        // Each lock's hash, queue and read holds' ends (`{t:s}:rw:N`, `{t:s}:rw.wait:N` and
        // `{t:s}:rw.read:N`).
        let groups: Vec<[String; 3]> = locks
            .iter()
            .map(|(hold, _)| {
                [
                    hold.to_string(),
                    hold.replacen(":rw:", ":rw.wait:", 1),
                    hold.replacen(":rw:", ":rw.read:", 1),
                ]
            })
            .collect();
        let keys: Vec<&str> = groups.iter().flatten().map(String::as_str).collect();
        let counts: Vec<String> = locks.iter().map(|(_, ids)| ids.len().to_string()).collect();
        let waiter_lease = waiter_lease.to_string();
        let mut args = vec![waiter_lease.as_str()];
        for ((_, ids), count) in locks.iter().zip(&counts) {
            args.push(count.as_str());
            args.extend(ids.iter().copied());
        }
        self.eval(&self.heartbeat, &keys, &args)
    }

    /// `rw_heartbeat` of `ids` on [`RW_HOLD`], with the waiter lease [`WAITER_LEASE`].
    pub(crate) fn heartbeat(&self, ids: &[&str]) -> Vec<i64> {
        ints(self.heartbeat_raw(WAITER_LEASE, &[(RW_HOLD, ids)]))
    }

    /// `rw_renew` (a batch) with `lease`: for each (hold key, side, owner, token) of `holds`,
    /// the key in KEYS and its group in ARGV; the raw reply.
    pub(crate) fn renew_raw(&self, lease: i64, holds: &[(&str, Side, &str, i64)]) -> Resp {
        // Each hold's hash and read holds' ends (`{t:s}:rw:N` and `{t:s}:rw.read:N`).
        let reads: Vec<String> = holds
            .iter()
            .map(|(hold, ..)| hold.replacen(":rw:", ":rw.read:", 1))
            .collect();
        let keys: Vec<&str> = holds
            .iter()
            .zip(&reads)
            .flat_map(|((hold, ..), reads)| [*hold, reads.as_str()])
            .collect();
        let tokens: Vec<String> = holds.iter().map(|(.., t)| t.to_string()).collect();
        let lease = lease.to_string();
        let mut args = vec![lease.as_str()];
        for ((_, side, owner, _), token) in holds.iter().zip(&tokens) {
            args.extend([side.name(), owner, token.as_str()]);
        }
        self.eval(&self.renew, &keys, &args)
    }

    /// `rw_renew` of holds of [`RW_HOLD`]: (side, owner, token) each.
    pub(crate) fn renew(&self, lease: i64, holds: &[(Side, &str, i64)]) -> Vec<i64> {
        let holds: Vec<(&str, Side, &str, i64)> = holds
            .iter()
            .map(|&(side, owner, token)| (RW_HOLD, side, owner, token))
            .collect();
        ints(self.renew_raw(lease, &holds))
    }

    /// `rw_inspect`; the raw reply.
    pub(crate) fn inspect_raw(&self) -> Resp {
        self.eval(&self.inspect, &RW_KEYS, &[])
    }

    pub(crate) fn inspect(&self) -> Vec<i64> {
        ints(self.inspect_raw())
    }

    /// The span of the last call.
    pub(crate) fn span(&self) -> Span {
        self.span.get()
    }

    /// The server clock in µs.
    pub(crate) fn clock(&self) -> i64 {
        server_micros(self.server)
    }

    pub(crate) fn clock_ms(&self) -> i64 {
        self.clock().div_euclid(1000)
    }

    /// The hash, every field (panics on an unknown field).
    pub(crate) fn hash(&self) -> RwHash {
        let items = self.server.cmd(&["HGETALL", RW_HOLD]).as_array();
        let mut fields: BTreeMap<String, String> = items
            .chunks(2)
            .map(|pair| {
                (
                    pair[0].as_str().expect("a field name"),
                    pair[1].as_str().expect("a field value"),
                )
            })
            .collect();
        let mut take = |name: &str| fields.remove(name);
        let hash = RwHash {
            o: take("o"),
            c: take("c"),
            f: take("f"),
            l: take("l"),
            r: take("r"),
            x: take("x"),
            q: (!items.is_empty()).then(|| rw_queue_text(self.server)),
            g: take("g"),
            e: take("e"),
            s: (!items.is_empty()).then(|| rw_reads_text(self.server)),
            n: take("n"),
        };
        // The notice field: checked through `notice_tag` where a test asks for notices; the
        // read holds' fields, through `s`.
        fields.remove("i");
        fields.retain(|name, _| !name.starts_with('='));
        assert!(fields.is_empty(), "unknown fields in the hash: {fields:?}");
        hash
    }

    /// Field `i`: the inbox tag of the write holder's client that is to hear of the hold's
    /// first waiter ("" or absent: none).
    pub(crate) fn notice_tag(&self) -> String {
        self.server
            .cmd(&["HGET", RW_HOLD, "i"])
            .as_str()
            .unwrap_or_default()
    }

    pub(crate) fn assert_hash(&self, expected: &RwHash, what: &str) {
        let expected = RwHash {
            s: sorted_lines(&expected.s),
            ..expected.clone()
        };
        assert_eq!(self.hash(), expected, "{what}");
    }

    /// The hash's token (field `f`).
    pub(crate) fn token(&self) -> i64 {
        let f = self.hash().f.expect("the hash's token");
        f.parse()
            .unwrap_or_else(|e| panic!("the hash's token {f:?}: {e}"))
    }

    /// The token of `owner`'s read line in `s` (drawn when its read hold began).
    pub(crate) fn read_token(&self, owner: &str) -> i64 {
        let s = self.hash().s.unwrap_or_default();
        let line = s
            .lines()
            .find(|line| line.split(' ').next() == Some(owner))
            .unwrap_or_else(|| panic!("no read line of {owner} in {s:?}"));
        let token = line.split(' ').nth(2).expect("a read line's token");
        token
            .parse()
            .unwrap_or_else(|e| panic!("the token of {line:?}: {e}"))
    }

    /// Sets the token `f` [`AHEAD`] of the server clock (the other fields and the ttl kept) and
    /// returns it: the next token drawn from the hash (a write or a read hold's) is exactly one
    /// above it.
    pub(crate) fn push_ahead(&self) -> i64 {
        let token = self.clock() + AHEAD;
        let ttl = self.pttl();
        self.server.cmd(&["HSET", RW_HOLD, "f", &token.to_string()]);
        assert!(self.pttl() <= ttl, "HSET changed the hash's ttl");
        token
    }

    /// The hash's remaining time in ms.
    pub(crate) fn pttl(&self) -> i64 {
        self.server.cmd(&["PTTL", RW_HOLD]).as_int()
    }

    /// The time `name` of the hash ([`hash_times`]), asserted to be `ms` after the clock of the
    /// call that last wrote it.
    fn stamped(&self, name: &str, ms: i64) -> i64 {
        let time = *hash_times(self.server)
            .get(name)
            .unwrap_or_else(|| panic!("the hash holds no time {name:?}"));
        let span = *self
            .stamps
            .borrow()
            .get(name)
            .unwrap_or_else(|| panic!("no call wrote {name:?}"));
        span.shifted(ms)
            .assert_contains(time, &format!("{name}, {ms} ms after its call"));
        time
    }

    /// The write hold's end `e`, asserted to be `lease` ms after the clock of the call that
    /// set it.
    pub(crate) fn write_end(&self, lease: i64) -> i64 {
        self.stamped("e", lease)
    }

    /// The end of `owner`'s read line, asserted to be `lease` ms after the clock of the call
    /// that set it.
    pub(crate) fn read_end(&self, owner: &str, lease: i64) -> i64 {
        self.stamped(&format!("s {owner}"), lease)
    }

    /// `owner`'s read line as it must be: its count, token, op and waiter column, and its end
    /// `lease` ms after the clock of the call that set it ([`Rw::read_end`]).
    pub(crate) fn reader(
        &self,
        owner: &str,
        count: i64,
        token: i64,
        lease: i64,
        op: &str,
        waiter: &str,
    ) -> String {
        let ends = self.read_end(owner, lease);
        format!("{owner} {count} {token} {ends} {op} {waiter}\n")
    }

    /// The queue line of `bid`'s waiter as it must be: waiter id, inbox tag, owner, lease,
    /// grant ms, and the time its waiter is known alive until, one waiter lease after the clock
    /// of the call that queued it (or of the heartbeat that moved it on).
    pub(crate) fn queued(&self, bid: Bid) -> String {
        self.queued_alive(bid, bid.waiter_lease)
    }

    /// The queue line of `bid`'s waiter as [`Rw::queued`], its alive time `alive` ms after the
    /// clock of the call that last set it (a heartbeat with another waiter lease).
    pub(crate) fn queued_alive(&self, bid: Bid, alive: i64) -> String {
        let alive = self.stamped(&format!("q {}", bid.waiter), alive);
        let queued_at = self.stamped(&format!("qat {}", bid.waiter), 0);
        format!(
            "{} {} {} {} {} {queued_at} {alive}\n",
            bid.waiter,
            tag(bid.client),
            bid.owner,
            bid.lease,
            bid.grant_ms()
        )
    }

    /// The latest end of the hash's holds (the write end and every read line's), if any.
    pub(crate) fn latest_end(&self) -> Option<i64> {
        hash_times(self.server)
            .into_iter()
            .filter(|(name, _)| !name.starts_with('q'))
            .map(|(_, time)| time)
            .max()
    }

    /// Asserts that the hash expires at `at` (server ms, within [`EXPIRY_SLACK`]).
    pub(crate) fn assert_expires(&self, at: Span, what: &str) {
        let before = self.clock_ms();
        let pttl = self.pttl();
        let after = self.clock_ms();
        assert!(pttl > 0, "{what}: ttl {pttl}");
        assert!(
            before + pttl <= at.to + EXPIRY_SLACK && after + pttl + 1 >= at.from - EXPIRY_SLACK,
            "{what}: expires {pttl} ms after {before}..={after}, not at {}..={}",
            at.from,
            at.to
        );
    }

    /// Asserts that the hash expires with its latest hold ([`Rw::latest_end`]).
    pub(crate) fn assert_lasts_as_its_holds(&self, what: &str) {
        let end = self
            .latest_end()
            .unwrap_or_else(|| panic!("{what}: no hold"));
        self.assert_expires(Span { from: end, to: end }, what);
    }

    /// Asserts that the hash expires the retry window after the last call (what a call that
    /// leaves no hold sets: a tombstone).
    pub(crate) fn assert_lasts_the_window(&self, what: &str) {
        self.assert_expires(self.span().shifted(WINDOW), what);
    }

    /// Asserts that `reply` is the busy reply of the last call: `{0, bound, mark}`, the bound
    /// counting down to `until` (server ms) from the call's clock, the mark the lock's latest
    /// token `f` as the call left it (after any grant it made): a grant made later draws a
    /// token above it.
    pub(crate) fn assert_busy(&self, reply: &[i64], until: i64, what: &str) {
        self.assert_waits(reply, 0, until, what);
    }

    /// Asserts that `reply` is the reply of the last call, a take-over whose successor joined
    /// the queue: `{2, bound, mark}`, as a busy reply ([`Rw::assert_busy`]).
    pub(crate) fn assert_joined(&self, reply: &[i64], until: i64, what: &str) {
        self.assert_waits(reply, 2, until, what);
    }

    fn assert_waits(&self, reply: &[i64], code: i64, until: i64, what: &str) {
        assert_eq!(reply.len(), 3, "{what}: {reply:?}");
        assert_eq!(reply[0], code, "{what}: {reply:?}");
        let span = self.span();
        span.assert_contains(until - reply[1], &format!("{what}: the bound's start"));
        assert_eq!(
            reply[2],
            self.token(),
            "{what}: the mark is not the lock's latest token"
        );
    }

    /// Asserts that `reply` answers an acquisition that a release granted the hold already:
    /// `{1, token, count, remaining}`, remaining counting down to `until` from the call's clock.
    pub(crate) fn assert_granted_already(
        &self,
        reply: &[i64],
        token: i64,
        count: i64,
        until: i64,
        what: &str,
    ) {
        assert_eq!(reply.len(), 4, "{what}: {reply:?}");
        assert_eq!(reply[..3], [1, token, count], "{what}: {reply:?}");
        self.span().assert_contains(
            until - reply[3],
            &format!("{what}: the remaining time's start"),
        );
    }

    /// Every event in the inbox stream of `client`, oldest first.
    pub(crate) fn inbox_events(&self, client: &str) -> Vec<String> {
        inbox_events(self.server, client)
    }

    /// Runs `inbox_keep` for the inboxes of `clients`, as their readers do.
    pub(crate) fn open_inboxes(&self, clients: &[&str]) {
        open_inboxes(self.server, clients);
    }

    /// The value of every key the read-write scripts may touch, and of `more`.
    pub(crate) fn dump(&self, more: &[&str]) -> Vec<Option<Vec<u8>>> {
        let mut keys = RW_KEYS.to_vec();
        keys.push(SEQ);
        keys.extend(more);
        dump_keys(self.server, &keys)
    }

    /// Asserts that no call created a key it has no business with: the shard's event stream
    /// and counter (events go to inboxes only).
    pub(crate) fn assert_no_stray_keys(&self) {
        for key in [RW_OPS, EVENTS, SEQ] {
            assert!(!exists(self.server, key), "{key} was created");
        }
    }
}
