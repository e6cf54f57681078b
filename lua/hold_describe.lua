-- hold_describe.lua: read an exclusive lock's holder and its wait queue without changing them
-- (one atomic snapshot, for inspection: src/lock/inspect.rs). Uses lib/fence.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    its wait queue, a sorted set (see lib/hold.lua)
-- ARGV[1] limit    how many waiters to list at most, from the head of the queue
--
-- Returns {holder's owner id ("" when free), hold count, fencing token (of the hold, or while
--          free of the last one; "" when the lock has no hash), ms until the hold's lease ends
--          (-2 when free), waiters queued, then per listed waiter, head first: its queue member
--          "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>", ms it has waited};
--         a WRONGTYPE error when a key holds a foreign value (typed reads).
local hold, queue, limit = KEYS[1], KEYS[2], tonumber(ARGV[1])
local fields = redis.call('HMGET', hold, 'o', 'c', 'f')
local members = redis.call('ZRANGE', queue, 0, limit - 1, 'WITHSCORES')
local queued = redis.call('ZCARD', queue)
local owner = fields[1] or ''
local ttl = -2
if owner ~= '' then
  ttl = redis.call('PTTL', hold)
end
local reply = {owner, owner ~= '' and (tonumber(fields[2]) or 0) or 0, fields[3] or '', ttl,
  queued}
local now_us = fl_now_us()
for i = 1, #members, 2 do
  reply[#reply + 1] = members[i]
  reply[#reply + 1] = math.max(math.floor((now_us - tonumber(members[i + 1])) / 1000), 0)
end
return reply
