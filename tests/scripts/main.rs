//! The Lua protocol itself: the scripts as `src/scripts.rs` composes them, run with `EVAL` on
//! the keys of one lock, with KEYS and ARGV in the canonical order of `lua/README.md`. A real
//! redis-server; no client of the crate in between, so each test can replay, drop or re-send a
//! single script call and look at every key after it.
//!
//! The exclusive locks (`hold_*.lua`, `lua/lib/hold.lua`) keep their whole state in one hash
//! per lock: owner `o`, count `c`, token `f`, lease `l`, last op `r`, freed-by chain `x`, the
//! wait queue `q` and the waiter id `g` a release granted or handed the hold to. [`HoldHash`]
//! reads that hash field by field, so a test states the whole state it expects after each
//! call. Each queue line ends with the server clock (ms) when its waiter queued: the harness
//! checks it against the clock read around the attempt that queued it and keeps it, so that a
//! test compares whole lines ([`Lua::line`]); the hand-over limit (`hold_release.lua`'s
//! `ARGV[12]`) is measured against it, and a test sets it back ([`Lua::set_since`]) rather than
//! waiting.
//!
//! Tokens follow the server clock (`fl_clock_after` in `lua/lib/hold.lua`): a token drawn by a
//! call is max(previous + 1, server clock in µs), so a test checks that it is above the
//! previous token and not below the clock read before the call ([`assert_drawn`]), or sets the
//! previous token far ahead of the clock ([`Lua::push_ahead`]) to expect exactly previous + 1.

//!
//! The read-write lock (`rw_*.lua`, `lua/lib/rw.lua`) keeps its whole state in one hash too:
//! the write hold's fields, its end `e` and the read holds `s` beside the queue `q`. [`Rw`]
//! runs its scripts and reads that hash field by field ([`RwHash`]); the times the scripts
//! compute from the server clock (hold ends, a queued waiter's alive time) are checked against
//! the clock read around the call that wrote them ([`Span`]).
//!
//! Modules: [`lua`] (the harness), [`hold`], [`fast`] (the exclusive locks' fast paths),
//! [`grants`], [`checks`], [`rw`] (the read-write lock's scripts), [`latch`] (the count-down
//! latch's answered repeats).

#[path = "../support/mod.rs"]
mod support;

mod checks;
mod fast;
mod grants;
mod hold;
mod latch;
mod lua;
mod rw;
