-- hold_describe.lua: read an exclusive lock's holder and its wait queue without changing them
-- (one atomic snapshot, for inspection: src/lock/inspect.rs). Uses lib/fence.lua and
-- lib/notify.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    its wait queue, a sorted set (see lib/hold.lua)
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..5]       unused (no call)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id (unused)   the event arguments
-- ARGV[9] limit    how many waiters to list at most, from the head of the queue
--
-- Returns {holder's owner id ("" when free), hold count, fencing token (of the hold, or while
--          free of the last one; "" when the lock has no hash), ms until the hold's lease ends
--          (-2 when free), waiters queued, then per listed waiter, head first: its queue member
--          "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>", ms it has waited,
--          whether its client listens (fl_listening: 1, 0, -1 unknown)};
--         a WRONGTYPE error when a key holds a foreign value (typed reads).
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local mode, limit = ARGV[6], tonumber(ARGV[9])
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
  local inbox = string.match(members[i], '^%S+ (%S+)')
  reply[#reply + 1] = members[i]
  reply[#reply + 1] = math.max(math.floor((now_us - tonumber(members[i + 1])) / 1000), 0)
  reply[#reply + 1] = inbox and fl_listening(events .. ':to:' .. inbox, mode) or 0
end
return reply
