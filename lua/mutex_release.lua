-- mutex_release.lua: give back one hold (or all holds) of an exclusive reentrant lock.
--
-- KEYS[1] hold     hash {o, c, f, r} (see mutex_acquire.lua)
-- KEYS[2] waiters  marker; when present, freeing the lock deletes it and emits one event
-- KEYS[3] events   the shard's stream or channel
-- KEYS[4] seq      the shard's event counter
-- ARGV[1] owner id
-- ARGV[2] fencing token of the hold being released (a stale hold of the same owner is refused)
-- ARGV[3] op id, unique per call; a retried call with the same op id is answered, not re-applied
-- ARGV[4] "1" to release every hold of the owner at once, "0" to release one
-- ARGV[5] tombstone ttl in ms: after the last hold, the hash keeps only r for this long so a
--         retried release still answers "released"
-- ARGV[6] notification mode, ARGV[7] stream max length, ARGV[8] lock id (see notify.lua)
--
-- Returns {1, holds left} when released (0: the lock is free now),
--         {0, 0} when the lock is not held (expired or released),
--         {-1, 0} when another owner (or a newer hold of this owner) holds it.
local hold, waiters, events, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, token, op, all, tomb = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])

local fields = redis.call('HMGET', hold, 'o', 'c', 'f', 'r')
local current, count, held_token, last_op = fields[1], tonumber(fields[2]), fields[3], fields[4]

if last_op == op then
  return {1, count or 0}
end
if not current then
  return {0, 0}
end
if current ~= owner or held_token ~= token then
  return {-1, 0}
end

if all ~= '1' and count > 1 then
  redis.call('HSET', hold, 'c', count - 1, 'r', op)
  return {1, count - 1}
end

redis.call('DEL', hold)
redis.call('HSET', hold, 'r', op)
redis.call('PEXPIRE', hold, tomb)
if redis.call('DEL', waiters) == 1 then
  -- Waiters that lose the race set the marker again on their next attempt.
  fl_emit(events, seq, ARGV[6], ARGV[7], ARGV[8], 'one', '')
end
return {1, 0}
