//! The read-write lock's scripts (`rw_*.lua`, `lua/lib/rw.lua`): one hash per lock holds the
//! write hold (fields `o c f l r g` as the exclusive locks' hold, plus its end `e`), the read
//! holds (`s`, one line per owner: count, token, end, last op, the waiter id a release granted
//! it under), the freed-by chain `x` and the wait queue `q` of both sides. Takes, re-entries and
//! downgrades; tokens (every new hold, read or write, draws its own above the lock's latest,
//! `f`; a downgrade carries its write hold's); writers queuing behind readers and readers behind
//! a queued writer; grants to a writer alone and to waves of readers (one event per client);
//! retries and stale calls; take-overs; lapsed holds and dead waiters; renewal, inspection,
//! force unlock, leaving and the heartbeat; the hash's ttl. Semaphores, the read side with a
//! bound (the permit count `n`, `rw_acquire.lua`'s `ARGV[13]`): waves that stop at the bound,
//! permits passed on past gone clients and by a waiter that leaves, refused counts, the bound
//! of a busy attempt, FIFO past a free permit.

use std::thread::sleep;
use std::time::Duration;

use crate::lua::*;
use crate::support::*;

const READ: Side = Side::Read;
const WRITE: Side = Side::Write;

/// What a write take of `owner`'s call `op` writes on a lock with no other hold: the hold
/// (granted to no waiter), its end, no read hold, nobody queued; the freed-by chain as it was
/// (none here: a test sets it with `..`).
fn write_held(owner: &str, token: i64, lease: i64, op: &str, ends: i64) -> RwHash {
    RwHash {
        o: v(owner),
        c: v(1),
        f: v(token),
        l: v(lease),
        r: v(op),
        x: None,
        q: v(""),
        g: v(""),
        e: v(ends),
        s: v(""),
        n: None,
    }
}

/// The write hold a release (or a leave, a force unlock, an acquisition that found the holds
/// lapsed) granted to `waiter` of `owner` for its grant ms, the freed-by chain `x`.
fn write_granted(owner: &str, token: i64, grant: i64, waiter: &str, ends: i64, x: &str) -> RwHash {
    RwHash {
        x: v(x),
        g: v(waiter),
        ..write_held(owner, token, grant, waiter, ends)
    }
}

/// `hash` without a write hold, as a release, a lapse or a grant to readers leaves it: `o` and
/// `g` empty, count 0, no end (the token `f`, `l` and `r` of the last write hold stay).
fn no_writer(hash: RwHash) -> RwHash {
    RwHash {
        o: v(""),
        c: v(0),
        g: v(""),
        e: v(""),
        ..hash
    }
}

/// The lines of `lines`, one after the other (a field `s` or `q`).
fn lines<S: AsRef<str>>(lines: &[S]) -> Option<String> {
    Some(lines.iter().map(AsRef::as_ref).collect())
}

/// Read takes: the first one of a lock with no hash draws the shard's token from the fence key
/// and stores it as `f` (the hash is then only `f`, `q` and `s`); a retried take is answered;
/// re-entries count up and keep the hold's token (a longer lease moves the line's end, a
/// shorter one does not); another owner's read hold shares the lock but draws a token of its
/// own, max(f + 1, clock), which becomes `f`. Releases count down; the last one leaves a
/// tombstone (`f` and the freed-by chain kept, no hold) for the retry window, and a read take
/// from it draws its token from `f` without reading the fence key.
#[test]
fn read_holds_share_the_lock_each_with_a_token_of_its_own() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");

    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("d", "d-read"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let t = taken[1];
    assert_drawn(t, 0, clock, "the shard's first token, drawn by a read take");
    assert_eq!(fence_value(&server, FENCE), (t as u64, LAYOUT.to_owned()));
    let fence = snapshot(&server, FENCE);
    let d_read = RwHash {
        f: v(t),
        q: v(""),
        s: lines(&[rw.reader("d", 1, t, LEASE, "d-read", "-")]),
        ..RwHash::default()
    };
    rw.assert_hash(&d_read, "d's read take");
    rw.assert_lasts_as_its_holds("d's read take");

    // A retried take (same op id) is answered, not applied again.
    assert_eq!(rw.acquire(Bid::read("d", "d-read")), vec![1, t, 1]);
    rw.assert_hash(&d_read, "a retried read take");

    // Re-entries: a longer lease moves the end (a retried re-entry is answered); a shorter one
    // leaves it.
    let again = Bid::read("d", "d-again").lease(2 * LEASE);
    assert_eq!(rw.acquire(again), vec![1, t, 2]);
    assert_eq!(rw.acquire(again), vec![1, t, 2]);
    let d_twice = RwHash {
        s: lines(&[rw.reader("d", 2, t, 2 * LEASE, "d-again", "-")]),
        ..d_read.clone()
    };
    rw.assert_hash(&d_twice, "d's longer re-entry");
    rw.assert_lasts_as_its_holds("d's longer re-entry");
    assert_eq!(
        rw.acquire(Bid::read("d", "d-third").lease(1_000)),
        vec![1, t, 3]
    );
    let d_line = rw.reader("d", 3, t, 2 * LEASE, "d-third", "-");
    rw.assert_hash(
        &RwHash {
            s: lines(&[&d_line]),
            ..d_read.clone()
        },
        "d's shorter re-entry",
    );
    rw.assert_lasts_as_its_holds("d's shorter re-entry");

    // Another owner's read hold: a token of its own, above d's (the new f), a line of its own.
    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("e", "e-read"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let te = taken[1];
    assert_drawn(te, t, clock, "e's read take");
    let e_line = rw.reader("e", 1, te, LEASE, "e-read", "-");
    let d_read = RwHash { f: v(te), ..d_read };
    rw.assert_hash(
        &RwHash {
            s: lines(&[d_line.clone(), e_line]),
            ..d_read.clone()
        },
        "e shares the lock",
    );
    rw.assert_lasts_as_its_holds("e shares the lock: d's end is the latest");
    let inspected = rw.inspect();
    assert_eq!(inspected[..4], [0, 0, 0, 2], "{inspected:?}");
    rw.span().assert_contains(
        rw.read_end("d", 2 * LEASE) - inspected[4],
        "inspect: the time left until d's end",
    );

    // e's release: d's line is left, and the hash has no write hold (its fields written empty).
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    let d_left = no_writer(RwHash {
        x: v("e-release"),
        s: lines(&[d_line]),
        ..d_read.clone()
    });
    rw.assert_hash(&d_left, "e's release");
    rw.assert_lasts_as_its_holds("e's release");
    // d's releases: one level (the line's op is the release's), then every level.
    assert_eq!(rw.release(READ, "d", t, "d-release-1"), vec![1, 2]);
    rw.assert_hash(
        &RwHash {
            s: lines(&[rw.reader("d", 2, t, 2 * LEASE, "d-release-1", "-")]),
            ..d_left.clone()
        },
        "d counted down",
    );
    assert_eq!(rw.release_all(READ, "d", t, "d-release-all"), vec![1, 0]);
    let tombstone = RwHash {
        x: v("d-release-all,e-release"),
        s: v(""),
        ..d_left
    };
    rw.assert_hash(&tombstone, "freed: a tombstone");
    rw.assert_lasts_the_window("freed: a tombstone");

    // A read take from the tombstone draws from f.
    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("g", "g-read"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let tg = taken[1];
    assert_drawn(tg, te, clock, "g's read take from the tombstone");
    rw.assert_hash(
        &RwHash {
            f: v(tg),
            s: lines(&[rw.reader("g", 1, tg, LEASE, "g-read", "-")]),
            ..tombstone
        },
        "g's read take from the tombstone",
    );
    rw.assert_lasts_as_its_holds("g's read take from the tombstone");
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    rw.assert_no_stray_keys();
}

/// Tokens: a write take draws max(f + 1, clock) and stores it as `f`; a write re-entry keeps
/// it (a longer lease moves `e`); the writer's own read hold (a downgrade) carries the write's
/// token (`f` unchanged) and outlives the write hold's release; a later reader draws a token of
/// its own above it. An owner holding a read hold asking for the write hold is refused at once
/// (`{-2}`, no queue line, nothing changed). A caller behind the holds is given the latest end
/// of the holds in its way and the lock's `f`. The tokens of the holds strictly increase, read
/// and write alike (but a downgrade's, which is its write hold's).
#[test]
fn tokens_rise_across_read_and_write_holds_and_a_downgrade_carries_the_write_token() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let t0 = rw.acquire(Bid::read("d", "d-read"))[1];
    assert_eq!(rw.release(READ, "d", t0, "d-release"), vec![1, 0]);
    let fence = snapshot(&server, FENCE);

    let clock = rw.clock();
    let taken = rw.acquire(Bid::write("a", "a-write"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let ta = taken[1];
    assert_drawn(ta, t0, clock, "a's write take");
    let a_writes = RwHash {
        x: v("d-release"),
        ..write_held("a", ta, LEASE, "a-write", rw.write_end(LEASE))
    };
    rw.assert_hash(&a_writes, "a's write take");
    rw.assert_lasts_as_its_holds("a's write take");
    assert_eq!(rw.acquire(Bid::write("a", "a-write")), vec![1, ta, 1]);
    rw.assert_hash(&a_writes, "a retried write take");

    // A re-entry with a longer lease moves the end.
    assert_eq!(
        rw.acquire(Bid::write("a", "a-again").lease(2 * LEASE)),
        vec![1, ta, 2]
    );
    let a_writes = RwHash {
        c: v(2),
        r: v("a-again"),
        e: v(rw.write_end(2 * LEASE)),
        ..a_writes
    };
    rw.assert_hash(&a_writes, "a's write re-entry");
    rw.assert_lasts_as_its_holds("a's write re-entry");

    // The downgrade: a's read hold, with the write's token.
    assert_eq!(rw.acquire(Bid::read("a", "a-read")), vec![1, ta, 1]);
    let a_both = RwHash {
        s: lines(&[rw.reader("a", 1, ta, LEASE, "a-read", "-")]),
        ..a_writes
    };
    rw.assert_hash(&a_both, "a's downgrade");
    rw.assert_lasts_as_its_holds("a's downgrade: the write end is the latest");
    // Holding a read hold, a asks for the write hold: refused, waiting or not.
    let before = rw.dump(&[]);
    for bid in [
        Bid::write("a", "a-more"),
        Bid::write("a", "a-wait").waiting("wa"),
    ] {
        assert_eq!(rw.acquire(bid), vec![-2], "{bid:?}");
    }
    assert_eq!(rw.dump(&[]), before, "a refused upgrade changed a key");
    // Another reader: busy until the latest end, a's write hold's; the mark is a's token.
    let busy = rw.acquire(Bid::read("b", "b-try"));
    rw.assert_busy(&busy, rw.write_end(2 * LEASE), "b behind a's write");
    assert_eq!(busy[2], ta, "b's mark");

    // a's write release (every level): its read hold stays, the write fields go.
    assert_eq!(rw.release_all(WRITE, "a", ta, "a-release"), vec![1, 0]);
    let a_reads = no_writer(RwHash {
        x: v("a-release,d-release"),
        ..a_both
    });
    rw.assert_hash(&a_reads, "a's write released, its read hold left");
    rw.assert_lasts_as_its_holds("a's write released: its read end");

    // b's read hold: a token of its own, above the write's (the new f).
    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("b", "b-read"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let tb = taken[1];
    assert_drawn(tb, ta, clock, "b's read take");
    rw.assert_hash(
        &RwHash {
            f: v(tb),
            s: lines(&[
                rw.reader("a", 1, ta, LEASE, "a-read", "-"),
                rw.reader("b", 1, tb, LEASE, "b-read", "-"),
            ]),
            ..a_reads
        },
        "b reads beside a",
    );
    assert_eq!(rw.acquire(Bid::write("a", "a-upgrade")), vec![-2]);
    let busy = rw.acquire(Bid::write("c", "c-try"));
    let latest = rw.latest_end().expect("read holds");
    assert_eq!(latest, rw.read_end("b", LEASE), "b's end is the latest");
    rw.assert_busy(&busy, latest, "c behind a's and b's read holds");
    assert_eq!(busy[2], tb, "c's mark");
    // Each read hold is released under its own token.
    assert_eq!(rw.release(READ, "a", tb, "a-wrong"), vec![-1, 0]);
    assert_eq!(rw.release(READ, "b", ta, "b-wrong"), vec![-1, 0]);
    assert_eq!(rw.release(READ, "a", ta, "a-read-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "b", tb, "b-read-release"), vec![1, 0]);

    // The next write token: exactly f + 1 when f runs ahead of the clock.
    let ahead = rw.push_ahead();
    assert_eq!(
        rw.acquire(Bid::write("c", "c-write")),
        vec![1, ahead + 1, 1]
    );
    // The holds' tokens: d's read, a's write (and its downgrade), b's read, c's write.
    let tokens = [t0, ta, tb, ahead + 1];
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens did not rise: {tokens:?}"
    );
    assert_eq!(snapshot(&server, FENCE), fence, "the fence key changed");
    rw.assert_no_stray_keys();
}

/// A writer that live read holds keep out: its try is busy and queues nothing; its waiting
/// attempt queues one line (waiter id, inbox tag, owner, lease, grant ms = min(lease, waiter
/// lease), and the time it is known alive until: one waiter lease ahead), and its next attempts
/// add none. The busy reply is `{0, bound, mark}`: the bound counting down to the latest end of
/// the holds in its way, the mark the lock's latest token `f`. Once a writer waits, new readers
/// queue behind it (they would starve it otherwise); a reader that holds a read hold already
/// re-enters all the same.
#[test]
fn a_writer_waits_behind_readers_and_new_readers_queue_behind_it() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let te = rw.acquire(Bid::read("e", "e-read").lease(2 * LEASE))[1];
    assert!(te > t, "e's token {te} not above d's {t}");
    let e_line = rw.reader("e", 1, te, 2 * LEASE, "e-read", "-");
    let readers = RwHash {
        f: v(te),
        q: v(""),
        s: lines(&[rw.reader("d", 1, t, LEASE, "d-read", "-"), e_line.clone()]),
        ..RwHash::default()
    };
    rw.assert_hash(&readers, "d and e read");
    let e_end = rw.read_end("e", 2 * LEASE);

    let busy = rw.acquire(Bid::write("a", "a-try"));
    rw.assert_busy(&busy, e_end, "a's try");
    assert_eq!(busy[2], te, "a's mark: e's token, the latest");
    rw.assert_hash(&readers, "a try queued");

    let wa = Bid::write("a", "a-wait").waiting("wa");
    rw.assert_busy(&rw.acquire(wa), e_end, "a waits");
    let a_queued = RwHash {
        q: lines(&[rw.queued(wa)]),
        ..readers.clone()
    };
    rw.assert_hash(&a_queued, "a queued");
    rw.assert_lasts_as_its_holds("a queued");
    let again = Bid {
        op: "a-wait-2",
        ..wa
    };
    rw.assert_busy(&rw.acquire(again), e_end, "a's next attempt");
    rw.assert_hash(&a_queued, "a's next attempt");

    // Readers now queue behind a; a reader's try is busy and queues nothing.
    rw.assert_busy(&rw.acquire(Bid::read("b", "b-try")), e_end, "b's read try");
    rw.assert_hash(&a_queued, "a read try queued");
    let rb = Bid::read("b", "b-wait").waiting("rb").lease(2_000);
    rw.assert_busy(&rw.acquire(rb), e_end, "b waits behind a");
    // Another writer queues behind b: a waiter lease above its lease, grant ms = its lease.
    let wc = Bid::write("c", "c-wait").waiting("wc").waiter_lease(60_000);
    rw.assert_busy(&rw.acquire(wc), e_end, "c waits behind b");
    let queue = lines(&[rw.queued(wa), rw.queued(rb), rw.queued(wc)]);
    rw.assert_hash(
        &RwHash {
            q: queue.clone(),
            ..readers.clone()
        },
        "a, b and c queued",
    );

    // d holds a read hold: it re-enters (its line goes last, with its new end).
    assert_eq!(rw.acquire(Bid::read("d", "d-again")), vec![1, t, 2]);
    rw.assert_hash(
        &RwHash {
            q: queue,
            s: lines(&[e_line, rw.reader("d", 2, t, LEASE, "d-again", "-")]),
            ..readers
        },
        "d re-entered past the queue",
    );
    rw.assert_lasts_as_its_holds("d re-entered");
    assert!(
        server.keys(&format!("{EVENTS}:to:*")).is_empty(),
        "an inbox was created or sent to"
    );
    rw.assert_no_stray_keys();
}

/// The last read hold's release grants the lock to the writer at the head of the queue: the
/// hash written in its name (its owner, count 1, a new token, its grant ms as `l` and as the
/// lease of its end, `r` and `g` its waiter id), the freed-by chain, the rest of the queue left,
/// and the event `0|grant|<waiter>,<token>,<grant ms>,<queued>|rw:x` in its client's inbox
/// alone. Its attempts (the first re-sent, or a next one) are answered `{1, token, count,
/// remaining}` without a change; other callers are busy until the grant's end. A release that
/// leaves read holds grants nothing.
#[test]
fn the_last_readers_release_grants_the_lock_to_the_queued_writer() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["a", "b", "c"]);
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let te = rw.acquire(Bid::read("e", "e-read"))[1];
    assert!(te > t, "e's token {te} not above d's {t}");
    let wa = Bid::write("a", "a-wait").waiting("wa");
    let rb = Bid::read("b", "b-wait").waiting("rb");
    let wc = Bid::write("c", "c-wait").waiting("wc").lease(2_000);
    for bid in [wa, rb, wc] {
        let busy = rw.acquire(bid);
        rw.assert_busy(&busy, rw.latest_end().unwrap(), bid.waiter);
    }
    let queue = [rw.queued(wa), rw.queued(rb), rw.queued(wc)];

    // d's release: e still reads, nobody is granted anything.
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(te),
            x: v("d-release"),
            q: lines(&queue),
            s: lines(&[rw.reader("e", 1, te, LEASE, "e-read", "-")]),
            ..RwHash::default()
        }),
        "d's release, e left",
    );
    assert!(rw.inbox_events("a").is_empty(), "a was sent to");

    // e's release grants the lock to wa.
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    let ta = rw.token();
    assert_drawn(ta, te, clock, "wa's grant");
    let a_end = rw.write_end(WAITER_LEASE);
    let a_granted = RwHash {
        q: lines(&queue[1..]),
        ..write_granted("a", ta, WAITER_LEASE, "wa", a_end, "e-release,d-release")
    };
    rw.assert_hash(&a_granted, "wa's grant");
    rw.assert_lasts_as_its_holds("wa's grant");
    assert_eq!(rw.inbox_events("a"), [rw_grant("wa", ta, WAITER_LEASE, 2)]);
    for client in ["b", "c"] {
        assert!(rw.inbox_events(client).is_empty(), "{client} was sent to");
    }

    // a's attempts are answered with the grant; nothing changes.
    let before = rw.dump(&[&inbox("a")]);
    for op in ["a-wait", "a-wait-2"] {
        let answered = rw.acquire(Bid { op, ..wa });
        rw.assert_granted_already(&answered, ta, 1, a_end, op);
    }
    assert_eq!(
        rw.dump(&[&inbox("a")]),
        before,
        "a granted-already answer wrote"
    );
    rw.assert_busy(
        &rw.acquire(Bid::read("z", "z-try")),
        a_end,
        "a reader behind the grant",
    );
    assert_eq!(rw.inspect()[..4], [1, 1, ta, 0]);
    rw.assert_no_stray_keys();
}

/// A write release that frees the lock grants a read hold to every reader at the head of the
/// queue up to the first writer (a wave): each reader's line in `s` (count 1, a token of its
/// own: the first max(f + 1, clock), each next one above the last, which becomes `f`; its own
/// grant ms; its waiter id as op and as waiter column), the write fields emptied, the queue
/// left from that writer on; one `0|grants|<queued>,<waiter>:<ms>:<token>,...|rw:x` event per
/// client listing that client's readers in queue order. Every granted token is above the marks
/// of the busy replies before the grant. The readers' attempts are answered; a new reader
/// queues behind the writer; the last reader's release grants the writer.
#[test]
fn a_write_release_grants_the_readers_up_to_the_next_writer_one_event_per_client() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["p", "c", "w", "n"]);
    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    let a_end = rw.write_end(LEASE);
    // p1 and p2 are two owners of client p.
    let rp1 = Bid::read("p1", "p1-wait").client("p").waiting("rp1");
    let rc = Bid::read("c", "c-wait").waiting("rc").waiter_lease(2_000);
    let rp2 = Bid::read("p2", "p2-wait")
        .client("p")
        .waiting("rp2")
        .lease(1_500);
    let ww = Bid::write("w", "w-wait").waiting("ww");
    let rz = Bid::read("z", "z-wait").waiting("rz");
    let mut marks = Vec::new();
    for bid in [rp1, rc, rp2, ww, rz] {
        let busy = rw.acquire(bid);
        rw.assert_busy(&busy, a_end, bid.waiter);
        marks.push(busy[2]);
    }
    let tail = [rw.queued(ww), rw.queued(rz)];

    assert!(marks.iter().all(|&mark| mark == t), "marks {marks:?}");
    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "a", t, "a-release"), vec![1, 0]);
    // The wave's tokens, in queue order: p1's drawn from f and the clock, then one each.
    let t1 = rw.read_token("p1");
    assert_drawn(t1, t, clock, "p1's grant");
    let (tc, t2) = (t1 + 1, t1 + 2);
    for token in [t1, tc, t2] {
        assert!(
            marks.iter().all(|&mark| mark < token),
            "a granted token {token} not above the marks {marks:?}"
        );
    }
    let wave = no_writer(RwHash {
        f: v(t2),
        l: v(LEASE),
        r: v("a-write"),
        x: v("a-release"),
        q: lines(&tail),
        s: lines(&[
            rw.reader("p1", 1, t1, WAITER_LEASE, "rp1", "rp1"),
            rw.reader("c", 1, tc, 2_000, "rc", "rc"),
            rw.reader("p2", 1, t2, 1_500, "rp2", "rp2"),
        ]),
        ..RwHash::default()
    });
    rw.assert_hash(&wave, "the wave of p1, c and p2");
    rw.assert_lasts_as_its_holds("the wave: p1's end is the latest");
    assert_eq!(
        rw.inbox_events("p"),
        [rw_grants(
            rw_queued(&tail),
            &[("rp1", WAITER_LEASE, t1), ("rp2", 1_500, t2)]
        )]
    );
    assert_eq!(
        rw.inbox_events("c"),
        [rw_grants(rw_queued(&tail), &[("rc", 2_000, tc)])]
    );
    assert!(rw.inbox_events("w").is_empty(), "w was sent to");
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 3]);

    // The readers' attempts (re-sent or next) are answered with their grants.
    let before = rw.dump(&[]);
    for (bid, grant, token) in [
        (rp1, WAITER_LEASE, t1),
        (rc, 2_000, tc),
        (
            Bid {
                op: "p2-wait-2",
                ..rp2
            },
            1_500,
            t2,
        ),
    ] {
        let answered = rw.acquire(bid);
        let until = rw.read_end(bid.owner, grant);
        rw.assert_granted_already(&answered, token, 1, until, bid.waiter);
    }
    assert_eq!(rw.dump(&[]), before, "a granted-already answer wrote");

    // A new reader queues behind ww.
    let rn = Bid::read("n", "n-wait").waiting("rn");
    let latest = rw.latest_end().unwrap();
    let busy = rw.acquire(rn);
    rw.assert_busy(&busy, latest, "n behind ww");
    assert_eq!(busy[2], t2, "n's mark: the wave's last token");
    let tail = [tail[0].clone(), tail[1].clone(), rw.queued(rn)];
    rw.assert_hash(
        &RwHash {
            q: lines(&tail),
            ..wave
        },
        "n queued",
    );

    // The readers' releases: the last one grants the lock to ww.
    for (owner, token) in [("p1", t1), ("c", tc)] {
        assert_eq!(
            rw.release(READ, owner, token, &format!("{owner}-release")),
            vec![1, 0]
        );
        assert!(rw.inbox_events("w").is_empty(), "w was sent to early");
    }
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "p2", t2, "p2-release"), vec![1, 0]);
    let tw = rw.token();
    assert_drawn(tw, t2, clock, "ww's grant");
    rw.assert_hash(
        &RwHash {
            q: lines(&tail[1..]),
            ..write_granted(
                "w",
                tw,
                WAITER_LEASE,
                "ww",
                rw.write_end(WAITER_LEASE),
                "p2-release,c-release,p1-release,a-release",
            )
        },
        "ww's grant",
    );
    assert_eq!(
        rw.inbox_events("w"),
        [rw_grant("ww", tw, WAITER_LEASE, rw_queued(&tail[1..]))]
    );
    assert!(rw.inbox_events("n").is_empty(), "n was sent to");
    rw.assert_no_stray_keys();
}

/// A reader whose owner holds a read hold already (granted in the same wave, or its own) is
/// not granted a second one (nor does it draw a token): its line goes and it is woken by name
/// (`0|name|<waiter>|rw:x`, after the wave's event to its client); its next attempt re-enters
/// the owner's hold, with that hold's token. Also when the releasing writer itself holds that
/// read hold (its downgrade, with the write hold's token).
#[test]
fn a_reader_of_an_owner_that_holds_a_read_hold_is_woken_not_granted() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "k"]);
    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    let rb1 = Bid::read("b", "b-wait-1").waiting("rb1");
    let rb2 = Bid::read("b", "b-wait-2").waiting("rb2");
    let rc = Bid::read("c", "c-wait").waiting("rc");
    for bid in [rb1, rb2, rc] {
        rw.assert_busy(&rw.acquire(bid), rw.write_end(LEASE), bid.waiter);
    }

    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "a", t, "a-release"), vec![1, 0]);
    // rb1 and rc draw a token each (rb2 none): rc's is the next after rb1's.
    let tb = rw.read_token("b");
    assert_drawn(tb, t, clock, "rb1's grant");
    let tc = tb + 1;
    let c_line = rw.reader("c", 1, tc, WAITER_LEASE, "rc", "rc");
    let wave = no_writer(RwHash {
        f: v(tc),
        l: v(LEASE),
        r: v("a-write"),
        x: v("a-release"),
        q: v(""),
        s: lines(&[
            rw.reader("b", 1, tb, WAITER_LEASE, "rb1", "rb1"),
            c_line.clone(),
        ]),
        ..RwHash::default()
    });
    rw.assert_hash(&wave, "rb1 and rc granted, rb2 woken");
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grants(0, &[("rb1", WAITER_LEASE, tb)]), rw_wake("rb2")]
    );
    assert_eq!(
        rw.inbox_events("c"),
        [rw_grants(0, &[("rc", WAITER_LEASE, tc)])]
    );
    // rb2 re-enters b's read hold (granted to rb1: its token and waiter column stay).
    let again = Bid {
        op: "b-wait-2-again",
        ..rb2
    };
    assert_eq!(rw.acquire(again), vec![1, tb, 2]);
    rw.assert_hash(
        &RwHash {
            s: lines(&[
                c_line,
                rw.reader("b", 2, tb, LEASE, "b-wait-2-again", "rb1"),
            ]),
            ..wave
        },
        "rb2 re-entered",
    );
    assert_eq!(rw.release_all(READ, "b", tb, "b-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "c", tc, "c-release"), vec![1, 0]);

    // k waits for the write hold and, from another task, for a read hold behind it.
    let th = rw.acquire(Bid::write("h", "h-write"))[1];
    assert!(th > tc, "h's token {th} not above rc's {tc}");
    let wk = Bid::write("k", "k-wait").waiting("wk");
    let rk = Bid::read("k", "k-read-wait").waiting("rk");
    for bid in [wk, rk] {
        rw.assert_busy(&rw.acquire(bid), rw.write_end(LEASE), bid.waiter);
    }
    let rk_line = rw.queued(rk);
    assert_eq!(rw.release(WRITE, "h", th, "h-release"), vec![1, 0]);
    let tk = rw.token();
    assert!(tk > th, "wk's grant: token {tk} after {th}");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rk_line]),
            ..write_granted(
                "k",
                tk,
                WAITER_LEASE,
                "wk",
                rw.write_end(WAITER_LEASE),
                "h-release,c-release,b-release,a-release",
            )
        },
        "wk's grant",
    );
    // k downgrades, then releases its write hold: rk is woken, not granted.
    assert_eq!(rw.acquire(Bid::read("k", "k-read")), vec![1, tk, 1]);
    let k_line = rw.reader("k", 1, tk, LEASE, "k-read", "-");
    assert_eq!(rw.release(WRITE, "k", tk, "k-release"), vec![1, 0]);
    let k_reads = no_writer(RwHash {
        f: v(tk),
        l: v(WAITER_LEASE),
        r: v("wk"),
        x: v("k-release,h-release,c-release,b-release,a-release"),
        q: v(""),
        s: lines(&[k_line]),
        ..RwHash::default()
    });
    rw.assert_hash(&k_reads, "k's write released, rk woken");
    rw.assert_lasts_as_its_holds("k's write released");
    assert_eq!(
        rw.inbox_events("k"),
        [rw_grant("wk", tk, WAITER_LEASE, 1), rw_wake("rk")]
    );
    assert_eq!(
        rw.acquire(Bid {
            op: "k-read-again",
            ..rk
        }),
        vec![1, tk, 2]
    );
    rw.assert_no_stray_keys();
}

/// Grants go only to waiters whose client is there to hear them (Stream mode: its inbox
/// exists). A writer with no inbox is passed over for the next writer (which draws a token
/// above the lock's last). A wave's readers whose client is gone are taken back (their lines
/// dropped, the other readers keep theirs and their tokens; the tokens drawn for the readers
/// taken back stay spent: `f` is the wave's last); a wave whose clients are all gone grants
/// nothing, and the lock goes on to the next in line with a token above theirs.
#[test]
fn grants_pass_over_waiters_whose_client_is_gone() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    // The clients of b, d and g are gone: no inbox.
    rw.open_inboxes(&["c", "e", "h", "i"]);
    let t = rw.acquire(Bid::read("a", "a-read"))[1];
    let wb = Bid::write("b", "b-wait").waiting("wb");
    let wc = Bid::write("c", "c-wait").waiting("wc").lease(2_000);
    for bid in [wb, wc] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("a", LEASE), bid.waiter);
    }
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "a", t, "a-release"), vec![1, 0]);
    let tc = rw.token();
    assert_drawn(tc, t, clock, "wc's grant");
    let c_end = rw.write_end(2_000);
    rw.assert_hash(
        &write_granted("c", tc, 2_000, "wc", c_end, "a-release"),
        "wc's grant, wb passed over",
    );
    rw.assert_lasts_as_its_holds("wc's grant");
    assert_eq!(rw.inbox_events("c"), [rw_grant("wc", tc, 2_000, 0)]);

    // A wave of d, e and g: only e's client is there.
    let rd = Bid::read("d", "d-wait").waiting("rd");
    let re = Bid::read("e", "e-wait").waiting("re").lease(2_000);
    let rg = Bid::read("g", "g-wait").waiting("rg");
    let wh = Bid::write("h", "h-wait").waiting("wh");
    for bid in [rd, re, rg, wh] {
        rw.assert_busy(&rw.acquire(bid), c_end, bid.waiter);
    }
    let wh_line = rw.queued(wh);
    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "c", tc, "c-release"), vec![1, 0]);
    // rd, re and rg drew a token each, in queue order: e keeps the middle one.
    let te = rw.read_token("e");
    assert_drawn(te - 1, tc, clock, "rd's grant");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(te + 1),
            l: v(2_000),
            r: v("wc"),
            x: v("c-release,a-release"),
            q: lines(&[wh_line]),
            s: lines(&[rw.reader("e", 1, te, 2_000, "re", "re")]),
            ..RwHash::default()
        }),
        "the wave taken back but for e",
    );
    assert_eq!(rw.inbox_events("e"), [rw_grants(1, &[("re", 2_000, te)])]);
    for client in ["d", "g"] {
        assert!(
            !exists(&server, &inbox(client)),
            "a gone client's inbox created"
        );
    }

    // d and g queue again behind wh, then i; e's release grants the lock to wh.
    let rd2 = Bid::read("d", "d-wait-2").waiting("rd2");
    let rg2 = Bid::read("g", "g-wait-2").waiting("rg2");
    let wi = Bid::write("i", "i-wait").waiting("wi");
    for bid in [rd2, rg2, wi] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("e", 2_000), bid.waiter);
    }
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    let th = rw.token();
    assert_drawn(th, te + 1, clock, "wh's grant");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued(rd2), rw.queued(rg2), rw.queued(wi)]),
            ..write_granted(
                "h",
                th,
                WAITER_LEASE,
                "wh",
                rw.write_end(WAITER_LEASE),
                "e-release,c-release,a-release",
            )
        },
        "wh's grant",
    );
    // h's release: the wave of d and g finds nobody; the lock goes on to wi.
    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "h", th, "h-release"), vec![1, 0]);
    // rd2 and rg2 drew a token each before they were taken back: wi's is the next.
    let ti = rw.token();
    assert_drawn(ti - 2, th, clock, "rd2's grant, taken back");
    rw.assert_hash(
        &write_granted(
            "i",
            ti,
            WAITER_LEASE,
            "wi",
            rw.write_end(WAITER_LEASE),
            "h-release,e-release,c-release,a-release",
        ),
        "wi's grant past a wave with nobody there",
    );
    rw.assert_lasts_as_its_holds("wi's grant");
    assert_eq!(rw.inbox_events("i"), [rw_grant("wi", ti, WAITER_LEASE, 0)]);
    rw.assert_no_stray_keys();
}

/// A wave's read holds taken back from clients that are gone no longer count for the hash's
/// ttl: it is the latest end of the holds left (here e's, granted for 2 s, while the readers
/// taken back were granted 3 s). `f` is the last token the wave drew (e's, after d's).
#[test]
fn a_wave_taken_back_leaves_the_ttl_of_the_holds_left() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    // d's client is gone.
    rw.open_inboxes(&["e"]);
    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    let rd = Bid::read("d", "d-wait").waiting("rd");
    let re = Bid::read("e", "e-wait").waiting("re").lease(2_000);
    for bid in [rd, re] {
        rw.assert_busy(&rw.acquire(bid), rw.write_end(LEASE), bid.waiter);
    }
    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "a", t, "a-release"), vec![1, 0]);
    let te = rw.read_token("e");
    assert_drawn(te - 1, t, clock, "rd's grant");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(te),
            l: v(LEASE),
            r: v("a-write"),
            x: v("a-release"),
            q: v(""),
            s: lines(&[rw.reader("e", 1, te, 2_000, "re", "re")]),
            ..RwHash::default()
        }),
        "d's read hold taken back",
    );
    rw.assert_lasts_as_its_holds("only e's read hold is left");
}

/// Retries: an acquisition re-sent with the same op id is answered, not applied again; a
/// release re-sent is answered from `r` (a release that left a level) or from the freed-by
/// chain `x` (a final release), whatever happened since: the retry of an owner's final read
/// release must not release that owner's next read hold. A release under another token is
/// refused `{-1, 0}`; one of a hold that is not there is `{0, 0}`. No refusal or retry changes
/// a key.
#[test]
fn retried_calls_are_answered_not_applied_again() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let unchanged = |call: &dyn Fn() -> Vec<i64>, expected: &[i64], what: &str| {
        let before = rw.dump(&[]);
        assert_eq!(call(), expected, "{what}");
        assert_eq!(rw.dump(&[]), before, "{what}: a key changed");
    };

    // The write side.
    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    assert_eq!(rw.acquire(Bid::write("a", "a-again")), vec![1, t, 2]);
    unchanged(
        &|| rw.acquire(Bid::write("a", "a-again")),
        &[1, t, 2],
        "a retried write re-entry",
    );
    assert_eq!(rw.release(WRITE, "a", t, "a-release-1"), vec![1, 1]);
    unchanged(
        &|| rw.release(WRITE, "a", t, "a-release-1"),
        &[1, 1],
        "a retried write release that left a level",
    );
    unchanged(
        &|| rw.release(WRITE, "a", t - 1, "a-stale"),
        &[-1, 0],
        "a write release under an older token",
    );
    unchanged(
        &|| rw.release(WRITE, "b", t, "b-release"),
        &[-1, 0],
        "another owner's write release",
    );
    unchanged(
        &|| rw.release(READ, "a", t, "a-read-release"),
        &[0, 0],
        "a read release of a writer",
    );
    assert_eq!(rw.release(WRITE, "a", t, "a-release-2"), vec![1, 0]);
    let freed = no_writer(RwHash {
        f: v(t),
        l: v(LEASE),
        r: v("a-release-1"),
        x: v("a-release-2"),
        q: v(""),
        s: v(""),
        ..RwHash::default()
    });
    rw.assert_hash(&freed, "a's write released");
    unchanged(
        &|| rw.release(WRITE, "a", t, "a-release-2"),
        &[1, 0],
        "a retried final write release",
    );
    unchanged(
        &|| rw.release(WRITE, "a", t, "a-release-3"),
        &[0, 0],
        "a write release of a free lock",
    );
    // A newer write hold of a: the retry still changes nothing; the old token is refused.
    let t2 = rw.acquire(Bid::write("a", "a-write-2"))[1];
    assert!(t2 > t, "a's second write token {t2} after {t}");
    unchanged(
        &|| rw.release(WRITE, "a", t, "a-release-2"),
        &[1, 0],
        "a retried final write release, a newer hold since",
    );
    unchanged(
        &|| rw.release(WRITE, "a", t, "a-release-4"),
        &[-1, 0],
        "a release of the older write hold",
    );
    assert_eq!(rw.inspect()[..3], [1, 1, t2]);
    assert_eq!(rw.release(WRITE, "a", t2, "a-release-5"), vec![1, 0]);

    // The read side: d's read hold draws a token of its own, above t2.
    let td = rw.acquire(Bid::read("d", "d-read"))[1];
    assert!(td > t2, "d's read token {td} not above {t2}");
    unchanged(
        &|| rw.acquire(Bid::read("d", "d-read")),
        &[1, td, 1],
        "a retried read take",
    );
    assert_eq!(rw.acquire(Bid::read("d", "d-again")), vec![1, td, 2]);
    assert_eq!(rw.release(READ, "d", td, "d-release-1"), vec![1, 1]);
    unchanged(
        &|| rw.release(READ, "d", td, "d-release-1"),
        &[1, 1],
        "a retried read release that left a level",
    );
    unchanged(
        &|| rw.release(READ, "d", td - 1, "d-stale"),
        &[-1, 0],
        "a read release under another token",
    );
    unchanged(
        &|| rw.release(READ, "e", td, "e-release"),
        &[0, 0],
        "a read release of an owner that holds none",
    );
    assert_eq!(rw.release(READ, "d", td, "d-release-2"), vec![1, 0]);
    // d reads again: a new token.
    let td2 = rw.acquire(Bid::read("d", "d-read-2"))[1];
    assert!(td2 > td, "d's second read token {td2} not above {td}");
    let d_reads = RwHash {
        s: lines(&[rw.reader("d", 1, td2, LEASE, "d-read-2", "-")]),
        f: v(td2),
        x: v("d-release-2,a-release-5,a-release-2"),
        r: v("a-write-2"),
        ..freed
    };
    rw.assert_hash(&d_reads, "d's second read hold");
    unchanged(
        &|| rw.release(READ, "d", td, "d-release-2"),
        &[1, 0],
        "a retried final read release, a new read hold of d since",
    );
    rw.assert_hash(&d_reads, "the retry left d's new read hold");
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 1]);
    rw.assert_no_stray_keys();
}

/// The write side barges within a client (`src/engine/cohort.rs`): a write release that names
/// a writer of its own client that waits, queued or not, hands it the lock (the writer's line
/// leaves the queue) while no other queued waiter has waited the limit, and names nobody else;
/// once the head of the queue has, the release grants the lock there. A floor (the last token
/// the client handed out within its process) puts the next token above it.
#[test]
fn a_write_release_hands_the_lock_to_a_local_writer_until_a_waiter_is_due() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["a2", "a3", "b"]);
    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    let a_end = rw.write_end(LEASE);
    let rb = Bid::read("b", "b-wait").waiting("rb");
    rw.assert_busy(&rw.acquire(rb), a_end, "b waits");
    let wa2 = Bid::write("a2", "a2-wait").waiting("wa2");
    rw.assert_busy(&rw.acquire(wa2), a_end, "a2 waits");
    let b_line = rw.queued(rb);
    let inboxes = ["a2", "a3", "b"].map(inbox);
    let inboxes: Vec<&str> = inboxes.iter().map(String::as_str).collect();

    // rb has waited less than a minute: a's release hands the lock to wa2, above the floor.
    let floor = t + 10_000_000_000;
    let heir = Heir {
        owner: "a2",
        waiter: "wa2",
        limit: 60_000,
        asks: false,
    };
    let reply = rw.release_named(WRITE, "a", t, "a-release", false, Some(heir), Some(floor));
    assert_eq!(ints(reply), vec![1, 0, floor + 1, 1]);
    let a2_holds = RwHash {
        q: lines(&[&b_line]),
        ..write_granted(
            "a2",
            floor + 1,
            SUCCESSOR_LEASE,
            "wa2",
            rw.write_end(SUCCESSOR_LEASE),
            "a-release",
        )
    };
    rw.assert_hash(&a2_holds, "wa2 handed the lock, rb still queued");
    for client in ["a2", "b"] {
        assert!(rw.inbox_events(client).is_empty(), "{client} was sent to");
    }
    let before = rw.dump(&inboxes);
    let again = rw.release_named(WRITE, "a", t, "a-release", false, Some(heir), Some(floor));
    assert_eq!(ints(again), vec![1, 0, floor + 1, 1], "the re-sent release");
    assert_eq!(rw.dump(&inboxes), before, "a re-sent release changed a key");

    // Once rb has waited 1 ms, a2's release grants it its read hold instead of handing the
    // lock to a3, which asks by the call and queues behind it.
    sleep(Duration::from_millis(5));
    let heir = Heir {
        owner: "a3",
        waiter: "wa3",
        limit: 1,
        asks: true,
    };
    let reply = rw.release_named(
        WRITE,
        "a2",
        floor + 1,
        "a2-release",
        false,
        Some(heir),
        None,
    );
    let b_end = rw.read_end("b", WAITER_LEASE);
    rw.assert_joined(&ints(reply), b_end, "a3 joined the queue behind rb's grant");
    let tb = rw.read_token("b");
    assert_eq!(tb, floor + 2, "rb's token: above the floor's");
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grants(1, &[("rb", WAITER_LEASE, tb)])]
    );
}

/// A write release naming a successor (a take-over, `ARGV[10..15]`): with nobody queued and no
/// read hold the successor is handed the lock (`{1, 0, token, 0}`: the hash in its name, its
/// lease, its waiter id as `r` and `g`; no event). With waiters queued the lock goes to the queue
/// (a writer's grant, or a wave of readers) and the successor's line joins the tail (its grant
/// ms min(its lease, its waiter lease)): `{2, bound, mark}` as a busy acquisition, the mark the
/// lock's `f` after the grant the call made (the granted token), below the token of the
/// successor's own grant later. A re-sent release gets the same answer and changes nothing.
#[test]
fn a_take_over_hands_the_lock_over_or_joins_the_queue() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "s", "u", "r", "v"]);
    rw.acquire(Bid::write("a", "a-write"));
    let t = rw.push_ahead();
    let inboxes = ["b", "s", "u", "r", "v"].map(inbox);
    let inboxes: Vec<&str> = inboxes.iter().map(String::as_str).collect();

    assert_eq!(
        rw.take_over("a", t, "a-release", ("s", "ws")),
        vec![1, 0, t + 1, 0]
    );
    let s_holds = write_granted(
        "s",
        t + 1,
        SUCCESSOR_LEASE,
        "ws",
        rw.write_end(SUCCESSOR_LEASE),
        "a-release",
    );
    rw.assert_hash(&s_holds, "s took the lock over");
    rw.assert_lasts_as_its_holds("s took the lock over");
    let before = rw.dump(&inboxes);
    assert_eq!(
        rw.take_over("a", t, "a-release", ("s", "ws")),
        vec![1, 0, t + 1, 0]
    );
    assert_eq!(
        rw.dump(&inboxes),
        before,
        "a re-sent take-over changed a key"
    );

    // b waits; s's release, taken over by u: b is granted the lock, u queues behind it.
    let wb = Bid::write("b", "b-wait").waiting("wb");
    rw.assert_busy(&rw.acquire(wb), rw.write_end(SUCCESSOR_LEASE), "b waits");
    let reply = rw.take_over("s", t + 1, "s-release", ("u", "wu"));
    let b_end = rw.write_end(WAITER_LEASE);
    rw.assert_joined(&reply, b_end, "u joined the queue behind wb's grant");
    assert_eq!(reply[2], t + 2, "u's mark: wb's token");
    let wu = Bid::write("u", "").waiting("wu").lease(SUCCESSOR_LEASE);
    let b_granted = RwHash {
        q: lines(&[rw.queued(wu)]),
        ..write_granted("b", t + 2, WAITER_LEASE, "wb", b_end, "s-release,a-release")
    };
    rw.assert_hash(&b_granted, "wb granted, wu queued behind");
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grant("wb", t + 2, WAITER_LEASE, 1)]
    );
    assert!(rw.inbox_events("u").is_empty(), "u was sent to");
    let before = rw.dump(&inboxes);
    let again = rw.take_over("s", t + 1, "s-release", ("u", "wu"));
    rw.assert_joined(&again, b_end, "the re-sent take-over");
    assert_eq!(again[2], reply[2], "the re-sent take-over's mark");
    assert_eq!(
        rw.dump(&inboxes),
        before,
        "a re-sent take-over changed a key"
    );

    // b's release grants the lock to wu.
    assert_eq!(rw.release(WRITE, "b", t + 2, "b-release"), vec![1, 0]);
    rw.assert_hash(
        &write_granted(
            "u",
            t + 3,
            WAITER_LEASE,
            "wu",
            rw.write_end(WAITER_LEASE),
            "b-release,s-release,a-release",
        ),
        "wu's grant",
    );
    assert_eq!(
        rw.inbox_events("u"),
        [rw_grant("wu", t + 3, WAITER_LEASE, 0)]
    );

    // A reader waits; u's release, taken over by v: the reader is granted, v queues behind.
    let rr = Bid::read("r", "r-wait").waiting("rr");
    let busy = rw.acquire(rr);
    rw.assert_busy(&busy, rw.write_end(WAITER_LEASE), "r waits");
    assert_eq!(busy[2], t + 3, "r's mark: wu's token");
    let reply = rw.take_over("u", t + 3, "u-release", ("v", "wv"));
    let r_end = rw.read_end("r", WAITER_LEASE);
    rw.assert_joined(&reply, r_end, "v joined the queue behind rr's grant");
    assert_eq!(reply[2], t + 4, "v's mark: rr's token");
    let wv = Bid::write("v", "").waiting("wv").lease(SUCCESSOR_LEASE);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(t + 4),
            l: v(WAITER_LEASE),
            r: v("wu"),
            x: v("u-release,b-release,s-release,a-release"),
            q: lines(&[rw.queued(wv)]),
            s: lines(&[rw.reader("r", 1, t + 4, WAITER_LEASE, "rr", "rr")]),
            ..RwHash::default()
        }),
        "rr granted, wv queued behind",
    );
    assert_eq!(
        rw.inbox_events("r"),
        [rw_grants(1, &[("rr", WAITER_LEASE, t + 4)])]
    );
    assert!(rw.inbox_events("v").is_empty(), "v was sent to");

    // r's release grants the lock to wv: a token above v's mark.
    assert_eq!(rw.release(READ, "r", t + 4, "r-release"), vec![1, 0]);
    assert_eq!(rw.token(), t + 5, "wv's token");
    assert!(t + 5 > reply[2], "wv's token not above its mark");
    assert_eq!(
        rw.inbox_events("v"),
        [rw_grant("wv", t + 5, WAITER_LEASE, 0)]
    );
    rw.assert_no_stray_keys();
}

/// Holds whose end passed no longer count, though the hash lives on (a writer's own read hold
/// keeps it): a reader takes the lock past a lapsed write hold (the write fields emptied on
/// the way), the lapsed holder's release finds nothing (`{0, 0}`); a lapsed read line is
/// dropped by the next call that writes `s`.
#[test]
fn lapsed_holds_no_longer_count() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let ta = rw.acquire(Bid::write("a", "a-write").lease(100))[1];
    assert_eq!(rw.acquire(Bid::read("a", "a-read")), vec![1, ta, 1]);
    let a_line = rw.reader("a", 1, ta, LEASE, "a-read", "-");
    let a_both = RwHash {
        s: lines(&[&a_line]),
        ..write_held("a", ta, 100, "a-write", rw.write_end(100))
    };
    rw.assert_hash(&a_both, "a writes for 100 ms, reads for longer");
    rw.assert_lasts_as_its_holds("a's read hold keeps the hash");
    sleep(Duration::from_millis(150));
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 1], "a's write hold lapsed");

    // b reads: a's write hold lapsed; b draws a token of its own.
    let tb = rw.acquire(Bid::read("b", "b-read").lease(100))[1];
    assert!(tb > ta, "b's token {tb} not above a's {ta}");
    let b_line = rw.reader("b", 1, tb, 100, "b-read", "-");
    rw.assert_hash(
        &RwHash {
            o: v(""),
            c: v(0),
            f: v(tb),
            e: v(""),
            s: lines(&[a_line.clone(), b_line]),
            ..a_both.clone()
        },
        "b reads past a's lapsed write hold",
    );
    let before = rw.dump(&[]);
    assert_eq!(rw.release(WRITE, "a", ta, "a-release"), vec![0, 0]);
    assert_eq!(
        rw.dump(&[]),
        before,
        "a lapsed hold's release changed a key"
    );

    // b's read line lapses: c's read take drops it.
    sleep(Duration::from_millis(150));
    let tc = rw.acquire(Bid::read("c", "c-read"))[1];
    assert!(tc > tb, "c's token {tc} not above b's {tb}");
    rw.assert_hash(
        &RwHash {
            o: v(""),
            c: v(0),
            f: v(tc),
            e: v(""),
            s: lines(&[a_line, rw.reader("c", 1, tc, LEASE, "c-read", "-")]),
            ..a_both
        },
        "b's lapsed line dropped",
    );
    assert_eq!(rw.release(READ, "b", tb, "b-release"), vec![0, 0]);
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 2]);
    rw.assert_no_stray_keys();
}

/// A lock whose holds lapsed with waiters still queued is granted to them by the next
/// acquisition, whoever makes it, before it looks for itself: a writer at the head is granted
/// the lock and the caller queues behind it, unless the caller is that writer (it then takes
/// the lock itself, a take: `g` empty, its own lease); readers at the head are granted a wave,
/// and a reader of the wave making the call is answered with its grant.
#[test]
fn waiters_queued_behind_lapsed_holds_are_served_by_the_next_acquisition() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "d", "e"]);
    let wb = Bid::write("b", "b-wait").waiting("wb");
    let rc = Bid::read("c", "c-wait").waiting("rc");
    // a writes for 100 ms; b then c queue. The hash outlives a's hold (its expiry is set by
    // another clock than the one the hold's end was read from, as after a failover).
    let queue_behind_a_lapsed_writer = || {
        server.cmd(&["DEL", RW_HOLD]);
        let ta = rw.acquire(Bid::write("a", "a-write").lease(100))[1];
        for bid in [wb, rc] {
            rw.assert_busy(&rw.acquire(bid), rw.write_end(100), bid.waiter);
        }
        server.cmd(&["PEXPIRE", RW_HOLD, "10000"]);
        sleep(Duration::from_millis(150));
        ta
    };

    // e's waiting write attempt grants the lock to wb first, and queues behind it.
    let ta = queue_behind_a_lapsed_writer();
    let rc_line = rw.queued(rc);
    let we = Bid::write("e", "e-wait").waiting("we");
    let clock = rw.clock();
    let busy = rw.acquire(we);
    let tb = rw.token();
    assert_drawn(tb, ta, clock, "wb's grant");
    let b_end = rw.write_end(WAITER_LEASE);
    rw.assert_busy(&busy, b_end, "e behind wb's grant");
    assert_eq!(
        busy[2], tb,
        "e's mark: wb's token, granted by the same call"
    );
    rw.assert_hash(
        &RwHash {
            q: lines(&[rc_line.clone(), rw.queued(we)]),
            ..write_granted("b", tb, WAITER_LEASE, "wb", b_end, "")
        },
        "wb granted by e's attempt",
    );
    assert_eq!(rw.inbox_events("b"), [rw_grant("wb", tb, WAITER_LEASE, 1)]);
    assert!(rw.inbox_events("e").is_empty(), "e was sent to");

    // The same, and wb's own attempt: a take.
    let ta = queue_behind_a_lapsed_writer();
    let rc_line = rw.queued(rc);
    let clock = rw.clock();
    let taken = rw.acquire(Bid {
        op: "b-wait-2",
        ..wb
    });
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    assert_drawn(taken[1], ta, clock, "wb's take");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rc_line]),
            ..write_held("b", taken[1], LEASE, "b-wait-2", rw.write_end(LEASE))
        },
        "wb took the lock itself",
    );
    assert_eq!(rw.inbox_events("b").len(), 1, "b was sent to");

    // Readers at the head behind a lapsed write hold (a's own read hold keeps the hash): the
    // first reader's next attempt grants the wave and is answered with its grant.
    server.cmd(&["DEL", RW_HOLD]);
    let ta = rw.acquire(Bid::write("a", "a-write").lease(100))[1];
    let rd = Bid::read("d", "d-wait").waiting("rd");
    for bid in [rc, rd] {
        rw.assert_busy(&rw.acquire(bid), rw.write_end(100), bid.waiter);
    }
    assert_eq!(rw.acquire(Bid::read("a", "a-read")), vec![1, ta, 1]);
    sleep(Duration::from_millis(150));
    let clock = rw.clock();
    let answered = rw.acquire(Bid {
        op: "c-wait-2",
        ..rc
    });
    let tc = rw.read_token("c");
    assert_drawn(tc, ta, clock, "rc's grant");
    let c_end = rw.read_end("c", WAITER_LEASE);
    rw.assert_granted_already(&answered, tc, 1, c_end, "rc's attempt");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tc + 1),
            l: v(100),
            r: v("a-write"),
            x: v(""),
            q: v(""),
            s: lines(&[
                rw.reader("a", 1, ta, LEASE, "a-read", "-"),
                rw.reader("c", 1, tc, WAITER_LEASE, "rc", "rc"),
                rw.reader("d", 1, tc + 1, WAITER_LEASE, "rd", "rd"),
            ]),
            ..RwHash::default()
        }),
        "the wave of rc and rd granted by rc's attempt",
    );
    assert_eq!(
        rw.inbox_events("c"),
        [rw_grants(0, &[("rc", WAITER_LEASE, tc)])]
    );
    assert_eq!(
        rw.inbox_events("d"),
        [rw_grants(0, &[("rd", WAITER_LEASE, tc + 1)])]
    );
    rw.assert_no_stray_keys();
}

/// A queued waiter's line carries the time until which its client vouches for it (one waiter
/// lease from its attempt, moved on by the heartbeat): once that passed, the waiter is dropped
/// where the scripts meet it. A dead writer no longer keeps new readers out (nor does a writer
/// that leaves); one whose heartbeat vouched for it still does; a grant passes over a dead
/// waiter.
#[test]
fn a_waiter_whose_client_stopped_vouching_for_it_is_dropped() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "h", "i", "j"]);
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let d_line = rw.reader("d", 1, t, LEASE, "d-read", "-");
    let d_end = rw.read_end("d", LEASE);
    // b's writer waits, vouched for 100 ms; nobody moves it on.
    let wb = Bid::write("b", "b-wait").waiting("wb").waiter_lease(100);
    rw.assert_busy(&rw.acquire(wb), d_end, "wb waits");
    sleep(Duration::from_millis(150));
    let te = rw.acquire(Bid::read("e", "e-read"))[1];
    assert!(te > t, "e's token {te} not above d's {t}");
    let e_line = rw.reader("e", 1, te, LEASE, "e-read", "-");
    let readers = RwHash {
        f: v(te),
        q: v(""),
        s: lines(&[d_line, e_line]),
        ..RwHash::default()
    };
    rw.assert_hash(
        &readers,
        "e reads past the dead writer wb, whose place went",
    );
    let e_end = rw.read_end("e", LEASE);

    // c's writer, vouched for 100 ms, but its heartbeat vouches for it a waiter lease on: it
    // keeps readers out past the 100 ms. It leaves: the readers' way is free again.
    let wc = Bid::write("c", "c-wait").waiting("wc").waiter_lease(100);
    rw.assert_busy(&rw.acquire(wc), e_end, "wc waits");
    assert_eq!(rw.heartbeat(&["wc"]), vec![1]);
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued_alive(wc, WAITER_LEASE)]),
            ..readers.clone()
        },
        "wc's heartbeat",
    );
    sleep(Duration::from_millis(150));
    rw.assert_busy(
        &rw.acquire(Bid::read("g", "g-try")),
        e_end,
        "g behind the live writer wc",
    );
    assert_eq!(rw.leave("wc"), vec![1]);
    let tg = rw.acquire(Bid::read("g", "g-read"))[1];
    assert!(tg > te, "g's token {tg} not above e's {te}");
    assert_eq!(rw.release(READ, "g", tg, "g-release"), vec![1, 0]);

    // i's writer, then h's reader vouched for 100 ms, then j's writer: once h is dead, i's
    // release grants the lock to j.
    let wi = Bid::write("i", "i-wait").waiting("wi");
    let rh = Bid::read("h", "h-wait").waiting("rh").waiter_lease(100);
    let wj = Bid::write("j", "j-wait").waiting("wj");
    for bid in [wi, rh, wj] {
        rw.assert_busy(&rw.acquire(bid), e_end, bid.waiter);
    }
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    let ti = rw.token();
    assert_eq!(hold_owner(&server, RW_HOLD).as_deref(), Some("i"));
    sleep(Duration::from_millis(150));
    let clock = rw.clock();
    assert_eq!(rw.release(WRITE, "i", ti, "i-release"), vec![1, 0]);
    let tj = rw.token();
    assert_drawn(tj, ti, clock, "wj's grant");
    rw.assert_hash(
        &write_granted(
            "j",
            tj,
            WAITER_LEASE,
            "wj",
            rw.write_end(WAITER_LEASE),
            "i-release,e-release,d-release,g-release",
        ),
        "wj granted past the dead reader rh",
    );
    assert_eq!(rw.inbox_events("j"), [rw_grant("wj", tj, WAITER_LEASE, 0)]);
    assert!(rw.inbox_events("h").is_empty(), "h was sent to");
    rw.assert_no_stray_keys();
}

/// `rw_renew.lua`, a batch: per hold 1 renewed (its end `lease` ms from now, a shorter lease
/// shortening it; a write renewal also sets `l`), 0 not held, -1 another owner holds the write
/// hold, -2 the owner's hold carries another token. Lease 0 only checks. The hash lasts as its
/// latest hold; no refusal or check changes a key, and no renewal creates one.
#[test]
fn rw_renew_renews_checks_and_refuses() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    const Y: &str = "{t:0}:rw:y";
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let te = rw.acquire(Bid::read("e", "e-read"))[1];
    let e_line = rw.reader("e", 1, te, LEASE, "e-read", "-");
    let readers = RwHash {
        f: v(te),
        q: v(""),
        ..RwHash::default()
    };

    // e under d's token (another hold's): -2.
    assert_eq!(
        rw.renew(
            2 * LEASE,
            &[
                (READ, "d", t),
                (READ, "e", t),
                (READ, "z", t),
                (WRITE, "d", t)
            ]
        ),
        vec![1, -2, 0, 0]
    );
    rw.assert_hash(
        &RwHash {
            s: lines(&[
                e_line.clone(),
                rw.reader("d", 1, t, 2 * LEASE, "d-read", "-"),
            ]),
            ..readers.clone()
        },
        "d renewed",
    );
    rw.assert_lasts_as_its_holds("d renewed");
    assert_eq!(rw.renew(1_000, &[(READ, "d", t)]), vec![1]);
    let shorter = RwHash {
        s: lines(&[e_line, rw.reader("d", 1, t, 1_000, "d-read", "-")]),
        ..readers
    };
    rw.assert_hash(&shorter, "d renewed for less");
    rw.assert_lasts_as_its_holds("d renewed for less: e's end is the latest");
    let before = rw.dump(&[]);
    assert_eq!(
        rw.renew(
            0,
            &[
                (READ, "d", t),
                (READ, "e", te),
                (READ, "e", t),
                (READ, "z", t)
            ]
        ),
        vec![1, 1, -2, 0]
    );
    assert_eq!(rw.dump(&[]), before, "a check changed a key");

    // A tombstone: nothing held.
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    rw.assert_lasts_the_window("a tombstone");
    let before = rw.dump(&[]);
    let ttl = rw.pttl();
    assert_eq!(
        rw.renew(LEASE, &[(READ, "d", t), (WRITE, "d", t)]),
        vec![0, 0]
    );
    assert_eq!(
        rw.dump(&[]),
        before,
        "a renewal of a free lock changed a key"
    );
    assert!(rw.pttl() <= ttl, "a renewal of a free lock pushed the ttl");

    // The write side.
    let ta = rw.acquire(Bid::write("a", "a-write"))[1];
    let holds = [
        (WRITE, "a", ta),
        (WRITE, "b", ta),
        (WRITE, "a", ta - 1),
        (READ, "a", ta),
    ];
    assert_eq!(rw.renew(2 * LEASE, &holds), vec![1, -1, -2, 0]);
    let renewed = RwHash {
        x: v("e-release,d-release"),
        ..write_held("a", ta, 2 * LEASE, "a-write", rw.write_end(2 * LEASE))
    };
    rw.assert_hash(&renewed, "a's write hold renewed");
    rw.assert_lasts_as_its_holds("a's write hold renewed");
    let before = rw.dump(&[]);
    assert_eq!(rw.renew(0, &holds), vec![1, -1, -2, 0]);
    assert_eq!(rw.dump(&[]), before, "a check changed a key");
    assert_eq!(
        ints(rw.renew_raw(LEASE, &[(Y, WRITE, "a", ta), (Y, READ, "a", ta)])),
        vec![0, 0]
    );
    assert!(!exists(&server, Y), "a renewal created a hash");
    rw.assert_no_stray_keys();
}

/// `rw_inspect.lua`: `{write held, write count, write token (0 without), live read holds, ms
/// until the latest live hold ends (-2 with none)}`; it creates nothing.
#[test]
fn rw_inspect_reports_the_live_holds() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    assert_eq!(rw.inspect(), vec![0, 0, 0, 0, -2]);
    assert!(!exists(&server, RW_HOLD), "inspect created the hash");

    let t = rw.acquire(Bid::read("d", "d-read").lease(10_000))[1];
    let te = rw.acquire(Bid::read("e", "e-read"))[1];
    let inspected = rw.inspect();
    assert_eq!(inspected[..4], [0, 0, 0, 2], "{inspected:?}");
    rw.span().assert_contains(
        rw.read_end("e", LEASE) - inspected[4],
        "the time left until e's end",
    );
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);
    assert_eq!(rw.inspect(), vec![0, 0, 0, 0, -2], "a tombstone");

    let ta = rw.acquire(Bid::write("a", "a-write"))[1];
    assert_eq!(rw.acquire(Bid::write("a", "a-again")), vec![1, ta, 2]);
    assert_eq!(
        rw.acquire(Bid::read("a", "a-read").lease(2 * LEASE)),
        vec![1, ta, 1]
    );
    let inspected = rw.inspect();
    assert_eq!(inspected[..4], [1, 2, ta, 1], "{inspected:?}");
    rw.span().assert_contains(
        rw.read_end("a", 2 * LEASE) - inspected[4],
        "the time left until a's read end",
    );
}

/// `rw_force_unlock.lua`: a lock with no live hold is left as it is (`{0}`); otherwise every
/// read and write hold goes (`{1}`) and the queue's head is granted the lock (a wave of readers,
/// or a writer: a new token each), or the lock is freed (a tombstone for the retry window).
/// `f` is kept; the removed holders' releases find nothing.
#[test]
fn force_unlock_removes_every_hold_and_grants_the_queue_head() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c"]);
    assert_eq!(rw.force_unlock(), vec![0]);
    assert!(!exists(&server, RW_HOLD), "force unlock created the hash");

    let ta = rw.acquire(Bid::write("a", "a-write"))[1];
    assert_eq!(rw.acquire(Bid::write("a", "a-again")), vec![1, ta, 2]);
    assert_eq!(rw.acquire(Bid::read("a", "a-read")), vec![1, ta, 1]);
    let rb = Bid::read("b", "b-wait").waiting("rb");
    let wc = Bid::write("c", "c-wait").waiting("wc");
    // The bound: the latest of a's ends (its write hold's and its read hold's).
    let until = rw.latest_end().unwrap();
    for bid in [rb, wc] {
        rw.assert_busy(&rw.acquire(bid), until, bid.waiter);
    }
    let wc_line = rw.queued(wc);

    let clock = rw.clock();
    assert_eq!(rw.force_unlock(), vec![1]);
    let tb = rw.read_token("b");
    assert_drawn(tb, ta, clock, "rb's grant by force");
    let b_reads = no_writer(RwHash {
        f: v(tb),
        l: v(LEASE),
        r: v("a-again"),
        x: v(""),
        q: lines(&[wc_line]),
        s: lines(&[rw.reader("b", 1, tb, WAITER_LEASE, "rb", "rb")]),
        ..RwHash::default()
    });
    rw.assert_hash(&b_reads, "a's holds removed, rb granted");
    rw.assert_lasts_as_its_holds("rb granted");
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grants(1, &[("rb", WAITER_LEASE, tb)])]
    );
    let before = rw.dump(&[]);
    assert_eq!(rw.release_all(WRITE, "a", ta, "a-release"), vec![0, 0]);
    assert_eq!(rw.release(READ, "a", ta, "a-read-release"), vec![0, 0]);
    assert_eq!(
        rw.dump(&[]),
        before,
        "a removed holder's release changed a key"
    );

    let clock = rw.clock();
    assert_eq!(rw.force_unlock(), vec![1]);
    let tc = rw.token();
    assert_drawn(tc, tb, clock, "wc's grant by force");
    let c_granted = write_granted("c", tc, WAITER_LEASE, "wc", rw.write_end(WAITER_LEASE), "");
    rw.assert_hash(&c_granted, "b's hold removed, wc granted");
    assert_eq!(rw.inbox_events("c"), [rw_grant("wc", tc, WAITER_LEASE, 0)]);

    assert_eq!(rw.force_unlock(), vec![1]);
    let freed = no_writer(c_granted);
    rw.assert_hash(&freed, "c's hold removed, nobody queued");
    rw.assert_lasts_the_window("freed by force");
    let before = rw.dump(&[]);
    assert_eq!(rw.force_unlock(), vec![0]);
    assert_eq!(
        rw.dump(&[]),
        before,
        "force unlock of a free lock changed a key"
    );
    let ahead = rw.push_ahead();
    assert_eq!(
        rw.acquire(Bid::write("d", "d-write")),
        vec![1, ahead + 1, 1]
    );

    // Only lapsed holds (the hash outlived them, as after a failover to a server whose clock
    // runs behind): nothing to remove ({0}), but the queue gets its turn.
    server.cmd(&["DEL", RW_HOLD]);
    let te = rw.acquire(Bid::write("e", "e-write").lease(100))[1];
    let wc2 = Bid {
        op: "c-wait-2",
        waiter: "wc2",
        ..wc
    };
    rw.assert_busy(&rw.acquire(wc2), rw.write_end(100), "wc2 waits");
    server.cmd(&["PEXPIRE", RW_HOLD, "10000"]);
    sleep(Duration::from_millis(150));
    let clock = rw.clock();
    assert_eq!(rw.force_unlock(), vec![0]);
    let tc = rw.token();
    assert_drawn(tc, te, clock, "wc2's grant by force");
    rw.assert_hash(
        &write_granted("c", tc, WAITER_LEASE, "wc2", rw.write_end(WAITER_LEASE), ""),
        "wc2 granted past e's lapsed hold",
    );
    assert_eq!(
        rw.inbox_events("c").last(),
        Some(&rw_grant("wc2", tc, WAITER_LEASE, 0))
    );
    rw.assert_no_stray_keys();
}

/// `rw_leave.lua`: a waiter that gives up leaves its queue line (only its own); a waiter a
/// release had granted the write hold passes the lock on (here to a wave of readers); a reader
/// granted a read hold releases it (a re-entered one keeps its other levels, granted to
/// nobody then), and the last one passes the lock on to the writer at the head. The waiter id
/// joins the freed-by chain when the leave frees a hold; leaving twice, or a lock with no hash,
/// changes nothing.
#[test]
fn a_waiter_that_leaves_drops_its_line_or_passes_its_grant_on() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "d", "e"]);
    assert_eq!(rw.leave("wb"), vec![0]);
    assert!(!exists(&server, RW_HOLD), "leaving created the hash");

    let t = rw.acquire(Bid::write("a", "a-write"))[1];
    let a_end = rw.write_end(LEASE);
    let wb = Bid::write("b", "b-wait").waiting("wb");
    let rc = Bid::read("c", "c-wait").waiting("rc");
    let rx = Bid::read("x", "x-wait").waiting("rx");
    let re = Bid::read("e", "e-wait").waiting("re");
    let wd = Bid::write("d", "d-wait").waiting("wd");
    for bid in [wb, rc, rx, re, wd] {
        rw.assert_busy(&rw.acquire(bid), a_end, bid.waiter);
    }
    let [wb_line, rc_line, re_line, wd_line] = [wb, rc, re, wd].map(|bid| rw.queued(bid));
    assert_eq!(rw.leave("rx"), vec![1]);
    let a_holds = RwHash {
        x: v(""),
        q: lines(&[wb_line, rc_line, re_line, wd_line.clone()]),
        ..write_held("a", t, LEASE, "a-write", a_end)
    };
    rw.assert_hash(&a_holds, "rx left the queue");
    let before = rw.dump(&[]);
    for waiter in ["rx", "r", "wz"] {
        assert_eq!(rw.leave(waiter), vec![0], "{waiter}");
    }
    assert_eq!(rw.dump(&[]), before, "a leave of nobody changed a key");

    // a's release grants the lock to wb; wb leaves before it took it up: rc and re get it.
    assert_eq!(rw.release(WRITE, "a", t, "a-release"), vec![1, 0]);
    let tb = rw.token();
    // rc, re and wd stay queued behind it (lines of one length).
    assert_eq!(rw.inbox_events("b"), [rw_grant("wb", tb, WAITER_LEASE, 3)]);
    let clock = rw.clock();
    assert_eq!(rw.leave("wb"), vec![1]);
    let tc = rw.read_token("c");
    assert_drawn(tc, tb, clock, "rc's grant");
    let te = tc + 1;
    let e_line = rw.reader("e", 1, te, WAITER_LEASE, "re", "re");
    let wave = no_writer(RwHash {
        f: v(te),
        l: v(WAITER_LEASE),
        r: v("wb"),
        x: v("wb,a-release"),
        q: lines(&[wd_line]),
        s: lines(&[
            rw.reader("c", 1, tc, WAITER_LEASE, "rc", "rc"),
            e_line.clone(),
        ]),
        ..RwHash::default()
    });
    rw.assert_hash(&wave, "wb's grant passed on to rc and re");
    for (client, waiter, token) in [("c", "rc", tc), ("e", "re", te)] {
        assert_eq!(
            rw.inbox_events(client),
            [rw_grants(1, &[(waiter, WAITER_LEASE, token)])]
        );
    }
    let before = rw.dump(&[]);
    assert_eq!(rw.leave("wb"), vec![0]);
    assert_eq!(rw.dump(&[]), before, "a second leave changed a key");

    // c re-enters before rc read its grant; rc leaves: c keeps one level, granted to nobody.
    assert_eq!(rw.acquire(Bid::read("c", "c-again")), vec![1, tc, 2]);
    assert_eq!(rw.leave("rc"), vec![1]);
    let c_line = rw.reader("c", 1, tc, LEASE, "c-again", "-");
    rw.assert_hash(
        &RwHash {
            s: lines(&[e_line, c_line]),
            ..wave.clone()
        },
        "rc left its level",
    );
    assert_eq!(rw.release(READ, "c", tc, "c-release"), vec![1, 0]);
    assert!(rw.inbox_events("d").is_empty(), "d was sent to early");

    // re leaves, the last read hold: wd is granted the lock.
    let clock = rw.clock();
    assert_eq!(rw.leave("re"), vec![1]);
    let td = rw.token();
    assert_drawn(td, te, clock, "wd's grant from re");
    rw.assert_hash(
        &write_granted(
            "d",
            td,
            WAITER_LEASE,
            "wd",
            rw.write_end(WAITER_LEASE),
            "re,c-release,wb,a-release",
        ),
        "re's grant passed on to wd",
    );
    assert_eq!(rw.inbox_events("d"), [rw_grant("wd", td, WAITER_LEASE, 0)]);

    // wd leaves too, nobody queued: a tombstone; the releases before stay answered.
    assert_eq!(rw.leave("wd"), vec![1]);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(td),
            l: v(WAITER_LEASE),
            r: v("wd"),
            x: v("wd,re,c-release,wb,a-release"),
            q: v(""),
            s: v(""),
            ..RwHash::default()
        }),
        "freed by wd's leave",
    );
    rw.assert_lasts_the_window("freed by wd's leave");
    let before = rw.dump(&[]);
    assert_eq!(rw.leave("wd"), vec![0]);
    assert_eq!(rw.release(WRITE, "a", t, "a-release"), vec![1, 0]);
    assert_eq!(rw.dump(&[]), before, "a leave or retry changed a key");
    rw.assert_no_stray_keys();
}

/// `rw_heartbeat.lua`: per waiter id, 1 when it is queued (its alive time moved one waiter
/// lease on), granted the write hold (`g`) or a read hold (the waiter column of a line); 0
/// otherwise (an op id, an owner id, a prefix, a lock with no hash). It writes nothing but the
/// alive times of the queued waiters it names: every other field stays, the ttl is not pushed,
/// and nothing is created.
#[test]
fn the_heartbeat_finds_queued_and_granted_waiters_and_moves_only_their_alive_time() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c"]);
    const GONE: &str = "{t:0}:rw:gone";
    let beat = |ids: &[&str], expected: &[i64], what: &str| {
        let ttl = rw.pttl();
        assert_eq!(rw.heartbeat(ids), expected, "{what}");
        assert!(rw.pttl() <= ttl, "{what}: the ttl was pushed");
    };
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let wb = Bid::write("b", "b-wait").waiting("wb");
    let rc = Bid::read("c", "c-wait").waiting("rc");
    for bid in [wb, rc] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("d", LEASE), bid.waiter);
    }
    let before = rw.hash();
    beat(
        &["wb", "rc", "w", "d-read", "d", "rz"],
        &[1, 1, 0, 0, 0, 0],
        "wb and rc queued",
    );
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued(wb), rw.queued(rc)]),
            ..before
        },
        "the queued waiters' alive times moved on",
    );

    // d's release grants the lock to wb: 1 by g, nothing moved for it.
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    let tb = rw.token();
    let before = rw.hash();
    beat(&["wb", "rc"], &[1, 1], "wb granted, rc queued");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued(rc)]),
            ..before
        },
        "rc's alive time moved on",
    );

    // b's release grants rc a read hold: 1 by its line's waiter column; nothing written.
    assert_eq!(rw.release(WRITE, "b", tb, "b-release"), vec![1, 0]);
    let tc = rw.read_token("c");
    assert!(tc > tb, "rc's token {tc} not above wb's {tb}");
    let before = rw.dump(&[GONE]);
    beat(&["wb", "rc", "c", "b-release"], &[0, 1, 0, 0], "rc granted");
    assert_eq!(
        ints(rw.heartbeat_raw(
            WAITER_LEASE,
            &[(RW_HOLD, &["rc"]), (GONE, &["rc"]), (RW_HOLD, &[])]
        )),
        vec![1, 0]
    );
    assert_eq!(rw.dump(&[GONE]), before, "a heartbeat wrote");
    assert!(!exists(&server, GONE), "a heartbeat created a hash");

    // c's release: a tombstone; then the hash expires.
    assert_eq!(rw.release(READ, "c", tc, "c-release"), vec![1, 0]);
    beat(&["wb", "rc"], &[0, 0], "freed");
    server.cmd(&["PEXPIRE", RW_HOLD, "1"]);
    sleep(Duration::from_millis(20));
    assert_eq!(rw.heartbeat(&["wb", "rc"]), vec![0, 0]);
    assert!(!exists(&server, RW_HOLD), "a heartbeat created the hash");
    rw.assert_no_stray_keys();
}

/// The hash's ttl is the latest end of its holds (the write end and every read line's): it
/// grows and shrinks with them (a writer's own read hold may outlast its write hold). With no
/// hold left it is the retry window (a tombstone keeping `f` and the freed-by chain); once it
/// expired, the next take draws from the fence key again, above every token before.
#[test]
fn the_hash_lasts_as_its_latest_hold_then_the_retry_window() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let ta = rw.acquire(Bid::write("a", "a-write").lease(5_000))[1];
    rw.assert_lasts_as_its_holds("a's write hold");
    assert_eq!(
        rw.acquire(Bid::read("a", "a-read").lease(20_000)),
        vec![1, ta, 1]
    );
    rw.assert_lasts_as_its_holds("a's read hold outlasts its write hold");
    assert_eq!(rw.latest_end(), Some(rw.read_end("a", 20_000)));
    assert_eq!(
        rw.acquire(Bid::write("a", "a-again").lease(40_000)),
        vec![-2]
    );
    assert_eq!(rw.release(WRITE, "a", ta, "a-release"), vec![1, 0]);
    rw.assert_lasts_as_its_holds("a's read hold left");
    let tb = rw.acquire(Bid::read("b", "b-read").lease(40_000))[1];
    assert!(tb > ta, "b's token {tb} not above a's {ta}");
    rw.assert_lasts_as_its_holds("b's read hold is the latest");
    assert_eq!(rw.latest_end(), Some(rw.read_end("b", 40_000)));
    assert_eq!(rw.release(READ, "b", tb, "b-release"), vec![1, 0]);
    rw.assert_lasts_as_its_holds("shrunk back to a's read hold");
    assert_eq!(rw.latest_end(), Some(rw.read_end("a", 20_000)));
    assert_eq!(rw.release(READ, "a", ta, "a-read-release"), vec![1, 0]);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tb),
            l: v(5_000),
            r: v("a-write"),
            x: v("a-read-release,b-release,a-release"),
            q: v(""),
            s: v(""),
            ..RwHash::default()
        }),
        "a tombstone",
    );
    rw.assert_lasts_the_window("a tombstone");

    server.cmd(&["PEXPIRE", RW_HOLD, "1"]);
    sleep(Duration::from_millis(20));
    assert!(!exists(&server, RW_HOLD), "the tombstone did not expire");
    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("c", "c-read"));
    assert_eq!((taken[0], taken[2]), (1, 1), "{taken:?}");
    assert_drawn(
        taken[1],
        tb,
        clock,
        "a read take after the tombstone expired",
    );
    assert_eq!(
        fence_value(&server, FENCE),
        (taken[1] as u64, LAYOUT.to_owned())
    );
    rw.assert_no_stray_keys();
}

/// `rw_leave.lua` of the writer at the head of the queue while readers hold the lock: the
/// readers queued behind it are the queue's turn at once (a wave beside the read holds there).
#[test]
fn the_writer_at_the_head_that_leaves_lets_the_readers_behind_it_in() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c"]);
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let d_end = rw.read_end("d", LEASE);
    let wb = Bid::write("b", "b-wait").waiting("wb");
    let rc = Bid::read("c", "c-wait").waiting("rc");
    for bid in [wb, rc] {
        rw.assert_busy(&rw.acquire(bid), d_end, bid.waiter);
    }
    let d_line = rw.reader("d", 1, t, LEASE, "d-read", "-");
    let clock = rw.clock();
    assert_eq!(rw.leave("wb"), vec![1]);
    let tc = rw.read_token("c");
    assert_drawn(tc, t, clock, "rc's grant");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tc),
            x: v(""),
            q: v(""),
            s: lines(&[d_line, rw.reader("c", 1, tc, WAITER_LEASE, "rc", "rc")]),
            ..RwHash::default()
        }),
        "rc granted once wb left",
    );
    rw.assert_lasts_as_its_holds("d and c read");
    assert_eq!(
        rw.inbox_events("c"),
        [rw_grants(0, &[("rc", WAITER_LEASE, tc)])]
    );
    assert!(rw.inbox_events("b").is_empty(), "b was sent to");
    rw.assert_no_stray_keys();
}

/// A write release naming a successor of its own owner while that owner holds a read hold (a
/// downgrade): the successor would ask for an upgrade, which its own attempt refuses, so it is
/// not named: a plain release (`{1, 0}`), the read hold kept, no hand-over, no queue line.
#[test]
fn a_take_over_never_names_a_successor_that_reads() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let ta = rw.acquire(Bid::write("a", "a-write"))[1];
    assert_eq!(rw.acquire(Bid::read("a", "a-read")), vec![1, ta, 1]);
    let before = rw.hash();
    assert_eq!(rw.take_over("a", ta, "a-release", ("a", "wa")), vec![1, 0]);
    rw.assert_hash(
        &no_writer(RwHash {
            x: v("a-release"),
            ..before
        }),
        "a's write released, nobody named",
    );
    rw.assert_lasts_as_its_holds("a's read hold left");
    assert_eq!(
        rw.acquire(Bid::write("a", "a-again").waiting("wa")),
        vec![-2]
    );
    rw.assert_no_stray_keys();
}

/// The heartbeat counts a grant only while its hold is live: a write hold, or a read line,
/// granted to a waiter and lapsed since (the hash outlived it) is not that waiter's place any
/// more (0: it must try again).
#[test]
fn the_heartbeat_counts_only_live_grants() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c"]);
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    // Both are granted their holds for 100 ms.
    let wb = Bid::write("b", "b-wait").waiting("wb").lease(100);
    let rc = Bid::read("c", "c-wait").waiting("rc").lease(100);
    for bid in [wb, rc] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("d", LEASE), bid.waiter);
    }
    assert_eq!(rw.release(READ, "d", t, "d-release"), vec![1, 0]);
    assert_eq!(hold_owner(&server, RW_HOLD).as_deref(), Some("b"));
    assert_eq!(rw.heartbeat(&["wb", "rc"]), vec![1, 1]);
    server.cmd(&["PEXPIRE", RW_HOLD, "10000"]);
    sleep(Duration::from_millis(150));
    assert_eq!(rw.heartbeat(&["wb", "rc"]), vec![0, 1], "wb's grant lapsed");

    // rc's attempt finds the lock free: its wave is granted, then lapses.
    let answered = rw.acquire(Bid {
        op: "c-wait-2",
        ..rc
    });
    let tc = rw.read_token("c");
    assert_eq!(rw.token(), tc, "f is rc's token");
    let c_end = rw.read_end("c", 100);
    rw.assert_granted_already(&answered, tc, 1, c_end, "rc's grant");
    assert_eq!(rw.heartbeat(&["wb", "rc"]), vec![0, 1]);
    server.cmd(&["PEXPIRE", RW_HOLD, "10000"]);
    sleep(Duration::from_millis(150));
    assert_eq!(rw.heartbeat(&["wb", "rc"]), vec![0, 0], "rc's grant lapsed");
    rw.assert_no_stray_keys();
}

/// `rw_renew` with two read holds of one lock (two owners) in one batch: each entry works on
/// the hash as the entries before it left it, so both are renewed (both lines' ends move, in
/// either order, for a longer or a shorter lease); so are a writer's write hold and its own
/// read hold (a downgrade) in one batch. The hash lasts as its latest hold.
#[test]
fn rw_renew_renews_two_holds_of_one_lock_in_one_batch() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let td = rw.acquire(Bid::read("d", "d-read"))[1];
    let te = rw.acquire(Bid::read("e", "e-read"))[1];
    let readers = RwHash {
        f: v(te),
        q: v(""),
        ..RwHash::default()
    };

    assert_eq!(
        rw.renew(2 * LEASE, &[(READ, "d", td), (READ, "e", te)]),
        vec![1, 1]
    );
    rw.assert_hash(
        &RwHash {
            s: lines(&[
                rw.reader("d", 1, td, 2 * LEASE, "d-read", "-"),
                rw.reader("e", 1, te, 2 * LEASE, "e-read", "-"),
            ]),
            ..readers.clone()
        },
        "d and e renewed in one batch",
    );
    rw.assert_lasts_as_its_holds("d and e renewed in one batch");

    assert_eq!(
        rw.renew(1_000, &[(READ, "e", te), (READ, "d", td)]),
        vec![1, 1]
    );
    rw.assert_hash(
        &RwHash {
            s: lines(&[
                rw.reader("e", 1, te, 1_000, "e-read", "-"),
                rw.reader("d", 1, td, 1_000, "d-read", "-"),
            ]),
            ..readers
        },
        "e and d renewed for less in one batch",
    );
    rw.assert_lasts_as_its_holds("e and d renewed for less in one batch");
    assert_eq!(rw.release(READ, "d", td, "d-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "e", te, "e-release"), vec![1, 0]);

    // A writer's write hold and its own read hold.
    let ta = rw.acquire(Bid::write("a", "a-write").lease(1_000))[1];
    assert_eq!(
        rw.acquire(Bid::read("a", "a-read").lease(1_000)),
        vec![1, ta, 1]
    );
    assert_eq!(
        rw.renew(2 * LEASE, &[(WRITE, "a", ta), (READ, "a", ta)]),
        vec![1, 1]
    );
    rw.assert_hash(
        &RwHash {
            x: v("e-release,d-release"),
            s: lines(&[rw.reader("a", 1, ta, 2 * LEASE, "a-read", "-")]),
            ..write_held("a", ta, 2 * LEASE, "a-write", rw.write_end(2 * LEASE))
        },
        "a's write and read holds renewed in one batch",
    );
    rw.assert_lasts_as_its_holds("a's write and read holds renewed in one batch");
    rw.assert_no_stray_keys();
}

/// Every read hold has a token of its own, so a late call of an ended read hold is told apart
/// from its owner's next read hold: once owner o's read hold ended (its final release) and o
/// took a new one, a release under the ended hold's token with a new op id (not a retry: not in
/// the freed-by chain) is refused `{-1, 0}`, one level or all, and a renewal under it gets -2
/// (with or without a lease); nothing changes and the new hold is left intact, its own calls
/// applied.
#[test]
fn a_stale_call_of_an_ended_read_hold_is_refused_once_its_owner_reads_again() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    let t1 = rw.acquire(Bid::read("o", "o-read-1"))[1];
    assert_eq!(rw.release(READ, "o", t1, "o-release-1"), vec![1, 0]);
    let clock = rw.clock();
    let taken = rw.acquire(Bid::read("o", "o-read-2"));
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    let t2 = taken[1];
    assert_drawn(t2, t1, clock, "o's second read hold");
    let o_reads = no_writer(RwHash {
        f: v(t2),
        x: v("o-release-1"),
        q: v(""),
        s: lines(&[rw.reader("o", 1, t2, LEASE, "o-read-2", "-")]),
        ..RwHash::default()
    });
    rw.assert_hash(&o_reads, "o's second read hold");

    let before = rw.dump(&[]);
    assert_eq!(rw.release(READ, "o", t1, "o-release-late"), vec![-1, 0]);
    assert_eq!(
        rw.release_all(READ, "o", t1, "o-release-late-all"),
        vec![-1, 0]
    );
    assert_eq!(rw.renew(LEASE, &[(READ, "o", t1)]), vec![-2]);
    assert_eq!(rw.renew(0, &[(READ, "o", t1)]), vec![-2]);
    assert_eq!(rw.dump(&[]), before, "a stale call changed a key");
    rw.assert_hash(&o_reads, "o's second read hold left intact");
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 1]);

    // The new hold's own calls.
    assert_eq!(rw.renew(2 * LEASE, &[(READ, "o", t2)]), vec![1]);
    assert_eq!(
        rw.read_end("o", 2 * LEASE),
        rw.latest_end().expect("o's read hold"),
        "o's read hold renewed"
    );
    assert_eq!(rw.release(READ, "o", t2, "o-release-2"), vec![1, 0]);
    assert_eq!(rw.inspect(), vec![0, 0, 0, 0, -2]);
    rw.assert_no_stray_keys();
}

/// A write release naming a successor whose waiter id is a reader's (it does not start with
/// `w`): only the write side takes a write hold over, so it is not named. The release is a
/// plain one (`{1, 0}`): a free lock is left a tombstone, a queue is granted its turn (here a
/// wave of one reader), and the would-be successor is neither handed the write hold nor
/// queued, nor sent anything.
#[test]
fn a_take_over_never_names_a_reader_waiter_id() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "s"]);
    let ta = rw.acquire(Bid::write("a", "a-write"))[1];
    let before = rw.hash();
    assert_eq!(rw.take_over("a", ta, "a-release", ("s", "rs")), vec![1, 0]);
    rw.assert_hash(
        &no_writer(RwHash {
            x: v("a-release"),
            ..before
        }),
        "a's write released, rs not named",
    );
    rw.assert_lasts_the_window("a tombstone");
    assert_eq!(rw.inspect(), vec![0, 0, 0, 0, -2]);

    // A reader queued: the release grants it; rs is not queued.
    let ta2 = rw.acquire(Bid::write("a", "a-write-2"))[1];
    assert!(ta2 > ta, "a's second write token {ta2} not above {ta}");
    let rb = Bid::read("b", "b-wait").waiting("rb");
    rw.assert_busy(&rw.acquire(rb), rw.write_end(LEASE), "rb waits");
    let clock = rw.clock();
    assert_eq!(
        rw.take_over("a", ta2, "a-release-2", ("s", "rs")),
        vec![1, 0]
    );
    let tb = rw.read_token("b");
    assert_drawn(tb, ta2, clock, "rb's grant");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tb),
            l: v(LEASE),
            r: v("a-write-2"),
            x: v("a-release-2,a-release"),
            q: v(""),
            s: lines(&[rw.reader("b", 1, tb, WAITER_LEASE, "rb", "rb")]),
            ..RwHash::default()
        }),
        "rb granted, rs neither handed the lock nor queued",
    );
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grants(0, &[("rb", WAITER_LEASE, tb)])]
    );
    assert!(rw.inbox_events("s").is_empty(), "s was sent to");
    rw.assert_no_stray_keys();
}

/// `rw_leave.lua` whose attempt to grant the queue its turn drops waiters whose client stopped
/// vouching for them (their alive time passed) and grants nothing (the live writer next in
/// line waits for the read hold left): the queue it leaves lacks those dead lines as well as
/// the line of the waiter that left.
#[test]
fn a_leave_that_grants_nothing_drops_the_dead_waiters_it_met() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "l"]);
    let t = rw.acquire(Bid::read("d", "d-read"))[1];
    let d_line = rw.reader("d", 1, t, LEASE, "d-read", "-");
    let d_end = rw.read_end("d", LEASE);
    // b's writer is vouched for 100 ms; c's writer and l's reader a waiter lease.
    let wb = Bid::write("b", "b-wait").waiting("wb").waiter_lease(100);
    let wc = Bid::write("c", "c-wait").waiting("wc");
    let rl = Bid::read("l", "l-wait").waiting("rl");
    for bid in [wb, wc, rl] {
        rw.assert_busy(&rw.acquire(bid), d_end, bid.waiter);
    }
    let [wb_line, wc_line, rl_line] = [wb, wc, rl].map(|bid| rw.queued(bid));
    rw.assert_hash(
        &RwHash {
            f: v(t),
            q: lines(&[wb_line, wc_line.clone(), rl_line]),
            s: lines(&[&d_line]),
            ..RwHash::default()
        },
        "wb, wc and rl queued",
    );
    sleep(Duration::from_millis(150));

    assert_eq!(rw.leave("rl"), vec![1]);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(t),
            x: v(""),
            q: lines(&[wc_line]),
            s: lines(&[d_line]),
            ..RwHash::default()
        }),
        "rl's line and the dead wb's gone, wc left",
    );
    rw.assert_lasts_as_its_holds("d's read hold left");
    for client in ["b", "c", "l"] {
        assert!(rw.inbox_events(client).is_empty(), "{client} was sent to");
    }
    rw.assert_no_stray_keys();
}

/// The `held` notice of a write hold (`rw_acquire.lua`, `ARGV[12]`; field `i` of
/// `lib/rw.lua`): a writer's take that asks for it keeps its client's inbox tag in `i`, the
/// call that queues the first waiter behind the live write hold (a reader here) sends that
/// client `0|held|<token>|<lock id>` and clears `i`, and later waiters send nothing. A grant
/// to a writer that leaves nobody queued gives `i` to the grantee's client; a write hand-over
/// gives it to the successor's client. A read hold never asks: readers are not deferred.
#[test]
fn the_first_waiter_behind_a_write_hold_tells_its_holders_client_once() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["a", "b", "c"]);
    let held_notice = |token: i64| format!("0|held|{token}|{RW_LOCK_ID}");

    let t = rw.acquire(Bid::write("a", "a-write").notice())[1];
    assert_eq!(rw.notice_tag(), tag("a"));
    assert_eq!(
        rw.acquire(Bid::read("b", "b-try"))[0],
        0,
        "a try queues nobody"
    );
    assert!(rw.inbox_events("a").is_empty());
    assert_eq!(rw.acquire(Bid::read("b", "b-wait").waiting("rb"))[0], 0);
    assert_eq!(rw.inbox_events("a"), [held_notice(t)]);
    assert_eq!(rw.notice_tag(), "", "told once: i is cleared");
    assert_eq!(rw.acquire(Bid::write("c", "c-wait").waiting("wc"))[0], 0);
    assert_eq!(rw.inbox_events("a").len(), 1, "one notice per hold");

    // The release grants the reader (the head), then the writer: a write hold granted with
    // nobody left queued gives i to its client, which hears of the first waiter behind it.
    assert_eq!(rw.release(WRITE, "a", t, "a-free"), vec![1, 0]);
    let tb = rw.read_token("b");
    assert_eq!(rw.release(READ, "b", tb, "b-free"), vec![1, 0]);
    let tc = rw.token();
    assert_eq!(
        rw.notice_tag(),
        tag("c"),
        "a granted writer with nobody behind"
    );
    assert_eq!(rw.acquire(Bid::read("b", "b-behind").waiting("rb1"))[0], 0);
    assert_eq!(rw.inbox_events("c").last(), Some(&held_notice(tc)));
    assert_eq!(rw.notice_tag(), "", "told once: i is cleared");
    assert_eq!(rw.leave("rb1"), vec![1]);

    // A write hand-over (nobody queued) gives i to the successor's client.
    let handed = rw.take_over("c", tc, "c-free", ("c", "wc-next"));
    assert_eq!((handed[0], handed[1]), (1, 0), "{handed:?}");
    assert_eq!(rw.notice_tag(), tag("c"));
    let next = rw.token();
    assert_eq!(rw.acquire(Bid::read("b", "b-again").waiting("rb2"))[0], 0);
    assert_eq!(rw.inbox_events("c").last(), Some(&held_notice(next)));
}

// ---------------------------------------------------------------------------
// semaphores: the read side with a bound (`rw_acquire.lua`'s ARGV[13], field `n`)
// ---------------------------------------------------------------------------

/// A semaphore's attempt of `owner` (call `op`) with `permits` permits: a read bid that passes
/// the permit count. Every acquisition of a semaphore has an owner of its own, so one read line
/// is one permit.
fn permit<'a>(owner: &'a str, op: &'a str, permits: u32) -> Bid<'a> {
    Bid::read(owner, op).permits(permits)
}

/// A permit of a semaphore of `permits` taken by each of `owners` in turn (a try each, op
/// `<owner>-take`, lease [`LEASE`]): each draws a token above the one before; their tokens.
fn take_permits<const N: usize>(rw: &Rw, owners: [&str; N], permits: u32) -> [i64; N] {
    let mut previous = rw
        .hash()
        .f
        .map_or(0, |f| f.parse().expect("the hash's token"));
    owners.map(|owner| {
        let op = format!("{owner}-take");
        let clock = rw.clock();
        let taken = rw.acquire(permit(owner, &op, permits));
        assert_eq!(
            (taken.len(), taken[0], taken[2]),
            (3, 1, 1),
            "{owner}'s take: {taken:?}"
        );
        assert_drawn(taken[1], previous, clock, &format!("{owner}'s permit"));
        previous = taken[1];
        taken[1]
    })
}

/// A semaphore (`n` permits) is the read side with a bound: its first take keeps the count as
/// `n`; takes succeed while fewer than `n` read holds live, then a try is busy (queueing
/// nothing) and waiters queue. A release grants the head of the queue only the permit it
/// frees (the wave stops at the bound: one waiter of six), and a force unlock that frees every
/// permit grants `n` waiters (one event per client), the rest left queued in order; the next
/// release grants the next one.
#[test]
fn a_semaphore_grants_no_more_waiters_than_permits_are_free() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["p", "r", "s", "u"]);
    let [ta, tb, tc] = take_permits(&rw, ["a", "b", "c"], 3);
    let holds = [
        rw.reader("a", 1, ta, LEASE, "a-take", "-"),
        rw.reader("b", 1, tb, LEASE, "b-take", "-"),
        rw.reader("c", 1, tc, LEASE, "c-take", "-"),
    ];
    let full = RwHash {
        f: v(tc),
        q: v(""),
        s: lines(&holds),
        n: v(3),
        ..RwHash::default()
    };
    rw.assert_hash(&full, "three permits held");
    rw.assert_lasts_as_its_holds("three permits held");

    // Every permit is held: a try is busy and queues nothing; waiters queue in order (p1, p2
    // of client p; t of client s).
    let a_end = rw.read_end("a", LEASE);
    rw.assert_busy(&rw.acquire(permit("d", "d-try", 3)), a_end, "d's try");
    rw.assert_hash(&full, "a try queued");
    let rp1 = permit("p1", "p1-wait", 3).client("p").waiting("rp1");
    let rp2 = permit("p2", "p2-wait", 3).client("p").waiting("rp2");
    let rr = permit("r", "r-wait", 3).waiting("rr");
    let rs = permit("s", "s-wait", 3).waiting("rs");
    let rt = permit("t", "t-wait", 3).client("s").waiting("rt");
    let ru = permit("u", "u-wait", 3).waiting("ru");
    let waiters = [rp1, rp2, rr, rs, rt, ru];
    for bid in waiters {
        rw.assert_busy(&rw.acquire(bid), a_end, bid.waiter);
    }
    let queue = waiters.map(|bid| rw.queued(bid));
    rw.assert_hash(
        &RwHash {
            q: lines(&queue),
            ..full.clone()
        },
        "six waiters queued",
    );

    // a's release frees one permit: rp1 alone is granted it.
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "a", ta, "a-release"), vec![1, 0]);
    let tp1 = rw.read_token("p1");
    assert_drawn(tp1, tc, clock, "rp1's grant");
    let p1_line = rw.reader("p1", 1, tp1, WAITER_LEASE, "rp1", "rp1");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tp1),
            x: v("a-release"),
            q: lines(&queue[1..]),
            s: lines(&[&holds[1], &holds[2], &p1_line]),
            ..full.clone()
        }),
        "a's permit granted to rp1 alone",
    );
    rw.assert_lasts_as_its_holds("rp1's grant");
    let p_events = vec![rw_grants(
        rw_queued(&queue[1..]),
        &[("rp1", WAITER_LEASE, tp1)],
    )];
    assert_eq!(rw.inbox_events("p"), p_events);
    for client in ["r", "s", "u"] {
        assert!(rw.inbox_events(client).is_empty(), "{client} was sent to");
    }

    // b's release: rp2 alone.
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "b", tb, "b-release"), vec![1, 0]);
    let tp2 = rw.read_token("p2");
    assert_drawn(tp2, tp1, clock, "rp2's grant");
    let p2_line = rw.reader("p2", 1, tp2, WAITER_LEASE, "rp2", "rp2");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tp2),
            x: v("b-release,a-release"),
            q: lines(&queue[2..]),
            s: lines(&[&holds[2], &p1_line, &p2_line]),
            ..full.clone()
        }),
        "b's permit granted to rp2 alone",
    );
    let p_events = [
        p_events[0].clone(),
        rw_grants(rw_queued(&queue[2..]), &[("rp2", WAITER_LEASE, tp2)]),
    ];
    assert_eq!(rw.inbox_events("p"), p_events);

    // A force unlock frees all three permits: a wave of rr, rs and rt (one event to client s
    // for both), and ru, the fourth, waits on.
    let clock = rw.clock();
    assert_eq!(rw.force_unlock(), vec![1]);
    let tr = rw.read_token("r");
    assert_drawn(tr, tp2, clock, "rr's grant");
    let (ts, tt) = (tr + 1, tr + 2);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tt),
            x: v("b-release,a-release"),
            q: lines(&queue[5..]),
            s: lines(&[
                rw.reader("r", 1, tr, WAITER_LEASE, "rr", "rr"),
                rw.reader("s", 1, ts, WAITER_LEASE, "rs", "rs"),
                rw.reader("t", 1, tt, WAITER_LEASE, "rt", "rt"),
            ]),
            ..full.clone()
        }),
        "the force unlock's wave stopped at three",
    );
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 3]);
    assert_eq!(
        rw.inbox_events("r"),
        [rw_grants(1, &[("rr", WAITER_LEASE, tr)])]
    );
    assert_eq!(
        rw.inbox_events("s"),
        [rw_grants(
            1,
            &[("rs", WAITER_LEASE, ts), ("rt", WAITER_LEASE, tt)]
        )]
    );
    assert_eq!(rw.inbox_events("p"), p_events, "p was sent to again");
    assert!(rw.inbox_events("u").is_empty(), "u was sent to");

    // ru is still in line: a try is busy; rr's release grants ru the permit.
    let r_end = rw.read_end("r", WAITER_LEASE);
    rw.assert_busy(&rw.acquire(permit("d", "d-try-2", 3)), r_end, "d behind ru");
    assert_eq!(rw.release(READ, "r", tr, "r-release"), vec![1, 0]);
    let tu = rw.read_token("u");
    assert!(tu > tt, "ru's token {tu} not above rt's {tt}");
    assert_eq!(
        rw.inbox_events("u"),
        [rw_grants(0, &[("ru", WAITER_LEASE, tu)])]
    );
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 3]);
    assert_eq!(rw.hash().q.as_deref(), Some(""));
    rw.assert_no_stray_keys();
}

/// A permit granted to a waiter whose client is gone (Stream mode: no inbox) is taken back and
/// goes on, in the same call, to the next waiter in line: a release that frees one permit
/// grants it past a gone head; a force unlock that frees both passes the one taken back from a
/// gone waiter on to the waiter after the wave. The tokens drawn for the gone waiters stay
/// spent (the next grant's is above them), and a gone client's inbox is never created.
#[test]
fn a_permit_granted_to_a_gone_client_passes_to_the_next_waiter() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    // The clients of g and j are gone: no inbox.
    rw.open_inboxes(&["h", "i", "k"]);
    let [ta, tb] = take_permits(&rw, ["a", "b"], 2);
    let b_line = rw.reader("b", 1, tb, LEASE, "b-take", "-");
    let rg = permit("g", "g-wait", 2).waiting("rg");
    let rh = permit("h", "h-wait", 2).waiting("rh");
    let rj = permit("j", "j-wait", 2).waiting("rj");
    let ri = permit("i", "i-wait", 2).waiting("ri");
    let rk = permit("k", "k-wait", 2).waiting("rk");
    for bid in [rg, rh, rj, ri, rk] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("a", LEASE), bid.waiter);
    }
    let queue = [rw.queued(rj), rw.queued(ri), rw.queued(rk)];

    // a's release grants its permit to rg, whose client is gone: taken back, it goes to rh,
    // whose token is the next after the one rg drew.
    let clock = rw.clock();
    assert_eq!(rw.release(READ, "a", ta, "a-release"), vec![1, 0]);
    let th = rw.read_token("h");
    assert_drawn(th - 1, tb, clock, "rg's grant, taken back");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(th),
            x: v("a-release"),
            q: lines(&queue),
            s: lines(&[&b_line, &rw.reader("h", 1, th, WAITER_LEASE, "rh", "rh")]),
            n: v(2),
            ..RwHash::default()
        }),
        "rg passed over for rh",
    );
    rw.assert_lasts_as_its_holds("rh's grant");
    assert_eq!(
        rw.inbox_events("h"),
        [rw_grants(rw_queued(&queue), &[("rh", WAITER_LEASE, th)])]
    );
    for client in ["i", "k"] {
        assert!(rw.inbox_events(client).is_empty(), "{client} was sent to");
    }

    // A force unlock frees both permits: the wave of rj (gone) and ri; rj's permit, taken
    // back, goes on to rk.
    let clock = rw.clock();
    assert_eq!(rw.force_unlock(), vec![1]);
    let ti = rw.read_token("i");
    assert_drawn(ti - 1, th, clock, "rj's grant, taken back");
    let tk = rw.read_token("k");
    assert_eq!(tk, ti + 1, "rk's token: the next after ri's");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(tk),
            x: v("a-release"),
            q: v(""),
            s: lines(&[
                rw.reader("i", 1, ti, WAITER_LEASE, "ri", "ri"),
                rw.reader("k", 1, tk, WAITER_LEASE, "rk", "rk"),
            ]),
            n: v(2),
            ..RwHash::default()
        }),
        "rj passed over for rk",
    );
    rw.assert_lasts_as_its_holds("ri's and rk's grants");
    assert_eq!(
        rw.inbox_events("i"),
        [rw_grants(1, &[("ri", WAITER_LEASE, ti)])]
    );
    assert_eq!(
        rw.inbox_events("k"),
        [rw_grants(0, &[("rk", WAITER_LEASE, tk)])]
    );
    for client in ["g", "j"] {
        assert!(
            !exists(&server, &inbox(client)),
            "a gone client's inbox created"
        );
    }
    rw.assert_no_stray_keys();
}

/// Every user of a semaphore gives the same permit count. While permits are held or waiters
/// queue, an attempt with another count (more or fewer permits; a try or a waiting attempt) is
/// refused with `FLPERMITS <the count in force>` and changes nothing: no queue line, and no
/// grant either (not even to a waiter that lapsed holds left queued, which an attempt with the
/// count in force grants at once). Once the semaphore is idle (its tombstone), the next take's
/// count applies and is kept as `n`. A semaphore's first take refused at the fence key
/// (missing, or a foreign value there) leaves no hash behind.
#[test]
fn another_permit_count_is_refused_while_the_semaphore_is_in_use() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["v", "x", "z"]);

    let nothing = rw.dump(&[]);
    let refused = rw.attempt(permit("a", "a-take", 2), &fence_arg(false));
    assert_eq!(
        refused.error_message(),
        Some("FLFENCE missing"),
        "{refused:?}"
    );
    assert_eq!(rw.dump(&[]), nothing, "a first take refused left a key");
    server.cmd(&["RPUSH", FENCE, "planted"]);
    let planted = rw.dump(&[]);
    assert_wrongtype(
        &rw.attempt(permit("a", "a-take", 2), &fence_arg(true)),
        "a foreign value at the fence key",
    );
    assert_eq!(rw.dump(&[]), planted, "a first take refused left a key");
    server.cmd(&["DEL", FENCE]);

    // Two permits held, a waiter queued: other counts are refused.
    let [ta, tb] = take_permits(&rw, ["a", "b"], 2);
    let rv = permit("v", "v-wait", 2).waiting("rv");
    rw.assert_busy(&rw.acquire(rv), rw.read_end("a", LEASE), "rv waits");
    let inboxes = [inbox("v"), inbox("x")];
    let inboxes = inboxes.each_ref().map(String::as_str);
    let before = rw.dump(&inboxes);
    for (bid, what) in [
        (permit("x", "x-try", 3), "a try for 3"),
        (permit("x", "x-try-1", 1), "a try for 1"),
        (
            permit("x", "x-wait", 3).waiting("rx"),
            "a waiting attempt for 3",
        ),
    ] {
        let refused = rw.attempt(bid, &fence_arg(true));
        assert_eq!(
            refused.error_message(),
            Some("FLPERMITS 2"),
            "{what}: {refused:?}"
        );
        assert_eq!(rw.dump(&inboxes), before, "{what}: a key changed");
    }

    // The permits go back (a's to rv), and the semaphore is idle: a tombstone keeping n.
    assert_eq!(rw.release(READ, "a", ta, "a-release"), vec![1, 0]);
    let tv = rw.read_token("v");
    assert!(tv > tb, "rv's token {tv} not above b's {tb}");
    assert_eq!(rw.release(READ, "b", tb, "b-release"), vec![1, 0]);
    assert_eq!(rw.release(READ, "v", tv, "v-release"), vec![1, 0]);
    let tombstone = no_writer(RwHash {
        f: v(tv),
        x: v("v-release,b-release,a-release"),
        q: v(""),
        s: v(""),
        n: v(2),
        ..RwHash::default()
    });
    rw.assert_hash(&tombstone, "idle: the tombstone");
    rw.assert_lasts_the_window("idle: the tombstone");

    // An idle semaphore takes the next take's count.
    let [tc] = take_permits(&rw, ["c"], 3);
    rw.assert_hash(
        &RwHash {
            f: v(tc),
            s: lines(&[rw.reader("c", 1, tc, LEASE, "c-take", "-")]),
            n: v(3),
            ..tombstone
        },
        "c's take under 3 permits",
    );
    let before = rw.dump(&[]);
    let refused = rw.attempt(permit("d", "d-try", 2), &fence_arg(true));
    assert_eq!(refused.error_message(), Some("FLPERMITS 3"), "{refused:?}");
    assert_eq!(rw.dump(&[]), before, "the old count's try changed a key");

    // A waiter left queued behind a permit whose lease ran out (the hash outlives it): a call
    // with another count is refused without granting it; one with the count in force grants
    // it first and is busy behind it.
    server.cmd(&["DEL", RW_HOLD]);
    let ty = rw.acquire(permit("y", "y-take", 1).lease(100))[1];
    let rz = permit("z", "z-wait", 1).waiting("rz");
    rw.assert_busy(&rw.acquire(rz), rw.read_end("y", 100), "rz waits");
    server.cmd(&["PEXPIRE", RW_HOLD, "10000"]);
    sleep(Duration::from_millis(150));
    let before = rw.dump(&[&inbox("z")]);
    let refused = rw.attempt(permit("x", "x-try-2", 2), &fence_arg(true));
    assert_eq!(refused.error_message(), Some("FLPERMITS 1"), "{refused:?}");
    assert_eq!(
        rw.dump(&[&inbox("z")]),
        before,
        "the refused call changed a key"
    );
    let busy = rw.acquire(permit("x", "x-try-3", 1));
    let tz = rw.read_token("z");
    assert!(tz > ty, "rz's token {tz} not above y's {ty}");
    rw.assert_busy(&busy, rw.read_end("z", WAITER_LEASE), "x behind rz's grant");
    assert_eq!(
        rw.inbox_events("z"),
        [rw_grants(0, &[("rz", WAITER_LEASE, tz)])]
    );
    rw.assert_no_stray_keys();
}

/// A busy attempt on a semaphore is told to look again when the first permit may come free:
/// its bound counts down to the earliest end of a live read hold, not to the latest one (which
/// a writer of a read-write lock waits for), and the end of a hold that lapsed (its holder died)
/// does not count. A waiting attempt gets the same bound.
#[test]
fn a_busy_semaphore_attempt_looks_again_at_the_earliest_end_of_a_live_hold() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    // a's permit ends last, b's first; a line whose end passed goes before them.
    let ta = rw.acquire(permit("a", "a-take", 2).lease(2 * LEASE))[1];
    let tb = rw.acquire(permit("b", "b-take", 2))[1];
    let a_line = rw.reader("a", 1, ta, 2 * LEASE, "a-take", "-");
    let b_line = rw.reader("b", 1, tb, LEASE, "b-take", "-");
    let (a_end, b_end) = (rw.read_end("a", 2 * LEASE), rw.read_end("b", LEASE));
    assert!(b_end < a_end, "b's end {b_end} not before a's {a_end}");
    // x's read hold, whose end passed.
    server.cmd(&["HSET", RW_HOLD, "=x", &format!("1 {} x-take -", ta - 1)]);
    let lapsed_end = (rw.clock_ms() - 1_000).to_string();
    server.cmd(&["ZADD", RW_READS, &lapsed_end, "x"]);

    let busy = rw.acquire(permit("c", "c-try", 2));
    rw.assert_busy(&busy, b_end, "c's try: b's end, the earliest live one");
    assert_eq!(busy[2], tb, "c's mark: b's token, the latest");
    // The try dropped the lapsed line on the way (and wrote the lock without a write hold).
    let held = RwHash {
        o: v(""),
        c: v(0),
        f: v(tb),
        q: v(""),
        e: v(""),
        s: lines(&[&a_line, &b_line]),
        n: v(2),
        ..RwHash::default()
    };
    rw.assert_hash(&held, "the lapsed line dropped");
    rw.assert_lasts_as_its_holds("a's end is the latest");
    let rc = permit("c", "c-wait", 2).waiting("rc");
    rw.assert_busy(&rw.acquire(rc), b_end, "c waits");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued(rc)]),
            ..held
        },
        "c queued",
    );
    rw.assert_no_stray_keys();
}

/// Strict FIFO: a permit may be free while a live waiter is queued (its holder's lease ran out
/// without a release, which would have granted it on). The next attempt, whoever makes it,
/// grants the queued waiter that permit first: a newcomer then finds every permit held and is
/// busy (its try queues nothing, its waiting attempt queues behind), and takes a permit only
/// when one is left after the queue's turn. The waiter's own attempt is answered with its
/// grant.
#[test]
fn a_free_permit_goes_to_the_queued_waiter_before_a_newcomer() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["c", "d", "u", "v"]);
    // Two permits: a's, and x's for 100 ms (its holder dies: no release); v waits.
    let [ta] = take_permits(&rw, ["a"], 2);
    let a_line = rw.reader("a", 1, ta, LEASE, "a-take", "-");
    let tx = rw.acquire(permit("x", "x-take", 2).lease(100))[1];
    let rv = permit("v", "v-wait", 2).waiting("rv");
    rw.assert_busy(&rw.acquire(rv), rw.read_end("x", 100), "rv waits");
    sleep(Duration::from_millis(150));
    assert_eq!(rw.inspect()[..4], [0, 0, 0, 1], "x's permit lapsed");

    // c's try grants rv the free permit, then finds both held: busy, nothing queued.
    let clock = rw.clock();
    let busy = rw.acquire(permit("c", "c-try", 2));
    let tv = rw.read_token("v");
    assert_drawn(tv, tx, clock, "rv's grant");
    let v_end = rw.read_end("v", WAITER_LEASE);
    rw.assert_busy(&busy, v_end, "c's try behind rv's grant");
    let granted = no_writer(RwHash {
        f: v(tv),
        x: v(""),
        q: v(""),
        s: lines(&[&a_line, &rw.reader("v", 1, tv, WAITER_LEASE, "rv", "rv")]),
        n: v(2),
        ..RwHash::default()
    });
    rw.assert_hash(&granted, "rv granted by c's try");
    assert_eq!(
        rw.inbox_events("v"),
        [rw_grants(0, &[("rv", WAITER_LEASE, tv)])]
    );
    assert!(rw.inbox_events("c").is_empty(), "c was sent to");
    let rc = permit("c", "c-wait", 2).waiting("rc");
    rw.assert_busy(&rw.acquire(rc), v_end, "c queues behind");
    rw.assert_hash(
        &RwHash {
            q: lines(&[rw.queued(rc)]),
            ..granted
        },
        "c queued behind rv's grant",
    );
    let answered = rw.acquire(Bid {
        op: "v-wait-2",
        ..rv
    });
    rw.assert_granted_already(&answered, tv, 1, v_end, "rv's attempt");

    // Three permits, two of which lapse with u queued: d's try grants u first, then takes the
    // permit left; the next try is busy.
    server.cmd(&["DEL", RW_HOLD]);
    let [te] = take_permits(&rw, ["e"], 3);
    let ty = rw.acquire(permit("y", "y-take", 3).lease(100))[1];
    let tz = rw.acquire(permit("z", "z-take", 3).lease(100))[1];
    assert!(tz > ty && ty > te, "tokens {te}, {ty}, {tz}");
    let ru = permit("u", "u-wait", 3).waiting("ru");
    rw.assert_busy(&rw.acquire(ru), rw.read_end("y", 100), "ru waits");
    sleep(Duration::from_millis(150));
    let clock = rw.clock();
    let taken = rw.acquire(permit("d", "d-try", 3));
    let tu = rw.read_token("u");
    assert_drawn(tu, tz, clock, "ru's grant");
    assert_eq!((taken.len(), taken[0], taken[2]), (3, 1, 1), "{taken:?}");
    assert!(taken[1] > tu, "d's token {} not above u's {tu}", taken[1]);
    let td = taken[1];
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(td),
            x: v(""),
            q: v(""),
            s: lines(&[
                rw.reader("e", 1, te, LEASE, "e-take", "-"),
                rw.reader("u", 1, tu, WAITER_LEASE, "ru", "ru"),
                rw.reader("d", 1, td, LEASE, "d-try", "-"),
            ]),
            n: v(3),
            ..RwHash::default()
        }),
        "ru granted, then d's take",
    );
    assert_eq!(
        rw.inbox_events("u"),
        [rw_grants(0, &[("ru", WAITER_LEASE, tu)])]
    );
    assert!(rw.inbox_events("d").is_empty(), "d was sent to");
    rw.assert_busy(
        &rw.acquire(permit("f", "f-try", 3)),
        rw.read_end("u", WAITER_LEASE),
        "f's try: every permit held",
    );
    rw.assert_no_stray_keys();
}

/// A semaphore waiter that gives up (`rw_leave.lua`) while still queued leaves its line and
/// nothing is granted (every permit is held); one that a release had granted a permit gives
/// the permit back (its waiter id joins the freed-by chain), and the permit goes on to the
/// next in line. The heartbeat counts a granted waiter as in place.
#[test]
fn a_semaphore_waiter_that_leaves_passes_its_permit_on() {
    init_tracing();
    let server = RedisServer::start();
    let rw = Rw::new(&server, "stream");
    rw.open_inboxes(&["b", "c", "d"]);
    let [ta] = take_permits(&rw, ["a"], 1);
    let a_line = rw.reader("a", 1, ta, LEASE, "a-take", "-");
    let rb = permit("b", "b-wait", 1).waiting("rb");
    let rc = permit("c", "c-wait", 1).waiting("rc");
    let rd = permit("d", "d-wait", 1).waiting("rd");
    for bid in [rb, rc, rd] {
        rw.assert_busy(&rw.acquire(bid), rw.read_end("a", LEASE), bid.waiter);
    }
    assert_eq!(rw.leave("rc"), vec![1]);
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(ta),
            x: v(""),
            q: lines(&[rw.queued(rb), rw.queued(rd)]),
            s: lines(&[&a_line]),
            n: v(1),
            ..RwHash::default()
        }),
        "rc left its line, nothing granted",
    );

    assert_eq!(rw.release(READ, "a", ta, "a-release"), vec![1, 0]);
    let tb = rw.read_token("b");
    assert!(tb > ta, "rb's token {tb} not above a's {ta}");
    assert_eq!(
        rw.inbox_events("b"),
        [rw_grants(1, &[("rb", WAITER_LEASE, tb)])]
    );
    assert_eq!(rw.heartbeat(&["rb", "rd"]), vec![1, 1]);

    // rb gives up: its permit goes to rd.
    let clock = rw.clock();
    assert_eq!(rw.leave("rb"), vec![1]);
    let td = rw.read_token("d");
    assert_drawn(td, tb, clock, "rd's grant");
    rw.assert_hash(
        &no_writer(RwHash {
            f: v(td),
            x: v("rb,a-release"),
            q: v(""),
            s: lines(&[rw.reader("d", 1, td, WAITER_LEASE, "rd", "rd")]),
            n: v(1),
            ..RwHash::default()
        }),
        "rb's permit passed on to rd",
    );
    rw.assert_lasts_as_its_holds("rd's grant");
    assert_eq!(
        rw.inbox_events("d"),
        [rw_grants(0, &[("rd", WAITER_LEASE, td)])]
    );
    assert!(rw.inbox_events("c").is_empty(), "c was sent to");
    assert_eq!(rw.release(READ, "b", tb, "b-release"), vec![0, 0]);
    rw.assert_no_stray_keys();
}
