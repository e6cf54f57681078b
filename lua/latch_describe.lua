-- latch_describe.lua: read a count-down latch, its count and the clients waiting for it,
-- without changing them (one atomic snapshot, for inspection: src/lock/inspect.rs).
-- Uses lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- ARGV[1] limit    how many waiting clients to list at most
--
-- Returns {count (0: open), waiting clients, then the inbox tags of at most limit of them};
--         a WRONGTYPE error when a key holds a foreign value.
local hold, queue, limit = KEYS[1], KEYS[2], tonumber(ARGV[1])
local current = redis.call('GET', hold)
local count = current and fl_latch_count(hold, current) or 0
local reply = {count, redis.call('SCARD', queue)}
for _, inbox in ipairs(redis.call('SRANDMEMBER', queue, limit)) do
  reply[#reply + 1] = inbox
end
return reply
