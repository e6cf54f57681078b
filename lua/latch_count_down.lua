-- latch_count_down.lua: count a count-down latch down by one; at zero it opens, which wakes
-- every waiting client (lib/latch.lua). Not retried by the client: a count-down is not
-- idempotent, and one whose reply was lost may or may not have been applied.
-- Uses lib/notify.lua and lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..5]       unused (no call)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {count left}: 0 when this call opened the latch, or when it was open already
--           (nothing changed then),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local mode, lock_id = ARGV[6], ARGV[8]

local current = redis.call('GET', hold)
if not current then
  return {0}
end
local count = fl_latch_count(hold, current)
if count > 1 then
  redis.call('SET', hold, string.format('%d', count - 1))
  return {count - 1}
end
local waiting = {key = queue, members = redis.call('SMEMBERS', queue)}
fl_latch_open(hold, waiting, events, mode, lock_id)
return {0}
