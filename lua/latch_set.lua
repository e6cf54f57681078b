-- latch_set.lua: give a count-down latch its count, unless it has one (lib/latch.lua).
-- Uses lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- ARGV[1] count    the count, a decimal number above 0
--
-- Returns {1} when the count was set (a waiting-client set left from a latch deleted from
--           outside is dropped),
--         {0} when the latch has a count already (nothing changed),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue = KEYS[1], KEYS[2]
local count = ARGV[1]

local current = redis.call('GET', hold)
fl_expect(queue, 'set')
if current then
  fl_latch_count(hold, current)
  return {0}
end
redis.call('SET', hold, count)
redis.call('DEL', queue)
return {1}
