//! The read-write lock's scripts (`rw_*.lua`, `queue_*.lua`, `lua/lib/rw.lua`): reads before
//! writes. The scripts check no key's type with `TYPE`; each key's first access is a typed
//! read before the first write (or, where its header says so, the script's first write), so a
//! foreign value under any key a call touches fails it with WRONGTYPE before anything is
//! written. Each test here builds one state of lock `x`, plants a foreign value under one key at
//! a time, replays one call, and checks that it either failed with WRONGTYPE and changed
//! nothing, or succeeded without touching the foreign value; and that the keys the call's path
//! touches are among those that failed it. Also: the retries of releases, answered from the op
//! field or from `done`.

use std::thread::sleep;
use std::time::Duration;

use crate::lua::*;
use crate::support::*;

const HOLD: &str = "{t:0}:rw:x";
const READERS: &str = "{t:0}:rw.readers:x";
const QUEUE: &str = "{t:0}:rw.queue:x";
const ALIVE: &str = "{t:0}:rw.alive:x";
const DONE: &str = "{t:0}:rw.done:x";
/// Every key of the lock and of its shard, in the canonical order (`lua/README.md`).
const RW_KEYS: [&str; 8] = [HOLD, READERS, FENCE, EVENTS, SEQ, QUEUE, ALIVE, DONE];
const RW_LOCK_ID: &str = "rw:x";
const MODE: &str = "stream";
/// The retry window (ms).
const TOMB: &str = "5000";

/// The inbox of waiter ids "<r|w><tag>.<n>" with tag "tag<owner>" (as `lua::inbox`).
fn waiter(side: char, owner: &str, n: u32) -> String {
    format!("{side}{}.{n}", tag(owner))
}

/// The composed read-write scripts.
struct Rw<'a> {
    server: &'a RedisServer,
    acquire: String,
    release: String,
    renew: String,
    inspect: String,
    force: String,
    leave: String,
    heartbeat: String,
}

impl<'a> Rw<'a> {
    fn new(server: &'a RedisServer) -> Self {
        let rw = [QUEUE_LIB, NOTIFY_LIB, RW_LIB];
        Rw {
            server,
            acquire: composed(
                &[FENCE_LIB, QUEUE_LIB, NOTIFY_LIB, RW_LIB],
                include_str!("../../lua/rw_acquire.lua"),
            ),
            release: composed(&rw, include_str!("../../lua/rw_release.lua")),
            renew: composed(&rw, include_str!("../../lua/rw_renew.lua")),
            inspect: composed(&[QUEUE_LIB], include_str!("../../lua/rw_inspect.lua")),
            force: composed(&rw, include_str!("../../lua/rw_force_unlock.lua")),
            leave: composed(&rw, include_str!("../../lua/queue_leave.lua")),
            heartbeat: composed(&rw, include_str!("../../lua/queue_heartbeat.lua")),
        }
    }

    fn eval(&self, script: &str, keys: &[&str], args: &[&str]) -> Resp {
        let count = keys.len().to_string();
        let mut command = vec!["EVAL", script, &count];
        command.extend(keys);
        command.extend(args);
        self.server.cmd(&command)
    }

    /// `rw_acquire`: side, owner, op, waiter id and waiter lease (0: a try); lease 30 s.
    fn acquire(&self, side: &str, owner: &str, op: &str, waiter: &str, waiter_lease: i64) -> Resp {
        self.acquire_for(side, owner, op, waiter, waiter_lease, 30_000)
    }

    fn acquire_for(
        &self,
        side: &str,
        owner: &str,
        op: &str,
        waiter: &str,
        waiter_lease: i64,
        lease: i64,
    ) -> Resp {
        let (lease, waiter_lease) = (lease.to_string(), waiter_lease.to_string());
        let create = fence_arg(true);
        self.eval(
            &self.acquire,
            &RW_KEYS[..7],
            &[
                owner,
                &lease,
                op,
                waiter,
                &waiter_lease,
                MODE,
                "1000",
                RW_LOCK_ID,
                side,
                TOMB,
                &create,
            ],
        )
    }

    /// Takes a hold that must be granted; returns its token.
    fn take(&self, side: &str, owner: &str, op: &str) -> i64 {
        let reply = ints(self.acquire(side, owner, op, &waiter(side_char(side), owner, 0), 0));
        assert_eq!(reply[0], 1, "{side} {owner} {op}: {reply:?}");
        reply[1]
    }

    /// An attempt that must wait (and queue).
    fn wait(&self, side: &str, owner: &str, op: &str, waiter: &str, waiter_lease: i64) {
        let reply = ints(self.acquire(side, owner, op, waiter, waiter_lease));
        assert_eq!(reply[0], 0, "{side} {owner} {op}: {reply:?}");
    }

    /// `rw_release`.
    fn release(&self, side: &str, owner: &str, token: i64, op: &str, all: bool) -> Resp {
        let token = token.to_string();
        let all = if all { "1" } else { "0" };
        self.eval(
            &self.release,
            &RW_KEYS,
            &[owner, &token, op, all, TOMB, MODE, "1000", RW_LOCK_ID, side],
        )
    }

    fn renew(&self, side: &str, owner: &str, token: i64) -> Resp {
        let token = token.to_string();
        self.eval(
            &self.renew,
            &[HOLD, READERS],
            &["30000", side, owner, &token],
        )
    }

    fn inspect(&self) -> Resp {
        self.eval(&self.inspect, &[HOLD, READERS], &[])
    }

    fn force_unlock(&self) -> Resp {
        self.eval(
            &self.force,
            &RW_KEYS[..7],
            &["", "", "", "", "", MODE, "1000", RW_LOCK_ID],
        )
    }

    fn leave(&self, waiter: &str) -> Resp {
        self.eval(
            &self.leave,
            &RW_KEYS[..7],
            &["", "", "", waiter, "", MODE, "1000", RW_LOCK_ID, "rw"],
        )
    }

    fn heartbeat(&self, waiters: &[&str]) -> Resp {
        let n = waiters.len().to_string();
        let mut args = vec!["3000", MODE, "1000", "rw", RW_LOCK_ID, &n];
        args.extend(waiters);
        self.eval(
            &self.heartbeat,
            &[HOLD, READERS, QUEUE, ALIVE, EVENTS, SEQ],
            &args,
        )
    }

    /// Creates `owner`'s client's inbox (an empty-ish stream), so that events reach it.
    fn open_inbox(&self, owner: &str) {
        self.server.cmd(&["XADD", &inbox(owner), "*", "open", "1"]);
    }

    /// Owner "a" takes the write lock, the `queued` writers (owner, waiter id, waiter lease ms)
    /// queue behind it in that order, the inboxes of `open` exist, and "a" releases: the lock
    /// is free and the head of the queue is named.
    fn free_with_queued_writers(&self, queued: &[(&str, &str, i64)], open: &[&str]) {
        let token = self.take("write", "a", "a1");
        for (owner, waiter, lease) in queued {
            self.wait("write", owner, &format!("{owner}1"), waiter, *lease);
        }
        for owner in open {
            self.open_inbox(owner);
        }
        assert_eq!(
            ints(self.release("write", "a", token, "a2", false)),
            vec![1, 0]
        );
    }

    /// The value and the ttl (ms) of each key.
    fn state(&self, keys: &[&str]) -> State {
        keys.iter()
            .map(|key| {
                (
                    key.to_string(),
                    self.server.cmd(&["DUMP", key]).as_bytes(),
                    self.server.cmd(&["PTTL", key]).as_int(),
                )
            })
            .collect()
    }
}

fn side_char(side: &str) -> char {
    if side == "write" {
        'w'
    } else {
        'r'
    }
}

/// Plants a value of another type than fredlock's under `key` (a string under a hash, a ZSET,
/// a list or a stream; a list under a string).
fn plant(server: &RedisServer, key: &str) {
    server.cmd(&["DEL", key]);
    if key == FENCE || key == SEQ {
        server.cmd(&["RPUSH", key, "foreign"]);
    } else {
        server.cmd(&["SET", key, "foreign"]);
    }
}

/// Each key, its DUMP and its ttl.
type State = Vec<(String, Option<Vec<u8>>, i64)>;

/// Asserts that two states are the same: equal values, and no ttl pushed forward (a ttl only
/// runs down while nothing writes it).
fn assert_unchanged(before: &State, after: &State, what: &str) {
    for ((key, value, ttl), (_, value_after, ttl_after)) in before.iter().zip(after) {
        assert_eq!(value, value_after, "{what}: {key} changed");
        if *ttl < 0 {
            assert_eq!(ttl, ttl_after, "{what}: {key}'s ttl changed");
        } else {
            assert!(
                ttl_after <= ttl && *ttl_after >= 0,
                "{what}: {key}'s ttl went from {ttl} to {ttl_after}"
            );
        }
    }
}

/// One state of lock `x` and one call: `setup` builds the state on an empty server and returns
/// what `call` needs; `touched` are the keys whose foreign value must fail the call.
fn check_every_key(
    server: &RedisServer,
    name: &str,
    touched: &[&str],
    inboxes: &[String],
    setup: &dyn Fn(&Rw) -> i64,
    call: &dyn Fn(&Rw, i64) -> Resp,
) {
    let rw = Rw::new(server);
    let every: Vec<&str> = RW_KEYS
        .iter()
        .copied()
        .chain(inboxes.iter().map(String::as_str))
        .collect();
    // The call itself works on the state.
    server.cmd(&["FLUSHALL"]);
    let token = setup(&rw);
    let reply = call(&rw, token);
    assert!(!reply.is_error(), "{name}: {reply:?}");
    for key in RW_KEYS {
        server.cmd(&["FLUSHALL"]);
        let token = setup(&rw);
        plant(server, key);
        let before = rw.state(&every);
        let reply = call(&rw, token);
        let what = format!("{name}, foreign value under {key}");
        if reply.is_error() {
            assert_wrongtype(&reply, &what);
            assert_unchanged(&before, &rw.state(&every), &what);
        } else {
            assert!(!touched.contains(&key), "{what}: not refused: {reply:?}");
            let at = RW_KEYS.iter().position(|k| *k == key).unwrap();
            assert_unchanged(&before[at..=at].to_vec(), &rw.state(&[key]), &what);
        }
    }
}

/// Every key of every call path: a foreign value fails the call before it writes anything (or
/// the call does not touch it, and leaves it alone).
#[test]
fn a_foreign_value_under_any_key_fails_the_call_before_any_write() {
    init_tracing();
    let server = RedisServer::start();
    let (wb, wc) = (waiter('w', "b", 1), waiter('w', "c", 1));
    let rd = waiter('r', "d", 1);
    let inboxes: Vec<String> = ["b", "c", "d", "e"].iter().map(|o| inbox(o)).collect();

    // A writer that another owner's write hold keeps out: RPUSH is the script's first write.
    check_every_key(
        &server,
        "a write attempt behind a writer",
        &[HOLD, FENCE, QUEUE, ALIVE],
        &inboxes,
        &|rw| rw.take("write", "a", "a1"),
        &|rw, _| rw.acquire("write", "b", "b1", &wb, 3000),
    );
    // The same writer, queued already: the queue is read first.
    check_every_key(
        &server,
        "a queued writer's next attempt behind a writer",
        &[HOLD, FENCE, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            let token = rw.take("write", "a", "a1");
            rw.wait("write", "b", "b1", &wb, 3000);
            token
        },
        &|rw, _| rw.acquire("write", "b", "b2", &wb, 3000),
    );
    // A queued writer at the head of a free lock takes it (and draws a token).
    check_every_key(
        &server,
        "a queued writer takes the free lock",
        &[HOLD, READERS, FENCE, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            let token = rw.take("write", "a", "a1");
            rw.wait("write", "b", "b1", &wb, 3000);
            rw.open_inbox("b");
            assert_eq!(
                ints(rw.release("write", "a", token, "a2", false)),
                vec![1, 0]
            );
            0
        },
        &|rw, _| rw.acquire("write", "b", "b2", &wb, 3000),
    );
    // A writer behind a live reader, with an expired reader to purge first.
    check_every_key(
        &server,
        "a write attempt behind readers, one of them expired",
        &[HOLD, READERS, FENCE, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            let reply = ints(rw.acquire_for("read", "d", "d1", &rd, 0, 1));
            assert_eq!(reply[0], 1);
            rw.take("read", "e", "e1");
            sleep(Duration::from_millis(5));
            0
        },
        &|rw, _| rw.acquire("write", "b", "b1", &wb, 3000),
    );
    // A queued reader goes past a dead writer queued ahead of it.
    check_every_key(
        &server,
        "a queued reader goes past a dead writer",
        &[HOLD, READERS, FENCE, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            // a's write hold runs out on its own (no release wakes anyone), c dies waiting.
            let reply = ints(rw.acquire_for("write", "a", "a1", &waiter('w', "a", 0), 0, 150));
            assert_eq!(reply[0], 1);
            rw.wait("write", "c", "c1", &wc, 1);
            rw.wait("read", "d", "d1", &rd, 3000);
            sleep(Duration::from_millis(170));
            0
        },
        &|rw, _| rw.acquire("read", "d", "d2", &rd, 3000),
    );
    // A reader re-enters; a writer downgrades.
    check_every_key(
        &server,
        "a read re-entry",
        &[HOLD, READERS, FENCE],
        &inboxes,
        &|rw| rw.take("read", "d", "d1"),
        &|rw, _| rw.acquire("read", "d", "d2", &rd, 0),
    );
    check_every_key(
        &server,
        "a downgrade",
        &[HOLD, READERS, FENCE],
        &inboxes,
        &|rw| rw.take("write", "a", "a1"),
        &|rw, _| rw.acquire("read", "a", "a2", &waiter('r', "a", 1), 0),
    );

    // A final write release wakes the queued writer: into its inbox (the shard's stream and
    // counter are not touched), or, without one, on the shard's stream.
    let release_setup = |open: bool| {
        move |rw: &Rw| {
            let token = rw.take("write", "a", "a1");
            rw.wait("write", "b", "b1", &waiter('w', "b", 1), 3000);
            if open {
                rw.open_inbox("b");
            }
            token
        }
    };
    check_every_key(
        &server,
        "a final write release, the woken writer's inbox open",
        &[HOLD, QUEUE, ALIVE, DONE],
        &inboxes,
        &release_setup(true),
        &|rw, token| rw.release("write", "a", token, "a2", false),
    );
    check_every_key(
        &server,
        "a final write release, the woken writer's inbox missing",
        &[HOLD, EVENTS, SEQ, QUEUE, ALIVE, DONE],
        &inboxes,
        &release_setup(false),
        &|rw, token| rw.release("write", "a", token, "a2", false),
    );
    // A release of a re-entered write hold: only the hash.
    check_every_key(
        &server,
        "a write release that leaves a hold",
        &[HOLD],
        &inboxes,
        &|rw| {
            let token = rw.take("write", "a", "a1");
            rw.take("write", "a", "a2");
            token
        },
        &|rw, token| rw.release("write", "a", token, "a3", false),
    );
    // The last reader leaves: the dead writer at the head is dropped, the reader behind it
    // named in a chain event (on the shard's stream: no inbox).
    check_every_key(
        &server,
        "a final read release wakes a chain past a dead head",
        &[HOLD, READERS, EVENTS, SEQ, QUEUE, ALIVE, DONE],
        &inboxes,
        &|rw| {
            let token = rw.take("read", "e", "e1");
            rw.wait("write", "c", "c1", &wc, 150);
            rw.wait("read", "d", "d1", &rd, 3000);
            sleep(Duration::from_millis(170));
            token
        },
        &|rw, token| rw.release("read", "e", token, "e2", false),
    );
    check_every_key(
        &server,
        "a write renewal",
        &[HOLD],
        &inboxes,
        &|rw| rw.take("write", "a", "a1"),
        &|rw, token| rw.renew("write", "a", token),
    );
    check_every_key(
        &server,
        "a read renewal",
        &[HOLD, READERS],
        &inboxes,
        &|rw| rw.take("read", "d", "d1"),
        &|rw, token| rw.renew("read", "d", token),
    );
    check_every_key(
        &server,
        "an inspection",
        &[HOLD, READERS],
        &inboxes,
        &|rw| rw.take("read", "d", "d1"),
        &|rw, _| rw.inspect(),
    );
    check_every_key(
        &server,
        "a force-unlock with a queued writer",
        &[HOLD, READERS, EVENTS, SEQ, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            rw.take("write", "a", "a1");
            rw.take("read", "a", "a2");
            rw.wait("write", "b", "b1", &wb, 3000);
            0
        },
        &|rw, _| rw.force_unlock(),
    );
    // The head of a free lock leaves: the next waiter is named.
    check_every_key(
        &server,
        "the head of a free lock leaves",
        &[HOLD, EVENTS, SEQ, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            rw.free_with_queued_writers(&[("b", &wb, 3000), ("c", &wc, 3000)], &["b"]);
            0
        },
        &|rw, _| rw.leave(&wb),
    );
    check_every_key(
        &server,
        "a waiter behind the head leaves",
        &[QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            rw.take("write", "a", "a1");
            rw.wait("write", "b", "b1", &wb, 3000);
            rw.wait("write", "c", "c1", &wc, 3000);
            0
        },
        &|rw, _| rw.leave(&wc),
    );
    // A heartbeat drops the dead head of a free lock and names the next waiter.
    check_every_key(
        &server,
        "a heartbeat behind a dead head",
        &[HOLD, EVENTS, SEQ, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            rw.free_with_queued_writers(&[("b", &wb, 150), ("c", &wc, 3000)], &["b"]);
            sleep(Duration::from_millis(170));
            0
        },
        &|rw, _| rw.heartbeat(&[&wc]),
    );
    check_every_key(
        &server,
        "a heartbeat on a held lock",
        &[HOLD, QUEUE, ALIVE],
        &inboxes,
        &|rw| {
            rw.take("write", "a", "a1");
            rw.wait("write", "b", "b1", &wb, 3000);
            0
        },
        &|rw, _| rw.heartbeat(&[&wb]),
    );
}

/// A release re-sent after it was applied is answered "released", whatever happened since:
/// a release that left a hold answers from the owner's op field, a final one from `done` (a
/// write hold's token is never issued again; a read hold's is, so a read release asks `done`
/// before it looks at the hold).
#[test]
fn releases_answer_their_retries() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server);

    // Write: re-entered twice, released once (op field), then for good (done).
    let token = rw.take("write", "a", "a1");
    rw.take("write", "a", "a2");
    assert_eq!(
        ints(rw.release("write", "a", token, "a3", false)),
        vec![1, 1]
    );
    assert_eq!(
        ints(rw.release("write", "a", token, "a3", false)),
        vec![1, 1]
    );
    assert_eq!(
        ints(rw.release("write", "a", token, "a4", false)),
        vec![1, 0]
    );
    assert_eq!(server.cmd(&["EXISTS", HOLD]).as_int(), 0);
    assert!(server.cmd(&["ZSCORE", DONE, "a4"]).as_str().is_some());
    assert_eq!(
        ints(rw.release("write", "a", token, "a4", false)),
        vec![1, 0]
    );
    // Another hold of the same owner since: the retry still changes nothing.
    let newer = rw.take("write", "a", "a5");
    assert!(newer > token);
    assert_eq!(
        ints(rw.release("write", "a", token, "a4", false)),
        vec![1, 0]
    );
    assert_eq!(
        ints(rw.release("write", "a", token, "a6", false)),
        vec![-1, 0]
    );
    assert_eq!(ints(rw.inspect())[..3], [1, 1, newer]);
    assert_eq!(
        ints(rw.release("write", "a", newer, "a7", false)),
        vec![1, 0]
    );
    assert_eq!(
        ints(rw.release("write", "b", newer, "b1", false)),
        vec![0, 0]
    );

    // Read: the next read hold of the same owner carries the same token (no write between).
    let token = rw.take("read", "d", "d1");
    assert_eq!(
        ints(rw.release("read", "d", token, "d2", false)),
        vec![1, 0]
    );
    let again = rw.take("read", "d", "d3");
    assert_eq!(again, token, "a read hold takes the shard's last token");
    assert_eq!(
        ints(rw.release("read", "d", token, "d2", false)),
        vec![1, 0]
    );
    assert_eq!(
        ints(rw.inspect())[3],
        1,
        "the retry left the newer read hold alone"
    );
    assert_eq!(ints(rw.release("read", "d", again, "d4", true)), vec![1, 0]);
    assert_eq!(ints(rw.inspect()), vec![0, 0, 0, 0, -2]);
}

/// Expired holds are purged by the next call that looks at them, and their owners' fields go
/// with them: a writer whose lease ran out loses its op field unless it still reads.
#[test]
fn expired_holds_are_purged_with_their_fields() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server);
    let field = |f: &str| server.cmd(&["HGET", HOLD, f]).as_str();

    // A writer that also reads: its write lease runs out, its read hold stays.
    let reply = ints(rw.acquire_for("write", "a", "a1", &waiter('w', "a", 0), 0, 1));
    assert_eq!(reply[0], 1);
    rw.take("read", "a", "a2");
    sleep(Duration::from_millis(5));
    // A reader whose lease runs out (a's write hold, run out, is purged on its way).
    assert_eq!(
        ints(rw.acquire_for("read", "d", "d1", &waiter('r', "d", 0), 0, 1))[0],
        1
    );
    sleep(Duration::from_millis(5));
    // Another reader comes: d's expired hold is purged on the way.
    rw.take("read", "e", "e1");
    assert_eq!(field("w"), None);
    assert_eq!(field("we"), None);
    assert_eq!(field("op:a"), Some("a2".to_owned()), "a still reads");
    assert_eq!(field("rc:d"), None);
    assert_eq!(field("op:d"), None);
    assert_eq!(server.cmd(&["ZSCORE", READERS, "d"]).as_str(), None);
    assert_eq!(ints(rw.inspect())[3], 2);

    // A writer whose lease ran out and that does not read: its op field goes.
    server.cmd(&["FLUSHALL"]);
    assert_eq!(
        ints(rw.acquire_for("write", "a", "a1", &waiter('w', "a", 0), 0, 1))[0],
        1
    );
    sleep(Duration::from_millis(5));
    let reply = ints(rw.acquire("write", "b", "b1", &waiter('w', "b", 0), 0));
    assert_eq!(reply[0], 1);
    assert_eq!(field("op:a"), None);
    assert_eq!(field("w"), Some("b".to_owned()));
    // The expired writer's release: not held.
    assert_eq!(ints(rw.release("write", "a", 1, "a2", false)), vec![0, 0]);
}

/// A heartbeat refreshes the listed waiters, and on a free lock drops the dead waiters at the
/// head and names the next live one; a lock listed twice is beaten once (its dead head is
/// dropped once, and no live waiter with it).
#[test]
fn a_heartbeat_drops_dead_heads_once_per_lock() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server);
    let (wb, wc, wd) = (
        waiter('w', "b", 1),
        waiter('w', "c", 1),
        waiter('w', "d", 1),
    );
    rw.free_with_queued_writers(
        &[("b", &wb, 150), ("c", &wc, 3000), ("d", &wd, 3000)],
        &["b", "c"],
    );
    sleep(Duration::from_millis(170));
    let group = ["rw", RW_LOCK_ID, "1"];
    let mut args = vec!["3000", MODE, "1000"];
    args.extend(group);
    args.push(&wc);
    args.extend(group);
    args.push(&wd);
    args.extend(group);
    args.push("wnobody.1");
    let keys = [HOLD, READERS, QUEUE, ALIVE];
    let mut all_keys: Vec<&str> = Vec::new();
    for _ in 0..3 {
        all_keys.extend(keys);
    }
    all_keys.extend([EVENTS, SEQ]);
    let codes = ints(rw.eval(&rw.heartbeat, &all_keys, &args));
    assert_eq!(codes, vec![1, 1, 0]);
    let queue: Vec<String> = server
        .cmd(&["LRANGE", QUEUE, "0", "-1"])
        .as_array()
        .iter()
        .filter_map(Resp::as_str)
        .collect();
    assert_eq!(queue, vec![wc.clone(), wd.clone()]);
    assert_eq!(server.cmd(&["ZSCORE", ALIVE, &wb]).as_str(), None);
    // c, the new head, was named in its inbox.
    let last = server.cmd(&["XREVRANGE", &inbox("c"), "+", "-", "COUNT", "1"]);
    let entry = format!("{last:?}");
    assert!(
        entry.contains(&format!("0|name|{wc}|{RW_LOCK_ID}")),
        "{entry}"
    );
}
