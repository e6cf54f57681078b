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
--
-- fl_emit_direct(inbox, mode, lock_id, rule, target) -> true, or false when nothing was sent
--   An event for the waiters of ONE client (a fair grant): into that client's inbox, the
--   stream or channel "<events key>:to:<client tag>" (same hash tag as the shard's events
--   key), which only that client reads. Every other process's reader stays asleep. The inbox
--   numbers its events itself, with the counter "<inbox>:seq", so that its reader sees a gap
--   as on a shard's stream. In Stream mode the inbox is capped (MAXLEN ~ 100); the inbox and
--   its counter expire 5 minutes after the last event, so the inboxes of clients that are
--   gone disappear (a counter that expired starts again at 1, which readers accept). A
--   foreign value under either key is left alone and the function returns false: the caller
--   then emits on the shard's events key instead.
--   Uses INCR, XADD, PEXPIRE, PUBLISH (Redis 5.0) and SPUBLISH (7.0, cluster only).
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

local function fl_emit_direct(inbox, mode, lock_id, rule, target)
  local counter = inbox .. ':seq'
  local seq = redis.pcall('INCR', counter)
  if type(seq) == 'table' then
    return false
  end
  redis.call('PEXPIRE', counter, 300000)
  local payload = seq .. '|' .. rule .. '|' .. target .. '|' .. lock_id
  if mode == 'stream' then
    local added = redis.pcall('XADD', inbox, 'MAXLEN', '~', 100, '*', 'e', payload)
    if type(added) == 'table' and added.err then
      return false
    end
    redis.call('PEXPIRE', inbox, 300000)
  elseif mode == 'spubsub' then
    redis.call('SPUBLISH', inbox, payload)
  else
    redis.call('PUBLISH', inbox, payload)
  end
  return true
end
