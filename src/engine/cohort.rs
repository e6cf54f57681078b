//! Local hand-overs (lock cohorting): a barging [`crate::Mutex`] (or an
//! [`crate::RwLock`]'s write hold) held by this client passes from one task of the client to
//! the next without a call to Redis.
//!
//! Why: under contention a hold of the barging mutex already goes to a task of the releasing
//! process as a rule (eventual fairness, see [`release`](super::release)), and each such
//! hand-over used to cost a release script that rewrote the hold in the new task's name. For
//! Redis that hand-over changes nothing another client can see: the lock stays held by this
//! client. So within a short window the hold in Redis stays as it is, and the client hands it
//! on by itself:
//!
//! * **Who.** Only between acquisitions of handles without an [`Owner`]: nobody re-enters
//!   their holds, so the owner id under which Redis keeps the hold (the first task's) is
//!   presented by no other acquisition. (An owner id copied from such a guard and presented
//!   after its release would re-enter the hold it was handed on to: do not reuse them.)
//! * **Tokens.** Each hand-over takes the token one above its predecessor's. The release that
//!   finally leaves the hold in Redis names the last of them, and the lock's next token goes
//!   above it (`lua/hold_release.lua`, `floor`). If the hold in Redis went away meanwhile (a
//!   forced unlock, a data loss), whoever takes the lock there draws a token from the server
//!   clock, above these: a task handed a hold that was gone is fenced out like any old holder.
//! * **Lease.** The new hold has what is left of the Redis hold's lease (at least half of its
//!   own, or of the waiter lease if shorter: a short grant is handed on too), and is topped
//!   up to its full lease by the watchdog a third into that, like a short grant; renewals and
//!   a lost hold concern the Redis hold, so every guard on it hears of them.
//! * **Fairness.** Hand-overs stop a while after the hold was last written in Redis, or after
//!   its grant arrived (see
//!   [`Config::local_handover`](crate::Config::local_handover)): the next one is a release
//!   script, which grants the lock to the Redis queue when its first waiter is due. The
//!   window is short when waiters of other processes were queued, so the queue moves. When
//!   the release script that wrote the hold found nobody due, it said when the first waiter
//!   will be ([`crate::lease::RedisHold::quiet_until`]): until then a script could only hand
//!   the hold back to this client, so hand-overs go on without one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::release::{release_in_redis, DEFER_MIN_LEFT};
use super::{Driver, DriverHold};
use crate::lease::Lease;
use crate::notify::HandedOver;
use crate::owner::{op_id, Owner};

/// The hand-over of `hold` to the acquisition `waiter` of `owner` asking for a lease of
/// `initial`, if it may happen without a call (see the module docs); None: it takes a release
/// script. Not to a waiter queued in Redis: only a script takes its place out of the queue
/// (otherwise a later release could grant the lock to that member, which nobody would take up).
pub(crate) fn hand_over(
    hold: &DriverHold,
    waiter: &str,
    owner: &Owner,
    initial: Duration,
) -> Option<HandedOver> {
    let driver = &hold.lock;
    let config = &driver.engine().ctx.config;
    let allowed = driver
        .handover()
        .is_some_and(|handover| handover.hands_over_locally())
        && owner.is_anonymous()
        && hold.owner.is_anonymous()
        && !driver.engine().queued.contains(waiter)
        && hold.lost_cause().is_none()
        && driver.engine().ctx.check_open().is_ok();
    if !allowed {
        return None;
    }
    let now = Instant::now();
    let left = hold.deadline().saturating_duration_since(now);
    let lasts = left.min(initial);
    let least = initial.min(config.waiter_lease) / 2;
    let open = window_end(hold) > now;
    if !open || left < DEFER_MIN_LEFT || lasts < least {
        return None;
    }
    Some(HandedOver {
        token: next_token(hold),
        at: now,
        queued: hold.redis.queued,
        quiet: None,
        within: Some((lasts, hold.redis.clone())),
    })
}

/// When `hold` stops passing on within the process (see [`window`]; the script that wrote it
/// may have said that nobody is due for longer).
fn window_end(hold: &DriverHold) -> Instant {
    let config = &hold.lock.engine().ctx.config;
    let window = window(
        config.handover_limit,
        hold.redis.queued,
        hold.token.saturating_sub(hold.redis.token),
    );
    let end = hold.redis.written_at + window;
    hold.redis.quiet_until.map_or(end, |until| until.max(end))
}

/// How long `hold` may still pass on within the process (zero once it may not).
pub(crate) fn window_left(hold: &DriverHold) -> Duration {
    window_end(hold).saturating_duration_since(Instant::now())
}

/// How long after a hold was written in Redis it passes on within the process, with about
/// `queued` waiters of other clients queued behind it then and `handed` hand-overs made since:
/// half the hand-over limit when nobody waited, else a share per waiter and the holder of one
/// and a half limits, or of two limits while the turn has made fewer than
/// [`TURN_HOLDS`] acquisitions (at most half a limit either way). Under a full load each process
/// so holds the lock for about one window per turn.
///
/// Why a count as well as a time: a turn ends with a release script that grants the lock to
/// another process, about ten Redis commands with the event that wakes it, while a hand-over
/// within the process costs none. A window of time alone shrinks with the number of waiters,
/// and with it the number of acquisitions that share those ten commands: 64 processes of one
/// task each made two or three acquisitions per turn and paid three to four commands per
/// acquisition, and the slower each acquisition ran, the fewer fit (so a loaded machine paid
/// more Redis work exactly when it had least to spare). The count keeps a turn at about
/// [`TURN_HOLDS`] acquisitions until the larger share runs out, which still bounds a full
/// rotation of the waiters (and so the longest wait) by time.
fn window(limit: Duration, queued: u32, handed: u64) -> Duration {
    let half = limit / 2;
    if queued == 0 {
        return half;
    }
    let limits_x2 = if handed.saturating_add(1) < TURN_HOLDS {
        4
    } else {
        3
    };
    (limit * limits_x2 / 2 / queued.saturating_add(1)).min(half)
}

/// The acquisitions a turn of this client makes (its first hold and its hand-overs) before
/// its window shrinks back to the plain share (see [`window`]).
const TURN_HOLDS: u64 = 8;

/// The token of a hold handed on from `hold`: one above `hold`'s. Not the server's clock: the
/// hold in Redis may be gone without this client knowing yet (a forced unlock, a data loss),
/// and whoever takes the lock in Redis then draws a token from the clock, which is above
/// every token counted up from this one since it was written (each hand-over takes longer
/// than a µs). So a holder handed a hold that was no longer there is fenced out, as an old
/// holder is.
fn next_token(hold: &DriverHold) -> u64 {
    hold.token + 1
}

/// Takes the deferred release of `driver`'s lock over without a call, for an acquisition of
/// `owner` with `lease`: the hold handed on, adopted by the registry. None when nothing is
/// parked, its release started or was asked for, it is of another role (a read-write lock's
/// write hold, for a reader), or it may not be handed on (see [`hand_over`]).
pub(crate) fn take_parked(
    driver: &Arc<dyn Driver>,
    waiter: &str,
    owner: &Owner,
    lease: Lease,
) -> Option<Arc<DriverHold>> {
    let handed = driver.engine().parked.take_if(driver.keys().id(), |hold| {
        // Only to an acquisition of the hold's own role: a read-write lock's reader never
        // takes its write hold.
        if hold.lock.hold_role() != driver.hold_role() {
            return None;
        }
        hand_over(hold, waiter, owner, lease.initial())
    })?;
    adopt(driver, owner, lease, handed)
}

/// Registers the hold `handed` gave to an acquisition of `owner` with `lease` without a call.
/// None when `handed` came from a release script (it is taken up as any hold from Redis).
pub(crate) fn adopt(
    driver: &Arc<dyn Driver>,
    owner: &Owner,
    lease: Lease,
    handed: HandedOver,
) -> Option<Arc<DriverHold>> {
    let (lasts, redis) = handed.within?;
    driver
        .engine()
        .ctx
        .handed_locally
        .fetch_add(1, Ordering::Relaxed);
    tracing::trace!(
        lock = driver.keys().name(),
        token = handed.token,
        redis_token = redis.token,
        "handed over within the process"
    );
    Some(driver.engine().holds.adopt(
        driver.clone(),
        owner,
        handed.token,
        lease,
        (handed.at, lasts),
        handed.queued.max(1),
        Some(redis),
    ))
}

/// Releases in Redis a hold `handed` over within the process that nobody took up (its
/// acquisition went away, or shutdown began). False when `handed` came from a release script.
pub(crate) async fn release_unused(driver: &Arc<dyn Driver>, handed: &HandedOver) -> bool {
    let Some((_, redis)) = &handed.within else {
        return false;
    };
    let floor = Some(handed.token);
    let outcome = release_in_redis(driver, &redis.owner, redis.token, floor, &op_id(), false).await;
    tracing::debug!(
        lock = driver.keys().name(),
        ?outcome,
        "released a hold handed over within the process that nobody took up"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_millis(20);

    #[test]
    fn nobody_else_waiting_gives_half_a_limit() {
        assert_eq!(window(LIMIT, 0, 0), LIMIT / 2);
        assert_eq!(window(LIMIT, 0, 100), LIMIT / 2);
    }

    #[test]
    fn a_short_turn_gets_the_larger_share_until_it_made_its_holds() {
        // 63 waiters and the holder share two limits, then one and a half.
        assert_eq!(window(LIMIT, 63, 0), LIMIT * 2 / 64);
        assert_eq!(window(LIMIT, 63, TURN_HOLDS - 2), LIMIT * 2 / 64);
        assert_eq!(window(LIMIT, 63, TURN_HOLDS - 1), LIMIT * 3 / 2 / 64);
        assert_eq!(window(LIMIT, 63, 1000), LIMIT * 3 / 2 / 64);
    }

    #[test]
    fn no_window_is_longer_than_half_a_limit() {
        for queued in [1, 2, 3, 4] {
            for handed in [0, TURN_HOLDS, u64::MAX] {
                assert!(window(LIMIT, queued, handed) <= LIMIT / 2);
            }
        }
        assert!(window(LIMIT, u32::MAX, u64::MAX) <= LIMIT / 2);
    }
}
