//! The scenarios (which fault, which lease, which lock deployment) and the lock types under test.

use std::time::Duration;

use fredlock::NotificationMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Baseline,
    ClientKill,
    Restart,
    SigStop,
    SigKill,
    ScriptFlush,
    Oom,
    StreamGap,
    Mixed,
    RestartNoPersistence,
    FlushAll,
    Failover,
    FailoverAcks,
}

impl Scenario {
    pub const ALL: [Scenario; 13] = [
        Scenario::Baseline,
        Scenario::ClientKill,
        Scenario::Restart,
        Scenario::SigStop,
        Scenario::SigKill,
        Scenario::ScriptFlush,
        Scenario::Oom,
        Scenario::StreamGap,
        Scenario::Mixed,
        Scenario::RestartNoPersistence,
        Scenario::FlushAll,
        Scenario::Failover,
        Scenario::FailoverAcks,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::ClientKill => "client-kill",
            Scenario::Restart => "restart",
            Scenario::SigStop => "sigstop",
            Scenario::SigKill => "sigkill",
            Scenario::ScriptFlush => "script-flush",
            Scenario::Oom => "oom",
            Scenario::StreamGap => "stream-gap",
            Scenario::Mixed => "mixed",
            Scenario::RestartNoPersistence => "restart-no-persistence",
            Scenario::FlushAll => "flushall",
            Scenario::Failover => "failover",
            Scenario::FailoverAcks => "failover-acks",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The watchdog lease of the workers. Short where a paused holder must outlive it.
    pub fn lease(self) -> Duration {
        match self {
            Scenario::SigStop | Scenario::Mixed => Duration::from_secs(1),
            _ => Duration::from_secs(2),
        }
    }

    /// Whether a holder may legitimately die or vanish (so waiting out a lease is expected).
    pub fn holders_die(self) -> bool {
        matches!(
            self,
            Scenario::Restart | Scenario::SigStop | Scenario::SigKill | Scenario::Mixed
        ) || self.data_loss()
    }

    /// Whether the lock server loses its data: the workers then watch their holds across each
    /// loss (`lost()`, late writes), see [`crate::worker`].
    pub fn data_loss(self) -> bool {
        matches!(
            self,
            Scenario::RestartNoPersistence
                | Scenario::FlushAll
                | Scenario::Failover
                | Scenario::FailoverAcks
        )
    }

    /// Whether the lock deployment is Sentinel (master, replica, three sentinels).
    pub fn sentinel(self) -> bool {
        matches!(self, Scenario::Failover | Scenario::FailoverAcks)
    }

    /// `Config::replica_acks` of the workers.
    pub fn replica_acks(self) -> u32 {
        u32::from(self == Scenario::FailoverAcks)
    }

    /// Extra `redis-server` arguments of a standalone lock server.
    pub fn lock_server_args(self) -> &'static [&'static str] {
        match self {
            Scenario::RestartNoPersistence => &["--save", "", "--appendonly", "no"],
            _ => &["--appendonly", "yes", "--appendfsync", "always"],
        }
    }

    pub fn explanation(self) -> &'static str {
        match self {
            Scenario::Baseline => {
                "No fault: the reference for the numbers below (same workload, same lease)."
            }
            Scenario::ClientKill => {
                "`CLIENT KILL ID` of one random connection of the lock server (command or \
                 notifier connection of any worker) every 100-300 ms."
            }
            Scenario::Restart => {
                "The lock `redis-server` is SIGKILLed and restarted on the same port and \
                 directory every 4 s. With `appendfsync always` every acknowledged write \
                 (holds, fencing counters, queues, streams) survives; clients reconnect."
            }
            Scenario::SigStop => {
                "Every 3 s a worker process that is inside a critical section is SIGSTOPped \
                 for 2.5 leases (lease 1 s), then SIGCONTed. Its hold expires meanwhile and \
                 another holder takes over with a higher token; after SIGCONT its guard must \
                 report `lost()` and its late write must be refused by the resource."
            }
            Scenario::SigKill => {
                "Every 3 s a worker process inside a critical section is SIGKILLed and a new \
                 worker process is started in its place. Its holds are freed by lease expiry \
                 (the queue of an exclusive lock goes with its hold; the waiters look again \
                 after the lease and queue again). A release passes over its queued waiters \
                 once its client is gone (at once in Pub/Sub mode, when its inbox stream \
                 expires, within 30 s, in Stream mode); a grant to one before that lapses \
                 after the waiter lease. Its read-write queue places lapse after the waiter \
                 lease."
            }
            Scenario::ScriptFlush => {
                "`SCRIPT FLUSH` on the lock server every 200 ms: every script call may meet \
                 `NOSCRIPT` and must reload transparently."
            }
            Scenario::Oom => {
                "Every 2 s `CONFIG SET maxmemory` to 32 KiB above the used memory for 1.5 s, \
                 then back to 0. Writes fail with `OOM`; fredlock reports `Error::OutOfMemory` \
                 and workers retry."
            }
            Scenario::StreamGap => {
                "`XTRIM <stream> MAXLEN 0` on every event stream of the prefix (found with \
                 `SCAN … TYPE stream`) every 50 ms while workers wait, so readers miss events \
                 and must detect the gap and re-check. In Pub/Sub mode there are no streams: \
                 the cell is a second baseline."
            }
            Scenario::Mixed => {
                "All of the above at once at lower rates (kills every 300-900 ms, restart every \
                 7 s, SIGSTOP and SIGKILL every 6 s, flush every 500 ms, OOM windows every 5 s, \
                 trims every 200 ms), lease 1 s."
            }
            Scenario::RestartNoPersistence => {
                "Data loss. The lock `redis-server` runs without persistence (`--save \"\" \
                 --appendonly no`) and is SIGKILLed and restarted empty on the same port every \
                 5 s while workers hold and wait: every hold, queue place, fencing counter and \
                 stream is gone."
            }
            Scenario::FlushAll => {
                "Data loss. `FLUSHALL` on the lock server every 5 s while workers hold and wait; \
                 the connections stay up, so no reconnect tells the clients."
            }
            Scenario::Failover => {
                "Data loss. Sentinel deployment on loopback (master, one replica, three \
                 sentinels; clients connect through the sentinels): every 5 s the master is \
                 SIGKILLed under load, the sentinels promote the replica, and the old master \
                 is restarted empty and rejoins as a replica. Writes the replica had not \
                 received are lost. Default configuration (`replica_acks` 0)."
            }
            Scenario::FailoverAcks => {
                "The `failover` scenario with `Config::replica_acks = 1`: each acquisition \
                 waits until the replica has the hold (`WAIT`), or fails with \
                 `Error::NotReplicated` (counted under lock() errors, other)."
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockKind {
    Mutex,
    Fair,
    RwWrite,
}

impl LockKind {
    pub const ALL: [LockKind; 3] = [LockKind::Mutex, LockKind::Fair, LockKind::RwWrite];

    pub fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "Mutex",
            LockKind::Fair => "FairMutex",
            LockKind::RwWrite => "RwLock write",
        }
    }

    /// Redis-safe short name (resource keys, stats map).
    pub fn id(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Fair => "fair",
            LockKind::RwWrite => "rw",
        }
    }
}

pub fn parse_mode(name: &str) -> Option<NotificationMode> {
    match name {
        "stream" => Some(NotificationMode::Stream),
        "pubsub" => Some(NotificationMode::PubSub),
        _ => None,
    }
}
