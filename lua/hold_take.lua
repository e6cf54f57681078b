-- hold_take.lua: the fast path of an exclusive lock's take (barging or fair): a lock that is
-- free with its tombstone in place (lib/hold.lua), and nothing else. The client calls it first
-- when it has seen no contention on the lock lately (src/engine/contention.rs), and
-- hold_acquire.lua when this call does not apply: a lock that is held (by another owner, or by
-- the caller's: a re-entry), or that has no hash (a first take, which draws its token from the
-- shard's fence key; or a hash that expired, whose queue may have outlived it). A release
-- leaves the tombstone only with nobody queued, so this take needs neither the queue nor the
-- fence key: it reads four fields, and writes what hold_acquire.lua's take writes over a
-- tombstone (the fields a tombstone has cleared already stay as they are).
-- Uses lib/fence.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   unused (hold_acquire.lua's, passed as the client passes it)
-- ARGV[5] waiter-lease  unused
-- ARGV[6] notice   the caller's inbox tag when it asks to hear of the first waiter queued
--                  behind the hold (field i: hold_acquire.lua, ARGV[10]), else ""
--
-- Returns {1, fencing token, hold count} when acquired (also to a retry of the call that took
--           it, while its hold lasts),
--         {-2} when the lock is held (nothing changed): hold_acquire.lua's turn, on a
--           contended lock,
--         {-3} when the lock has no hash (nothing changed): hold_acquire.lua's turn,
--         a WRONGTYPE error (and no change) when the hold key holds a foreign value.
local hold = KEYS[1]
local owner, lease, op, notice = ARGV[1], ARGV[2], ARGV[3], ARGV[6]

local fields = redis.call('HMGET', hold, 'o', 'c', 'f', 'r')
if not fields[3] then
  return {-3}
end
if fields[1] ~= '' then
  if fields[1] == owner and fields[4] == op then
    return {1, fields[3], tonumber(fields[2])}
  end
  return {-2}
end
local token = fl_next_token(fields[3])
redis.call('HSET', hold, 'o', owner, 'c', '1', 'f', token, 'l', lease, 'r', op, 'i', notice)
redis.call('PEXPIRE', hold, lease)
return {1, token, 1}
