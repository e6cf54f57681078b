-- latch_wait.lua: a waiter's look at a count-down latch; while it is closed, its client joins
-- the set of the clients to wake when it opens (lib/latch.lua).
-- Uses lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- ARGV[1] inbox    the caller's client's inbox tag; "" for a look that only reads the count
--
-- Returns {0} when the latch is open (no count: never set, counted down, or deleted),
--         {count} while it is closed (the client's inbox tag, if given, is in the set then),
--         a WRONGTYPE error (and no change) when a key holds a foreign value.
local hold, queue = KEYS[1], KEYS[2]
local inbox = ARGV[1]

local current = redis.call('GET', hold)
if not current then
  return {0}
end
local count = fl_latch_count(hold, current)
if inbox ~= '' then
  redis.call('SADD', queue, inbox)
end
return {count}
