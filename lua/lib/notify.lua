-- notify.lua: library prelude, prepended by src/scripts.rs to every script that emits a
-- release event. It is not a script of its own.
--
-- fl_emit(events_key, seq_key, mode, maxlen, lock_id, rule, target)
--   events_key  the shard's stream (modes "stream" and "stream6") or channel (the other
--               modes)
--   seq_key     the shard's event counter; every event carries the next value so a reader
--               can tell when it missed one (trimmed stream, dropped pub/sub message)
--   mode        "stream" | "stream6" (Stream mode on Redis 6.2+, which has XADD NOMKSTREAM) |
--               "pubsub" | "spubsub" (Redis Cluster 7+) | "bpubsub" (a cluster before Redis 7,
--               where PUBLISH is broadcast to every node)
--   maxlen      approximate stream cap (XADD MAXLEN ~), ignored for pub/sub
--   lock_id     "<kind>:<name>", the key of the readers' local waiter queue
--   rule        wake rule for the readers: "one" | "name" | "chain" | "all"
--   target      for rule "name": the id of the only waiter to wake; for rule "chain" (read-write
--               lock): the ids of the readers to wake joined by ",", or "*" for every reader
--               of the lock (see fl_rw_announce in lib/rw.lua); "" otherwise. Never contains
--               "|" (the event's separator); waiter ids never contain "," or "|"
-- The event is one string "seq|rule|target|lock_id" (the lock id last: it may contain "|"):
-- the only field, "e", of a stream entry, or the pub/sub message.
-- Returns nothing. Uses INCR, XADD MAXLEN ~, PUBLISH (Redis 5.0) and SPUBLISH (7.0, cluster only).
--
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
local function fl_emit(events_key, seq_key, mode, maxlen, lock_id, rule, target)
  local seq = redis.call('INCR', seq_key)
  local payload = seq .. '|' .. rule .. '|' .. target .. '|' .. lock_id
  if mode == 'stream' or mode == 'stream6' then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', payload)
  else
    if mode == 'spubsub' then
      redis.call('SPUBLISH', events_key, payload)
    else
      redis.call('PUBLISH', events_key, payload)
    end
  end
end

local function fl_emit_to(inbox, mode, payload)
  if mode == 'stream6' then
    local added = redis.pcall('XADD', inbox, 'NOMKSTREAM', 'MAXLEN', '~', 100, '*', 'e', payload)
    return type(added) == 'string'
  end
  if mode == 'stream' then
    if redis.call('EXISTS', inbox) == 0 then
      return false
    end
    local added = redis.pcall('XADD', inbox, 'MAXLEN', '~', 100, '*', 'e', payload)
    return type(added) ~= 'table' or not added.err
  end
  if mode == 'spubsub' then
    return redis.call('SPUBLISH', inbox, payload) > 0
  end
  local reached = redis.call('PUBLISH', inbox, payload)
  return reached > 0 or mode == 'bpubsub'
end
