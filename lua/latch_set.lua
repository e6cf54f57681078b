-- latch_set.lua: give a count-down latch its count, unless it has one (lib/latch.lua).
-- Uses lib/hold.lua (the op chain) and lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- KEYS[3] fence    unused
-- KEYS[4] events   unused
-- KEYS[5] ops      the op ids of the calls that changed the latch lately (lib/latch.lua)
-- ARGV[1..2]       unused
-- ARGV[3] op       op id, unique per call: the same call delivered again is answered, not
--                  applied again
-- ARGV[4]          unused
-- ARGV[5] window   how long the op id of a call that set the count is remembered (ms)
-- ARGV[6] count    the count, a decimal number from 1 to FL_LATCH_MAX (lib/latch.lua)
--
-- Returns {1} when the count was set, also to the same call delivered again (a waiting-client
--           set left from a latch deleted from outside is dropped),
--         {0} when the latch has a count already (nothing changed),
--         an error (and no change) for a count out of range (the client checks it first),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue, ops = KEYS[1], KEYS[2], KEYS[5]
local op, window, count = ARGV[3], ARGV[5], ARGV[6]

if not string.find(count, '^[1-9]%d*$') or tonumber(count) > FL_LATCH_MAX then
  return redis.error_reply('ERR fredlock latch count out of range: ' .. count)
end
local recorded = fl_latch_ops(ops)
if fl_chain_has(recorded, op) then
  return {1}
end
local current = redis.call('GET', hold)
fl_expect(queue, 'set')
if current then
  fl_latch_count(hold, current)
  return {0}
end
redis.call('SET', hold, count)
redis.call('DEL', queue)
fl_latch_changed(ops, recorded, op, window)
return {1}
