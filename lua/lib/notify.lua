-- notify.lua: library prelude, prepended by src/scripts.rs to every script that sends an event
-- to a waiting client. It is not a script of its own.
--
-- Every event goes to the inbox of the one client whose waiters it concerns. An event is one
-- string "seq|rule|target|lock_id" (the lock id last: it may contain "|"): the only field, "e",
-- of a stream entry, or the pub/sub message; seq is 0 (an inbox is not numbered), rule and
-- target are one of (src/notify/event.rs):
--   grant|<waiter>,<token>,<grant ms>,<queued>     a release granted an exclusive or write hold
--                                                  (queued: how many wait behind it)
--   grants|<queued>,<waiter>:<grant ms>:<token>,...  a wave of read holds (lib/rw.lua)
--   name|<waiter>                                  a waiter to wake (it asks Redis itself)
--   held|<token>                                   to a holder's client: the first waiter
--                                                  queued behind its hold with this token
--                                                  (field i of lib/hold.lua)
--   all|                                           every waiter of the id: a count-down latch
--                                                  opened (lib/latch.lua)
-- mode is "stream" | "stream6" (Stream mode on Redis 6.2+, which has XADD NOMKSTREAM) |
-- "pubsub" | "spubsub" (Redis Cluster 7+) | "bpubsub" (a cluster before Redis 7, where PUBLISH
-- is broadcast to every node). Uses EXISTS, XADD MAXLEN ~, XADD NOMKSTREAM (6.2+ only),
-- PUBLISH (Redis 5.0) and SPUBLISH (7.0, cluster only).
--
-- fl_listening(inbox, mode) -> 1 when the client of that inbox is there to hear an event, 0 when
--   it is not, -1 when the server cannot tell: for inspection, which sends nothing. Stream
--   mode: the inbox exists (a client that died leaves it to expire, src/notify/stream.rs);
--   Pub/Sub: a subscriber listens on the inbox channel. Redis Cluster ("spubsub", "bpubsub"):
--   cannot tell (a script does not count the subscribers of a sharded channel, and PUBLISH's
--   count covers one node before Redis 7).
-- fl_emit_to(inbox, mode, payload) -> true when the client of that inbox is there to hear it
--   An event for ONE client: into its inbox "<events key>:to:<inbox tag>" (same hash tag as
--   the shard's events key), which only that client reads, so every other process stays
--   asleep. Inbox events are not numbered (sequence 0): each names its waiters, and a waiter
--   whose event is lost finds its due on its next attempt. Stream mode: the inbox must exist
--   (its client's reader keeps it, lua/inbox_keep.lua; a dead client's inbox expires), and it
--   is capped near 100 entries; a foreign value there counts as no client. On Redis 6.2+
--   ("stream6") one XADD NOMKSTREAM both checks and adds; before, EXISTS then XADD. Pub/Sub: the
--   publish must reach a subscriber, except in a cluster before Redis 7 ("bpubsub"), whose
--   PUBLISH count covers one node only: there every client counts as there.
--
local function fl_emit_to(inbox, mode, payload)
  if mode == 'stream6' then
    local added = redis.pcall('XADD', inbox, 'NOMKSTREAM', 'MAXLEN', '~', '100', '*', 'e', payload)
    return type(added) == 'string'
  end
  if mode == 'stream' then
    if redis.call('EXISTS', inbox) == 0 then
      return false
    end
    local added = redis.pcall('XADD', inbox, 'MAXLEN', '~', '100', '*', 'e', payload)
    return type(added) ~= 'table' or not added.err
  end
  if mode == 'spubsub' then
    return redis.call('SPUBLISH', inbox, payload) > 0
  end
  local reached = redis.call('PUBLISH', inbox, payload)
  return reached > 0 or mode == 'bpubsub'
end

local function fl_listening(inbox, mode)
  if mode == 'stream' or mode == 'stream6' then
    return redis.call('EXISTS', inbox)
  end
  if mode == 'pubsub' then
    return redis.call('PUBSUB', 'NUMSUB', inbox)[2] > 0 and 1 or 0
  end
  return -1
end
