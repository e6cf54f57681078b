//! The fast paths of an exclusive lock (`hold_take.lua`, `hold_free.lua`): each applies to the
//! uncontended case alone, writes there what the full script writes (`hold_acquire.lua`,
//! `hold_release.lua`), answers its own retries, and changes nothing where it does not apply
//! (`{-2}`), which leaves the call to the full script.

use crate::lua::*;
use crate::support::*;

/// Not the fast path's case, on a contended lock (held by another owner, waiters queued):
/// nothing changed, the full script's turn.
const CONTENDED: [i64; 1] = [-2];
/// Not the fast path's case for another reason (no hash, not the caller's hold): nothing
/// changed, the full script's turn.
const NOT_ITS_CASE: [i64; 1] = [-3];

/// The fast take applies to a tombstone only: a lock with no hash (a first take draws from the
/// fence key), a held lock (another owner's, or the caller's: a re-entry) are left alone. Over a
/// tombstone it writes what the full take writes (the freed-by chain kept), with a token above
/// the lock's last, and answers a retry of itself while its hold lasts; with a notice tag it
/// keeps that tag in `i`, where the first waiter finds it.
#[test]
fn the_fast_take_takes_a_tombstone_as_the_full_take_does_and_nothing_else() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["a"]);

    assert_eq!(
        lua.take_fast("a", "a-0", ""),
        NOT_ITS_CASE,
        "no hash: no token to continue"
    );
    assert!(!exists(&server, HOLD), "nothing written");
    assert!(!exists(&server, FENCE), "the fence key is not read");

    let t = lua.acquire(Ask::once("a", "a-1"))[1];
    assert_eq!(lua.release("a", t, "a-free"), vec![1, 0]);
    let fence = snapshot(&server, FENCE);

    let clock = lua.clock();
    let taken = lua.take_fast("b", "b-1", "");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let tb = taken[1];
    assert_drawn(tb, t, clock, "the fast take");
    let expected = HoldHash {
        x: "a-free".to_owned(),
        ..held("b", tb, LEASE, "b-1")
    };
    lua.assert_hold(&expected, LEASE, "b's fast take");
    assert_eq!(
        snapshot(&server, FENCE),
        fence,
        "the fence key is left alone"
    );
    assert_eq!(
        lua.take_fast("b", "b-1", ""),
        vec![1, tb, 1],
        "a retry is answered"
    );

    let before = lua.dump(&[]);
    assert_eq!(
        lua.take_fast("c", "c-1", ""),
        CONTENDED,
        "held by another owner"
    );
    assert_eq!(
        lua.take_fast("b", "b-2", ""),
        CONTENDED,
        "a re-entry is the full take's"
    );
    assert_eq!(lua.dump(&[]), before, "nothing changed");

    // The full take re-enters; the full release and the fast take then carry on the chain.
    assert_eq!(lua.acquire(Ask::once("b", "b-2")), vec![1, tb, 2]);
    assert_eq!(lua.release("b", tb, "b-free-1"), vec![1, 1]);
    assert_eq!(lua.release("b", tb, "b-free-2"), vec![1, 0]);
    let ta = lua.take_fast("a", "a-2", &tag("a"))[1];
    assert!(ta > tb);
    let expected = HoldHash {
        x: "b-free-2,a-free".to_owned(),
        i: tag("a"),
        ..held("a", ta, LEASE, "a-2")
    };
    assert_eq!(lua.hash(), expected, "the notice tag is kept");
    assert_eq!(lua.acquire(Ask::waiting("b", "b-3", "wb")), busy(LEASE, ta));
    assert_eq!(
        lua.inbox_events("a"),
        [format!("0|held|{ta}|{LOCK_ID}")],
        "the first waiter tells a's client"
    );
    lua.assert_no_stray_keys();
}

/// The fast release counts a hold down or frees it to the same tombstone as the full release,
/// clearing what a grant wrote (`g`, `t`), and answers a retry of itself. It leaves alone a
/// hold with waiters queued (a grant is the full release's), another owner's or a newer token,
/// and a lock no longer held.
#[test]
fn the_fast_release_frees_as_the_full_release_does_and_leaves_the_rest_to_it() {
    init_tracing();
    let server = RedisServer::start();
    let lua = Lua::new(&server, "stream");
    lua.open_inboxes(&["a", "b"]);

    let t = lua.acquire(Ask::once("a", "a-1"))[1];
    assert_eq!(lua.acquire(Ask::once("a", "a-2")), vec![1, t, 2]);
    assert_eq!(lua.free_fast("a", t, "a-free-1", false), vec![1, 1]);
    assert_eq!(
        lua.free_fast("a", t, "a-free-1", false),
        vec![1, 1],
        "a retry"
    );
    let counted = HoldHash {
        r: "a-free-1".to_owned(),
        ..held("a", t, LEASE, "a-1")
    };
    assert_eq!(lua.hash(), counted);

    // Waiters queued, another owner, another token: the full release's.
    assert_eq!(lua.acquire(Ask::waiting("b", "b-1", "wb")), busy(LEASE, t));
    let before = lua.dump(&[]);
    assert_eq!(
        lua.free_fast("a", t, "a-free-2", false),
        CONTENDED,
        "b waits"
    );
    assert_eq!(
        lua.free_fast("b", t, "b-free", false),
        NOT_ITS_CASE,
        "not b's"
    );
    assert_eq!(
        lua.free_fast("a", t + 1, "a-free-3", false),
        NOT_ITS_CASE,
        "not this token"
    );
    assert_eq!(lua.dump(&[]), before, "nothing changed");

    // The full release grants the lock to b; b's fast release frees it, the grant's marks
    // cleared, to the tombstone the full release leaves.
    assert_eq!(lua.release("a", t, "a-free-2"), vec![1, 0]);
    let tb = lua.token();
    let grant = HoldHash {
        x: "a-free-2".to_owned(),
        ..granted("b", tb, WAITER_LEASE, "wb")
    };
    assert_eq!(lua.hash(), grant);
    assert_eq!(lua.free_fast("b", tb, "b-free", true), vec![1, 0]);
    lua.assert_hold(
        &tombstone(tb, WAITER_LEASE, "b-free", "b-free,a-free-2"),
        WINDOW,
        "b's fast release",
    );
    assert_eq!(
        lua.free_fast("b", tb, "b-free", true),
        vec![1, 0],
        "a retry"
    );
    let before = lua.dump(&[]);
    assert_eq!(
        lua.free_fast("b", tb, "b-again", false),
        NOT_ITS_CASE,
        "not held"
    );
    assert_eq!(lua.dump(&[]), before, "nothing changed");
    assert_eq!(
        lua.release("b", tb, "b-again"),
        vec![0, 0],
        "the full release says so"
    );
    lua.assert_no_stray_keys();
}
