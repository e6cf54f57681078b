-- latch_delete.lua: delete a count-down latch whatever its count, which opens it: every
-- waiting client is woken (lib/latch.lua).
-- Uses lib/notify.lua, lib/hold.lua (the op chain) and lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      the op ids of the calls that changed the latch lately (lib/latch.lua)
-- ARGV[1..2]       unused
-- ARGV[3] op       op id, unique per call: the same call delivered again is answered, not
--                  applied again
-- ARGV[4]          unused
-- ARGV[5] window   how long the op id of a call that deleted a count is remembered (ms)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when the latch had a count (also to the same call delivered again), {0} when it
--           was open already (its set of waiting clients, if any, is dropped all the same),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue, events, ops = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local op, window, mode, lock_id = ARGV[3], ARGV[5], ARGV[6], ARGV[8]

local recorded = fl_latch_ops(ops)
if fl_chain_has(recorded, op) then
  return {1}
end
local current = redis.call('GET', hold)
if current then
  fl_latch_count(hold, current)
end
local waiting = {key = queue, members = redis.call('SMEMBERS', queue)}
fl_latch_open(hold, waiting, events, mode, lock_id)
if current then
  fl_latch_changed(ops, recorded, op, window)
end
return {current and 1 or 0}
