-- latch_set.lua: give a count-down latch its count, unless it has one (lib/latch.lua).
-- Uses lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- ARGV[1] count    the count, a decimal number from 1 to FL_LATCH_MAX (lib/latch.lua)
--
-- Returns {1} when the count was set (a waiting-client set left from a latch deleted from
--           outside is dropped),
--         {0} when the latch has a count already (nothing changed),
--         an error (and no change) for a count out of range (the client checks it first),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue = KEYS[1], KEYS[2]
local count = ARGV[1]

if not string.find(count, '^[1-9]%d*$') or tonumber(count) > FL_LATCH_MAX then
  return redis.error_reply('ERR fredlock latch count out of range: ' .. count)
end
local current = redis.call('GET', hold)
fl_expect(queue, 'set')
if current then
  fl_latch_count(hold, current)
  return {0}
end
redis.call('SET', hold, count)
redis.call('DEL', queue)
return {1}
