-- hold_free.lua: the fast path of an exclusive lock's release: a hold with nobody queued
-- behind it, counted down by one level or, at its last level (or with all), freed to the
-- tombstone (lib/hold.lua). The client calls it first when it has seen no contention on the
-- lock lately (src/engine/contention.rs), and hold_release.lua when this call does not apply:
-- waiters queued (the release grants the lock to the first of them), another owner or a
-- newer hold, a lock no longer held, or a release that hands the lock over within the
-- process (which this script never does). It writes what hold_release.lua writes in these
-- cases, and answers a retry as it does while the hold's op id is the lock's last.
-- Uses lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of the owner at once, "0" to release one
-- ARGV[5] window   tombstone ttl in ms (see lib/hold.lua)
--
-- Returns {1, holds left} when released (0: freed; also to a retry of the call that did, while
--           its op id is the lock's last),
--         {-2} when waiters are queued (nothing changed): hold_release.lua's turn, on a
--           contended lock,
--         {-3} when the lock is not held by this owner with this token (nothing changed):
--           hold_release.lua's turn, which tells why,
--         a WRONGTYPE error (and no change) when the hold key holds a foreign value.
local hold = KEYS[1]
local owner, token, op, all, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local fields = fl_hold_read(hold)
if fields[5] == op then
  return {1, tonumber(fields[2]) or 0}
end
local count = tonumber(fields[2])
if fields[1] ~= owner or fields[3] ~= token then
  return {-3}
end
if fl_queue_count(fields) > 0 then
  return {-2}
end
if all ~= '1' and count > 1 then
  redis.call('HSET', hold, 'c', string.format('%d', count - 1), 'r', op)
  return {1, count - 1}
end
fl_free(hold, op, fl_freed_chain(op, fields[6]), window, nil, fields)
return {1, 0}
