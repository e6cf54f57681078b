//! Sequence numbers: how a reader notices that it missed events.
//!
//! A reader must never skip a shard event silently, or a waiter sleeps until its bound. So every
//! event of a shard's stream or channel carries the shard's counter (`fl_emit` in
//! `lua/lib/notify.lua`). The reader remembers the last number of each shard; a number that does
//! not follow it (a trimmed stream, a dropped message, a counter that restarted after a flush)
//! is a gap, and the reader answers a gap by waking every local waiter to re-check.
//!
//! A client's inbox carries grants, each for one named waiter, and is not numbered: a grant
//! whose event is lost is found by the waiter's next attempt when its bound ends
//! (`lua/hold_acquire.lua` answers "granted already").

use super::Reader;

/// Where an event was read: a shard's stream or channel, or this client's inbox beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The shared events key of this shard; its events carry the shard's sequence numbers.
    Shard(usize),
    /// This client's inbox (grants, `lua/lib/hold.lua`); not numbered.
    Inbox,
}

/// The last sequence number seen of every shard.
#[derive(Debug)]
pub(crate) struct Sequences {
    shards: SeqTracker,
}

impl Sequences {
    pub(crate) fn new(reader: &Reader) -> Self {
        Sequences {
            shards: SeqTracker::new(reader.keyspace.event_shards()),
        }
    }

    /// Whether `seq`, read from `source`, shows that events were missed.
    pub(crate) fn gap(&mut self, source: Source, seq: u64) -> bool {
        match source {
            Source::Shard(shard) => self.shards.gap(shard, seq),
            Source::Inbox => false,
        }
    }

    /// Forgets every number (after a reconnect, when any number is accepted).
    pub(crate) fn reset(&mut self) {
        self.shards.reset();
    }
}

/// The last number seen per series.
#[derive(Debug, Default)]
pub(crate) struct SeqTracker {
    last: Vec<Option<u64>>,
}

impl SeqTracker {
    pub(crate) fn new(shards: u16) -> Self {
        SeqTracker {
            last: vec![None; usize::from(shards)],
        }
    }

    /// Records `seq` for `shard`; true when it does not follow the previous number.
    pub(crate) fn gap(&mut self, shard: usize, seq: u64) -> bool {
        let Some(slot) = self.last.get_mut(shard) else {
            return false;
        };
        let missed = matches!(*slot, Some(last) if seq != last.wrapping_add(1));
        *slot = Some(seq);
        missed
    }

    pub(crate) fn reset(&mut self) {
        self.last.iter_mut().for_each(|slot| *slot = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps() {
        let mut seq = SeqTracker::new(2);
        assert!(!seq.gap(0, 5));
        assert!(!seq.gap(0, 6));
        assert!(seq.gap(0, 8));
        assert!(!seq.gap(1, 1));
        assert!(!seq.gap(9, 1), "unknown shard is ignored");
    }

    #[test]
    fn inbox_events_are_not_numbered() {
        let mut seq = Sequences {
            shards: SeqTracker::new(1),
        };
        assert!(!seq.gap(Source::Inbox, 0));
        assert!(!seq.gap(Source::Inbox, 0));
        assert!(!seq.gap(Source::Shard(0), 9));
        assert!(seq.gap(Source::Shard(0), 11), "shard event 10 was missed");
    }
}
