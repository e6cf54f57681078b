-- notify.lua: library prelude, prepended by src/scripts.rs to every script that emits a
-- release event. It is not a script of its own.
--
-- fl_emit(events_key, seq_key, mode, maxlen, lock_id, rule, target)
--   events_key  the shard's stream (mode "stream") or channel (modes "pubsub", "spubsub")
--   seq_key     the shard's event counter; every event carries the next value so a reader
--               can tell when it missed one (trimmed stream, dropped pub/sub message)
--   mode        "stream" | "pubsub" | "spubsub"
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
local function fl_emit(events_key, seq_key, mode, maxlen, lock_id, rule, target)
  local seq = redis.call('INCR', seq_key)
  local payload = seq .. '|' .. rule .. '|' .. target .. '|' .. lock_id
  if mode == 'stream' then
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'e', payload)
  else
    if mode == 'spubsub' then
      redis.call('SPUBLISH', events_key, payload)
    else
      redis.call('PUBLISH', events_key, payload)
    end
  end
end
