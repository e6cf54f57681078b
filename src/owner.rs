//! Owner identity: who a hold belongs to, and so who may re-enter and release it.
//!
//! Redisson identifies the owner by "client UUID + thread id". Async tasks migrate between
//! threads, so a thread id means nothing here; instead the owner is an explicit value. A lock
//! handle without an owner gives every acquisition a fresh owner (plain mutual exclusion, no
//! re-entry). Bind a handle to an [`Owner`] to make acquisitions under it reentrant: whatever
//! task, thread or process presents the same owner re-enters the hold.

use std::fmt;
use std::sync::Arc;

/// The identity under which holds are taken and re-entered.
///
/// An owner is 122 random bits (a UUID v4), so it cannot be guessed. Cloning is cheap and keeps
/// the identity. Two `Owner::new()` values never re-enter each other's holds.
#[derive(Clone)]
pub struct Owner {
    id: Arc<str>,
    /// Made for one acquisition of a handle without an owner: nobody re-enters its holds, so a
    /// barging mutex may hand its Redis hold on within the process (see
    /// `crate::engine::cohort`).
    anonymous: bool,
}

impl PartialEq for Owner {
    fn eq(&self, other: &Owner) -> bool {
        self.id == other.id
    }
}

impl Eq for Owner {}

impl std::hash::Hash for Owner {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl Owner {
    /// A new, unique owner.
    pub fn new() -> Owner {
        Owner {
            id: uuid::Uuid::new_v4().simple().to_string().into(),
            anonymous: false,
        }
    }

    /// The owner of one acquisition through a handle without an owner.
    pub(crate) fn anonymous() -> Owner {
        Owner {
            anonymous: true,
            ..Owner::new()
        }
    }

    /// Whether this owner was made for one acquisition of a handle without an owner.
    pub(crate) fn is_anonymous(&self) -> bool {
        self.anonymous
    }

    /// The owner with a given id, e.g. one that another process shares so that both re-enter
    /// the same holds. Ids are 1 to 128 printable ASCII characters. Keep them unguessable (use
    /// the id of an [`Owner::new`]): whoever knows an owner id can release its holds.
    pub fn from_id(id: &str) -> crate::Result<Owner> {
        let printable = id.bytes().all(|b| b.is_ascii_graphic());
        if id.is_empty() || id.len() > 128 || !printable {
            return Err(crate::Error::InvalidConfig(
                "an owner id is 1 to 128 printable ASCII characters".into(),
            ));
        }
        Ok(Owner {
            id: id.into(),
            anonymous: false,
        })
    }

    /// The owner's id as stored in Redis. Treat it as a secret: whoever knows it can release the
    /// owner's holds through the scripts.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Default for Owner {
    fn default() -> Self {
        Owner::new()
    }
}

impl fmt::Debug for Owner {
    /// Shows only the first 8 characters, enough to correlate logs without leaking the id.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({}…)", &self.id[..8.min(self.id.len())])
    }
}

/// A unique id for one script call (or one waiting acquisition), so a call that is retried
/// after a lost reply is recognised and answered instead of applied twice.
///
/// 96 random bits drawn once per process, then a counter: unique across processes without a
/// system call per id (a UUID v4 per call cost a `getrandom` call on every lock and unlock).
/// Unlike owner ids, op ids need not be secret: they only tell calls apart.
pub(crate) fn op_id() -> String {
    OpId::next().text()
}

/// An op id kept as its counter, its text ([`op_id`]) written when a call needs it: a waiting
/// acquisition keeps its next attempt's op id for as long as it waits, in 8 bytes rather than
/// a string on the heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpId(u64);

impl OpId {
    /// A fresh op id.
    pub(crate) fn next() -> OpId {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        OpId(COUNTER.fetch_add(1, Ordering::Relaxed))
    }

    /// The op id's text: this process's random prefix, then the counter in lower hex.
    pub(crate) fn text(self) -> String {
        use std::sync::LazyLock;
        static PREFIX: LazyLock<String> = LazyLock::new(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            random[..24].to_owned()
        });
        let n = self.0;
        // By hand rather than `format!`, which costs several times more on every lock and
        // unlock.
        let mut id = String::with_capacity(PREFIX.len() + 16);
        id.push_str(&PREFIX);
        let digits = 16 - (n.leading_zeros() as usize / 4).min(15);
        for shift in (0..digits).rev() {
            let nibble = ((n >> (shift * 4)) & 0xf) as u8;
            id.push(char::from(if nibble < 10 {
                b'0' + nibble
            } else {
                b'a' + nibble - 10
            }));
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_op_id_writes_the_same_text_every_time_and_the_next_one_differs() {
        let op = OpId::next();
        assert_eq!(op.text(), op.text());
        assert_ne!(op.text(), OpId::next().text());
        assert_eq!(op.text()[..24], op_id()[..24], "one prefix per process");
    }

    #[test]
    fn op_ids_end_in_the_counter_in_lower_hex() {
        for _ in 0..40 {
            let id = op_id();
            let (prefix, counter) = id.split_at(24);
            assert!(prefix.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
            let n = u64::from_str_radix(counter, 16).expect("hex counter");
            assert_eq!(counter, format!("{n:x}"), "{id}");
        }
    }

    #[test]
    fn op_ids_are_distinct_and_safe_in_events() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| op_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            // Waiter ids are built from op ids and travel in events separated by "," and "|".
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
    }
}
