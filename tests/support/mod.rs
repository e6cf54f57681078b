//! Shared integration-test harness.
//!
//! Every integration test includes this with `mod support;` (the bench and the chaos example
//! with `#[path = "../../tests/support/mod.rs"] mod support;`). Everything is re-exported
//! here, so `support::RedisServer`, `support::config` etc. name it:
//!
//! * `server`: [`RedisServer`], a throwaway `redis-server` process on a free loopback
//!   port with its own temporary directory, which can be killed, paused
//!   (SIGSTOP/SIGCONT) and restarted on the same port.
//! * `resp`: [`Resp`] / [`RespConn`], a tiny synchronous RESP2 client for assertions
//!   that must not depend on the library under test.
//! * `worker`: [`spawn_worker`] / [`wait_worker`] / [`WorkerHandle`], run an ignored test
//!   of the current test binary as a separate OS process.
//! * `kit`: the test kit — [`MODES`], [`HANG`], the [`config`] builder, [`bounded`],
//!   [`eventually`] / [`eventually_async`], [`connect`] and [`shown`].
//! * `handoff`: [`mutex_handoff`] / [`rwlock_handoff`], a lock run through every operation.
//! * `keys`: the documented key layout ([`mutex_keys`], [`layout_key`], …) and reads of keys.
//! * `proxy`: [`ReplyDropper`], a TCP proxy that swallows a reply and cuts its connection.
//! * [`cluster`] and [`sentinel`]: a Redis Cluster and a Sentinel deployment on loopback.
//! * [`init_tracing`]: opt-in log output controlled by `RUST_LOG`; [`composed`]: a script as
//!   the library composes it, for tests that `EVAL` it.
//!
//! The servers and the RESP client use only std, `tempfile`, `libc` and `tracing-subscriber`;
//! the kit uses the library under test and tokio.
#![allow(dead_code)]

pub mod cluster;
mod handoff;
mod keys;
mod kit;
mod proxy;
mod resp;
pub mod sentinel;
mod server;
mod worker;

// Each binary that includes the harness uses a part of it.
#[allow(unused_imports)]
pub use handoff::*;
#[allow(unused_imports)]
pub use keys::*;
#[allow(unused_imports)]
pub use kit::*;
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use resp::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use worker::*;

// ---------------------------------------------------------------------------
// Tracing
// ---------------------------------------------------------------------------

/// Install a `tracing_subscriber` fmt subscriber filtered by `RUST_LOG`
/// (default `warn`), writing through libtest's capture. Safe to call many
/// times; only the first call in a process has an effect.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A script as `src/scripts.rs` composes it: the type-check prelude, the libraries, the
/// script. For tests that drive the Lua protocol directly with `EVAL`.
pub fn composed(libraries: &[&str], script: &str) -> String {
    let mut body = String::from(include_str!("../../lua/lib/check.lua"));
    body.push('\n');
    for library in libraries {
        body.push_str(library);
        body.push('\n');
    }
    body.push_str(script);
    body
}
