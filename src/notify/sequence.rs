//! Sequence numbers: how a reader notices that it missed events.
//!
//! A reader must never skip an event silently, or a waiter sleeps until its bound. So every
//! event carries a number: the shard's counter for the shared stream or channel of a shard, the
//! inbox's own counter for this client's inbox (`fl_emit` and `fl_emit_direct` in
//! `lua/lib/notify.lua`). The reader remembers the last number of each series; a number that
//! does not follow it (a trimmed stream, a dropped message, a shard counter that restarted after
//! a flush) is a gap, and the reader answers a gap by waking every local waiter to re-check. An
//! inbox counter that expired starts again at 1, which is not a gap.

use super::Reader;

/// Where an event was read: a shard's stream or channel, or this client's inbox beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The shared events key of this shard; its events carry the shard's sequence numbers.
    Shard(usize),
    /// This client's inbox of the reader's n-th shard; its events carry the inbox's own
    /// sequence numbers (`fl_emit_direct` in `lua/lib/notify.lua`).
    Inbox(usize),
}

/// The sequence numbers a reader checks: one series per shard, one per inbox.
#[derive(Debug)]
pub(crate) struct Sequences {
    shards: SeqTracker,
    inboxes: SeqTracker,
}

impl Sequences {
    pub(crate) fn new(reader: &Reader) -> Self {
        Sequences {
            shards: SeqTracker::new(reader.keyspace.event_shards()),
            // The inboxes are as new as the client: the first event of each is number 1, so a
            // lost first grant shows as a gap too.
            inboxes: SeqTracker {
                last: vec![Some(0); reader.shards.len()],
            },
        }
    }

    /// Records `seq` read from `source`; true when events of that source were missed.
    pub(crate) fn gap(&mut self, source: Source, seq: u64) -> bool {
        match source {
            Source::Shard(shard) => self.shards.gap(shard, seq),
            // An inbox counter that expired (no grant for 5 minutes) starts again at 1.
            Source::Inbox(inbox) => self.inboxes.gap(inbox, seq) && seq != 1,
        }
    }

    /// Forgets every position (after a reconnect in pub/sub mode, where gaps are expected).
    pub(crate) fn reset(&mut self) {
        self.shards.reset();
        self.inboxes.reset();
    }
}

/// Tracks the event sequence of each shard and reports gaps.
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

    /// Records `seq` for `shard`; true when events were missed since the previous one.
    pub(crate) fn gap(&mut self, shard: usize, seq: u64) -> bool {
        let Some(slot) = self.last.get_mut(shard) else {
            return false;
        };
        let missed = matches!(*slot, Some(last) if seq != last.wrapping_add(1));
        *slot = Some(seq);
        missed
    }

    /// Forgets every position (after a reconnect in pub/sub mode, where gaps are expected).
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
    fn inbox_sequences_start_at_one_and_may_restart() {
        let mut seq = Sequences {
            shards: SeqTracker::new(1),
            inboxes: SeqTracker {
                last: vec![Some(0); 2],
            },
        };
        assert!(!seq.gap(Source::Inbox(0), 1));
        assert!(!seq.gap(Source::Inbox(0), 2));
        assert!(seq.gap(Source::Inbox(0), 4), "grant 3 was missed");
        assert!(seq.gap(Source::Inbox(1), 2), "the first grant was missed");
        assert!(
            !seq.gap(Source::Inbox(0), 1),
            "an expired counter starts again"
        );
        assert!(!seq.gap(Source::Shard(0), 9), "shards are tracked apart");
        seq.reset();
        assert!(
            !seq.gap(Source::Inbox(1), 7),
            "after a reset any number is accepted"
        );
    }
}
