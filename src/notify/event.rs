//! The wire format of a release event, and how it is read.
//!
//! Both transports carry the same string, built by the scripts that call `fl_emit_to`
//! (`lua/lib/notify.lua`): `0|rule|target|lock id`. A stream entry has it as its single field
//! `e`; a channel message is the string itself. The leading number is a sequence field that
//! an inbox does not use (always 0); it is read as a number and otherwise ignored. The lock id
//! comes last because it may contain anything, `|` included; the waiter ids in a target never
//! contain `|` or [`ID_SEPARATOR`].
//!
//! Besides wakeups, an inbox carries one notice for a holder: `held`, the first waiter queued
//! behind one of the client's holds ([`WakeRule::QueuedBehind`]).
//!
//! Reading errs on the side of waking: a rule this version does not know becomes
//! [`WakeRule::All`], a `grant` or `grants` whose numbers do not parse still wakes its waiters
//! (which then ask Redis, and are answered that the hold is theirs), and a payload that does
//! not parse at all makes the reader wake every local waiter. A waiter woken for nothing costs
//! one attempt; a waiter left asleep costs up to a lease.

/// Separates the parts of a `grant` or `grants` target. Waiter ids are hex op ids, or a role
/// letter, an inbox tag, `.` and a hex op id (`Driver::waiter_id`), so they never contain it
/// (nor the pub/sub separator `|`, nor [`GRANT_MS`]).
pub(crate) const ID_SEPARATOR: char = ',';

/// Joins a waiter id, its grant ms and its token in a `grants` target.
const GRANT_MS: char = ':';

/// One release event as read from a stream entry or a channel message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) lock_id: String,
    pub(crate) rule: WakeRule,
}

impl Event {
    /// Parses the payload `seq|rule|target|lock_id` (the lock id may contain `|`).
    pub(crate) fn from_payload(payload: &str) -> Option<Event> {
        let mut parts = payload.splitn(4, '|');
        parts.next()?.parse::<u64>().ok()?;
        let rule = parts.next()?;
        let target = parts.next()?;
        let lock_id = parts.next()?;
        Some(Event {
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
    /// Read-write lock: a release granted read holds to these queued readers of one client
    /// (wire name `grants`, target `token,queued,id:lasts_ms,id:lasts_ms…`); only they wake. A
    /// reader whose numbers do not parse is only woken (None).
    Grants(Vec<(String, Option<Granted>)>),
    /// Every local waiter of the lock id (wire name `all`: a count-down latch opened), and
    /// what an unknown rule or a payload that does not parse becomes.
    All,
    /// Not a wakeup: the first waiter queued behind this client's hold of the lock whose token
    /// this is (wire name `held`, target the token; `lua/lib/hold.lua`, field `i`). A token
    /// that does not parse names every hold of this client on the lock (None).
    QueuedBehind(Option<u64>),
}

impl WakeRule {
    pub(crate) fn parse(rule: &str, target: &str) -> WakeRule {
        match rule {
            "one" => WakeRule::One,
            "name" => WakeRule::Named(target.to_owned()),
            "grant" => Self::parse_grant(target),
            "grants" => Self::parse_grants(target),
            "held" => WakeRule::QueuedBehind(target.parse().ok()),
            // A count-down latch opened (`lua/lib/latch.lua`).
            "all" => WakeRule::All,
            // A rule this version does not know: wake everybody, who then look.
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
                let queued = number().map_or(0, saturate);
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

    /// A `grants` target: about how many waiters stay queued, then `id:lasts_ms:token` per reader (each granted
    /// read hold has a token of its own).
    fn parse_grants(target: &str) -> WakeRule {
        let mut parts = target.split(ID_SEPARATOR);
        let queued = parts
            .next()
            .and_then(|part| part.parse::<u64>().ok())
            .map_or(0, saturate);
        let readers = parts
            .filter(|part| !part.is_empty())
            .map(|part| {
                let mut fields = part.split(GRANT_MS);
                let id = fields.next().unwrap_or_default().to_owned();
                let mut number = || fields.next().and_then(|field| field.parse::<u64>().ok());
                let granted = number().zip(number()).map(|(lasts_ms, token)| Granted {
                    token,
                    lasts_ms,
                    queued,
                });
                (id, granted)
            })
            .collect();
        WakeRule::Grants(readers)
    }
}

/// A hold that a release granted to a queued waiter (`lua/lib/hold.lua`, `lua/lib/rw.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    /// The fencing token of the granted hold.
    pub(crate) token: u64,
    /// How long the granted hold lasts from the grant, in ms, until its new owner renews it.
    pub(crate) lasts_ms: u64,
    /// About how many other waiters stayed queued behind the grant (0: none).
    pub(crate) queued: u32,
}

/// A count from an event, cut to `u32`.
fn saturate(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_carry_each_readers_time_and_token() {
        let event = Event::from_payload(
            "0|grants|1,rab.1:3000:1795511510591024,rab.2:2500:1795511510591025|rw:x|y",
        )
        .unwrap();
        assert_eq!(event.lock_id, "rw:x|y");
        let granted = |lasts_ms, token| Granted {
            token,
            lasts_ms,
            queued: 1,
        };
        assert_eq!(
            event.rule,
            WakeRule::Grants(vec![
                ("rab.1".into(), Some(granted(3000, 1_795_511_510_591_024))),
                ("rab.2".into(), Some(granted(2500, 1_795_511_510_591_025))),
            ])
        );
        assert_eq!(
            WakeRule::parse("grants", "0,r1:3000:x,r2"),
            WakeRule::Grants(vec![("r1".into(), None), ("r2".into(), None)]),
            "readers whose grant does not parse are still woken"
        );
    }

    #[test]
    fn waiter_ids_never_contain_an_event_separator() {
        for prefix in ["", "r", "w"] {
            let waiter = format!("{prefix}{}", crate::owner::op_id());
            assert!(!waiter.contains(ID_SEPARATOR), "{waiter}");
            assert!(!waiter.contains('|'), "{waiter}");
            assert!(!waiter.contains(GRANT_MS), "{waiter}");
        }
    }

    #[test]
    fn a_held_notice_names_the_holds_token() {
        let event = Event::from_payload("0|held|1795511510591024|mutex:a|b").unwrap();
        assert_eq!(event.lock_id, "mutex:a|b");
        assert_eq!(
            event.rule,
            WakeRule::QueuedBehind(Some(1_795_511_510_591_024))
        );
        assert_eq!(
            WakeRule::parse("held", "x"),
            WakeRule::QueuedBehind(None),
            "a token that does not parse names every hold of the lock"
        );
    }

    #[test]
    fn an_opened_latch_wakes_every_waiter_of_its_id() {
        let event = Event::from_payload("0|all||latch:gate").unwrap();
        assert_eq!(event.lock_id, "latch:gate");
        assert_eq!(event.rule, WakeRule::All);
    }

    #[test]
    fn payloads() {
        let event = Event::from_payload("0|name|w1|fair:a|b").unwrap();
        assert_eq!(event.lock_id, "fair:a|b");
        assert_eq!(event.rule, WakeRule::Named("w1".into()));
        assert!(Event::from_payload("garbage").is_none());
        assert!(Event::from_payload("x|name|w1|fair:a").is_none());
    }

    #[test]
    fn grants_carry_token_and_time_or_still_name_their_waiter() {
        let event = Event::from_payload("0|grant|w1,1795511510591024,3000,1|mutex:a").unwrap();
        let granted = Granted {
            token: 1_795_511_510_591_024,
            lasts_ms: 3_000,
            queued: 1,
        };
        assert_eq!(event.rule, WakeRule::Grant("w1".into(), granted));
        let event = Event::from_payload("0|grant|w1,1795511510591024,3000,0|mutex:a").unwrap();
        let alone = Granted {
            queued: 0,
            ..granted
        };
        assert_eq!(event.rule, WakeRule::Grant("w1".into(), alone));
        assert_eq!(
            WakeRule::parse("grant", "w1,x,3000"),
            WakeRule::Named("w1".into())
        );
    }
}
