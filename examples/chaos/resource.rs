//! The fencing-checked resource: a hash per lock type on a *separate* `redis-server` (faults of
//! the lock server never touch it), updated by two Lua scripts.
//!
//! * `enter(token, pid, epoch)`: refuses a token lower than the highest seen (a stale holder),
//!   records the holder as inside, counts an *overlap* when an older holder is still inside,
//!   and returns the counter;
//! * `commit(token, read, epoch)`: refuses a stale token again; otherwise sets the counter to
//!   `read + 1` and counts a *violation* if the counter moved since `enter` (a lost update,
//!   i.e. two holders' writes were both accepted).
//!
//! Data-loss scenarios also keep a *loss epoch* in a third hash: the parent increments it
//! right before each loss of the lock server's data. A holder's epoch is the one current at
//! its first `enter`, which comes after its acquisition. A write whose holder's epoch is lower
//! than that of a holder that has already entered is a **late write**: it comes from a hold
//! taken before a loss, after a hold taken since has reached the resource. Fencing must
//! refuse it (`late_refused`); `late_accepted` counts those the token check let through
//! because the newer holder's token was not higher. Outside data-loss scenarios the epoch
//! stays 0 and nothing is late.

use std::collections::BTreeMap;

use fred::clients::Client;
use fred::interfaces::{HashesInterface, LuaInterface};

use crate::scenario::LockKind;

/// KEYS: state hash, inside hash, faults hash. ARGV: token, pid, epoch ("" = the current one).
/// Returns {entered (0/1), counter, the holder's epoch}.
const ENTER: &str = r#"
local token = tonumber(ARGV[1])
local epoch = tonumber(ARGV[3]) or tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0')
local entered = tonumber(redis.call('HGET', KEYS[1], 'entered_epoch') or '0')
if epoch > entered then redis.call('HSET', KEYS[1], 'entered_epoch', epoch) end
local highest = tonumber(redis.call('HGET', KEYS[1], 'highest') or '0')
if token < highest then
  redis.call('HINCRBY', KEYS[1], 'stale', 1)
  if epoch < entered then redis.call('HINCRBY', KEYS[1], 'late_refused', 1) end
  return {0, 0, epoch}
end
local overlapped = false
for _, t in ipairs(redis.call('HKEYS', KEYS[2])) do
  local other = tonumber(t)
  if other == token then
    redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  elseif other < token then
    -- an older holder never left: count it once, then forget it
    overlapped = true
    redis.call('HDEL', KEYS[2], t)
  end
end
if overlapped then redis.call('HINCRBY', KEYS[1], 'overlaps', 1) end
redis.call('HSET', KEYS[1], 'highest', token)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return {1, tonumber(redis.call('HGET', KEYS[1], 'counter') or '0'), epoch}
"#;

/// KEYS: state hash, inside hash, faults hash. ARGV: token, value read, the holder's epoch.
/// Returns {committed (0/1), the current epoch}.
const COMMIT: &str = r#"
local token = tonumber(ARGV[1])
local epoch = tonumber(ARGV[3])
local current = tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0')
local late = epoch < tonumber(redis.call('HGET', KEYS[1], 'entered_epoch') or '0')
redis.call('HDEL', KEYS[2], ARGV[1])
local highest = tonumber(redis.call('HGET', KEYS[1], 'highest') or '0')
if token < highest then
  redis.call('HINCRBY', KEYS[1], 'stale', 1)
  if late then redis.call('HINCRBY', KEYS[1], 'late_refused', 1) end
  return {0, current}
end
if late then redis.call('HINCRBY', KEYS[1], 'late_accepted', 1) end
local counter = tonumber(redis.call('HGET', KEYS[1], 'counter') or '0')
if counter ~= tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[1], 'violations', 1)
end
redis.call('HSET', KEYS[1], 'counter', tonumber(ARGV[2]) + 1)
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return {1, current}
"#;

/// The resource of one lock type in one cell.
#[derive(Clone)]
pub struct Resource {
    client: Client,
    keys: Vec<String>,
}

/// What `enter` answered.
pub enum Entered {
    /// Inside: the counter read and the holder's loss epoch.
    Yes { counter: i64, epoch: i64 },
    /// Refused as stale.
    Refused,
}

/// What `commit` answered: accepted or not, and the loss epoch current at the commit.
pub struct Committed {
    pub accepted: bool,
    pub epoch: i64,
}

impl Resource {
    pub fn new(client: Client, prefix: &str, kind: LockKind) -> Resource {
        let state = format!("res:{prefix}:{}", kind.id());
        let inside = format!("{state}:inside");
        Resource {
            client,
            keys: vec![state, inside, faults_key(prefix)],
        }
    }

    /// `epoch`: the holder's loss epoch from its first `enter`, `None` on the first one.
    pub async fn enter(
        &self,
        token: u64,
        epoch: Option<i64>,
    ) -> Result<Entered, fred::error::Error> {
        let epoch = epoch.map(|e| e.to_string()).unwrap_or_default();
        let pid = std::process::id().to_string();
        let reply: Vec<i64> = self
            .client
            .eval(
                ENTER,
                self.keys.clone(),
                vec![token.to_string(), pid, epoch],
            )
            .await?;
        Ok(match reply.as_slice() {
            [1, counter, epoch] => Entered::Yes {
                counter: *counter,
                epoch: *epoch,
            },
            _ => Entered::Refused,
        })
    }

    pub async fn commit(
        &self,
        token: u64,
        read: i64,
        epoch: i64,
    ) -> Result<Committed, fred::error::Error> {
        let args = vec![token.to_string(), read.to_string(), epoch.to_string()];
        let reply: Vec<i64> = self.client.eval(COMMIT, self.keys.clone(), args).await?;
        Ok(Committed {
            accepted: reply.first() == Some(&1),
            epoch: reply.get(1).copied().unwrap_or(0),
        })
    }

    /// The current loss, see [`LossMarker`].
    pub async fn loss_marker(&self) -> Result<LossMarker, fred::error::Error> {
        let (down, back): (Option<u64>, Option<u64>) = self
            .client
            .hmget(&self.keys[2], vec!["down", "back"])
            .await?;
        Ok(LossMarker {
            down: down.unwrap_or(0),
            back: back.unwrap_or(0),
        })
    }

    /// Pids of the holders inside now, by the resource's record.
    pub async fn inside(&self) -> Vec<u32> {
        let map: BTreeMap<String, u32> =
            self.client.hgetall(&self.keys[1]).await.unwrap_or_default();
        map.into_values().collect()
    }

    /// The counters at the end of a cell.
    pub async fn counts(&self) -> ResourceCounts {
        let fields: BTreeMap<String, u64> =
            self.client.hgetall(&self.keys[0]).await.unwrap_or_default();
        let get = |name: &str| fields.get(name).copied().unwrap_or(0);
        ResourceCounts {
            accepted: get("accepted"),
            counter: get("counter"),
            stale: get("stale"),
            overlaps: get("overlaps"),
            violations: get("violations"),
            duplicates: get("duplicates"),
            late_refused: get("late_refused"),
            late_accepted: get("late_accepted"),
        }
    }
}

/// The hash of the loss epoch and the times of the latest loss of a cell.
fn faults_key(prefix: &str) -> String {
    format!("res:{prefix}:faults")
}

/// When the latest loss began (`down`) and when the lock server was back (`back`), in
/// [`crate::mono_us`]; `back < down` while it is not back yet.
#[derive(Clone, Copy, Debug, Default)]
pub struct LossMarker {
    pub down: u64,
    pub back: u64,
}

impl LossMarker {
    pub fn is_back(&self) -> bool {
        self.back >= self.down
    }
}

/// Parent side: a loss of the lock server's data begins now (a new epoch).
pub async fn mark_down(client: &Client, prefix: &str, at: u64) -> Result<(), fred::error::Error> {
    let key = faults_key(prefix);
    let _: i64 = client.hincrby(&key, "epoch", 1).await?;
    client.hset(&key, ("down", at)).await
}

/// Parent side: the lock server is back.
pub async fn mark_back(client: &Client, prefix: &str, at: u64) -> Result<(), fred::error::Error> {
    client.hset(faults_key(prefix), ("back", at)).await
}

/// Resource counters of one lock type, read at the end of a cell.
#[derive(Default, Debug, Clone)]
pub struct ResourceCounts {
    pub accepted: u64,
    pub counter: u64,
    pub stale: u64,
    pub overlaps: u64,
    pub violations: u64,
    pub duplicates: u64,
    pub late_refused: u64,
    pub late_accepted: u64,
}
