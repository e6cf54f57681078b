//! The count-down latch's `latch_set` and `latch_delete` (`lua/lib/latch.lua`): a call that
//! changed the latch is remembered by its op id for the retry window, so that the same call
//! delivered again answers as it did and changes nothing; a call that changed nothing leaves
//! no record.

use crate::lua::{eval, ints, HOLD_LIB, NOTIFY_LIB};
use crate::support::{composed, RedisServer};

const LATCH_LIB: &str = include_str!("../../lua/lib/latch.lua");

/// The keys of the latch `gate` in the canonical order (hold, queue, fence, events, ops).
const KEYS: [&str; 5] = [
    "{t:0}:latch:gate",
    "{t:0}:latch.wait:gate",
    "{t:0}:fence",
    "{t:0}:events",
    "{t:0}:latch.op:gate",
];

struct Latch<'a> {
    server: &'a RedisServer,
    set: String,
    delete: String,
}

impl<'a> Latch<'a> {
    fn new(server: &'a RedisServer) -> Self {
        Latch {
            server,
            set: composed(
                &[HOLD_LIB, LATCH_LIB],
                include_str!("../../lua/latch_set.lua"),
            ),
            delete: composed(
                &[NOTIFY_LIB, HOLD_LIB, LATCH_LIB],
                include_str!("../../lua/latch_delete.lua"),
            ),
        }
    }

    /// `try_set_count(count)` as the call `op`: 1 set, 0 it had a count.
    fn set(&self, op: &str, count: &str) -> i64 {
        let args = ["", "", op, "", "10000", count];
        ints(eval(self.server, &self.set, &KEYS, &args))[0]
    }

    /// `delete()` as the call `op`: 1 it had a count, 0 it was open.
    fn delete(&self, op: &str) -> i64 {
        let args = ["", "", op, "", "10000", "pubsub", "", "latch:gate"];
        ints(eval(self.server, &self.delete, &KEYS, &args))[0]
    }

    /// The count ("" when open) and the record of the calls that changed the latch.
    fn state(&self) -> (String, String) {
        let get = |key: &str| self.server.cmd(&["GET", key]).as_str().unwrap_or_default();
        (get(KEYS[0]), get(KEYS[4]))
    }
}

#[test]
fn a_set_or_delete_delivered_again_answers_as_it_did_and_changes_nothing() {
    let server = RedisServer::start();
    let latch = Latch::new(&server);
    assert_eq!(latch.set("a1", "3"), 1);
    assert_eq!(latch.state(), ("3".into(), "a1".into()));
    assert_eq!(latch.set("a1", "3"), 1, "the same set again: answered");
    assert_eq!(latch.set("b2", "5"), 0, "another set finds the count");
    assert_eq!(
        latch.state(),
        ("3".into(), "a1".into()),
        "a refused set leaves no record"
    );

    assert_eq!(latch.delete("c3"), 1);
    assert_eq!(latch.state(), ("".into(), "c3,a1".into()));
    assert_eq!(latch.delete("c3"), 1, "the same delete again: answered");
    assert_eq!(latch.delete("d4"), 0, "another delete finds it open");
    assert_eq!(latch.set("e5", "2"), 1, "a new round");
    assert_eq!(
        latch.set("a1", "3"),
        1,
        "the first set delivered once more: answered, the new count kept"
    );
    assert_eq!(
        latch.delete("c3"),
        1,
        "so is the first delete, which leaves the new round"
    );
    assert_eq!(latch.state(), ("2".into(), "e5,c3,a1".into()));
    let ttl = server.cmd(&["PTTL", KEYS[4]]).as_int();
    assert!(
        (1..=10_000).contains(&ttl),
        "the record lasts the window: {ttl}"
    );
}

#[test]
fn the_record_keeps_the_latest_calls_within_its_bound() {
    let server = RedisServer::start();
    let latch = Latch::new(&server);
    // Op ids as the client makes them: 24 hex digits, then a counter.
    let ops: Vec<String> = (1..=6)
        .map(|n| format!("{:024x}{n:x}", 0xabcdefu64))
        .collect();
    for op in &ops {
        assert_eq!(latch.set(op, "1"), 1);
        assert_eq!(latch.delete(&format!("{op}0")), 1);
    }
    let (_, record) = latch.state();
    assert!(record.len() <= 168, "{record}");
    assert!(
        record.starts_with(&format!("{}0,{}", ops[5], ops[5])),
        "{record}"
    );
    assert_eq!(latch.set(&ops[5], "1"), 1, "the latest set is answered");
    assert_eq!(
        latch.set(&ops[0], "1"),
        1,
        "the oldest, forgotten, sets the count again"
    );
    assert_eq!(latch.state().0, "1");
}
