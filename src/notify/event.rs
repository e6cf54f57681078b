//! The wire format of a release event, and how it is read.
//!
//! Both transports carry the same string, built by `fl_emit` in `lua/lib/notify.lua`:
//! `seq|rule|target|lock id`. A stream entry has it as its single field `e`; a channel message
//! is the string itself. The lock id comes last because it may contain anything, `|` included;
//! the waiter ids in a target never contain `|` or [`ID_SEPARATOR`].
//!
//! Reading errs on the side of waking: a rule this version does not know becomes
//! [`WakeRule::All`], a `chain` target without ids wakes every local reader, a `grant` whose
//! numbers do not parse still wakes its waiter (which then asks Redis), and a payload that does
//! not parse at all makes the reader wake every local waiter. A waiter woken for nothing costs
//! one attempt; a waiter left asleep costs up to a lease.

/// Joins the waiter ids in the target of a `chain` event. Waiter ids are a role letter and a
/// hex op id (`Driver::waiter_id`), so they never contain it (nor the pub/sub separator `|`).
pub(crate) const ID_SEPARATOR: char = ',';

/// The target of a `chain` event that wakes every local reader of the lock.
pub(crate) const EVERY_READER: &str = "*";

/// One release event as read from a stream entry or a channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) seq: u64,
    pub(crate) lock_id: String,
    pub(crate) rule: WakeRule,
}

impl Event {
    /// Parses the pub/sub payload `seq|rule|target|lock_id` (the lock id may contain `|`).
    pub(crate) fn from_payload(payload: &str) -> Option<Event> {
        let mut parts = payload.splitn(4, '|');
        let seq = parts.next()?.parse().ok()?;
        let rule = parts.next()?;
        let target = parts.next()?;
        let lock_id = parts.next()?;
        Some(Event {
            seq,
            lock_id: lock_id.to_owned(),
            rule: WakeRule::parse(rule, target),
        })
    }
}

/// How an event wakes the local waiters of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WakeRule {
    One,
    Named(String),
    /// Exclusive locks: a release granted the lock to this queued waiter (wire name `grant`,
    /// target `id,token,lasts_ms`); only it wakes, and it need not run a script.
    Grant(String, Granted),
    /// Read-write lock: the readers Redis admits now (wire name `chain`).
    Chain(Admitted),
    All,
}

impl WakeRule {
    pub(crate) fn parse(rule: &str, target: &str) -> WakeRule {
        match rule {
            "one" => WakeRule::One,
            "name" => WakeRule::Named(target.to_owned()),
            "chain" => WakeRule::Chain(Admitted::parse(target)),
            "grant" => Self::parse_grant(target),
            _ => WakeRule::All,
        }
    }

    /// A `grant` target whose numbers do not parse still names its waiter: woken, it asks
    /// Redis, which answers that the lock is its own (`lua/hold_acquire.lua`).
    fn parse_grant(target: &str) -> WakeRule {
        let mut parts = target.split(ID_SEPARATOR);
        let id = parts.next().unwrap_or_default().to_owned();
        let mut number = || parts.next().and_then(|part| part.parse::<u64>().ok());
        match (number(), number()) {
            (Some(token), Some(lasts_ms)) => {
                let queued = number() == Some(1);
                WakeRule::Grant(
                    id,
                    Granted {
                        token,
                        lasts_ms,
                        queued,
                    },
                )
            }
            _ => WakeRule::Named(id),
        }
    }
}

/// The readers a `chain` event lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// These waiter ids: every live reader from the head of the Redis queue up to the first
    /// live writer.
    Listed(Vec<String>),
    /// Every local reader (`Shared` waiter) of the lock: more readers were admitted than one
    /// event names, or the event named none.
    Every,
}

impl Admitted {
    /// Reads a `chain` target: ids joined by [`ID_SEPARATOR`], or [`EVERY_READER`]. A target
    /// without any id (an event of an older version) is read as [`Admitted::Every`], which
    /// wakes a superset of the admitted readers.
    fn parse(target: &str) -> Admitted {
        if target == EVERY_READER {
            return Admitted::Every;
        }
        let ids: Vec<String> = target
            .split(ID_SEPARATOR)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect();
        if ids.is_empty() {
            Admitted::Every
        } else {
            Admitted::Listed(ids)
        }
    }
}

/// A hold that a release granted to a queued waiter (`lua/lib/hold.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    /// The fencing token of the granted hold.
    pub(crate) token: u64,
    /// How long the granted hold lasts from the grant, in ms, until its new owner renews it.
    pub(crate) lasts_ms: u64,
    /// Other waiters stayed queued behind the grant.
    pub(crate) queued: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(ids: &[&str]) -> WakeRule {
        WakeRule::Chain(Admitted::Listed(
            ids.iter().map(|id| (*id).to_owned()).collect(),
        ))
    }

    #[test]
    fn chain_targets_parse_to_ids_or_every_reader() {
        let event = Event::from_payload("3|chain|rab,rcd|rw:x|y").unwrap();
        assert_eq!(event.lock_id, "rw:x|y");
        assert_eq!(event.rule, listed(&["rab", "rcd"]));
        assert_eq!(
            WakeRule::parse("chain", EVERY_READER),
            WakeRule::Chain(Admitted::Every)
        );
        assert_eq!(
            WakeRule::parse("chain", ""),
            WakeRule::Chain(Admitted::Every),
            "an event without ids wakes every reader"
        );
        assert_eq!(WakeRule::parse("chain", "r1,"), listed(&["r1"]));
    }

    #[test]
    fn waiter_ids_never_contain_an_event_separator() {
        for prefix in ["", "r", "w"] {
            let waiter = format!("{prefix}{}", crate::owner::op_id());
            assert!(!waiter.contains(ID_SEPARATOR), "{waiter}");
            assert!(!waiter.contains('|'), "{waiter}");
            assert_ne!(waiter, EVERY_READER);
        }
    }

    #[test]
    fn payloads() {
        let event = Event::from_payload("7|name|w1|fair:a|b").unwrap();
        assert_eq!(event.seq, 7);
        assert_eq!(event.lock_id, "fair:a|b");
        assert_eq!(event.rule, WakeRule::Named("w1".into()));
        assert!(Event::from_payload("garbage").is_none());
    }

    #[test]
    fn grants_carry_token_and_time_or_still_name_their_waiter() {
        let event = Event::from_payload("0|grant|w1,1795511510591024,3000,1|mutex:a").unwrap();
        let granted = Granted {
            token: 1_795_511_510_591_024,
            lasts_ms: 3_000,
            queued: true,
        };
        assert_eq!(event.rule, WakeRule::Grant("w1".into(), granted));
        let event = Event::from_payload("0|grant|w1,1795511510591024,3000,0|mutex:a").unwrap();
        let alone = Granted {
            queued: false,
            ..granted
        };
        assert_eq!(event.rule, WakeRule::Grant("w1".into(), alone));
        assert_eq!(
            WakeRule::parse("grant", "w1,x,3000"),
            WakeRule::Named("w1".into())
        );
    }
}
