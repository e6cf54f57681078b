-- latch_delete.lua: delete a count-down latch whatever its count, which opens it: every
-- waiting client is woken (lib/latch.lua).
-- Uses lib/notify.lua and lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..5]       unused (no call)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when the latch had a count, {0} when it was open already (its set of waiting
--           clients, if any, is dropped all the same),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local mode, lock_id = ARGV[6], ARGV[8]

local current = redis.call('GET', hold)
if current then
  fl_latch_count(hold, current)
end
local waiting = {key = queue, members = redis.call('SMEMBERS', queue)}
fl_latch_open(hold, waiting, events, mode, lock_id)
return {current and 1 or 0}
