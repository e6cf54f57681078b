-- rw_release.lua: give back one read or write hold (or all of them) of a read-write lock.
-- Uses lib/queue.lua, lib/rw.lua and lib/notify.lua.
--
-- Freeing the write hold (a write unlock or the write half of a downgrade) and freeing the
-- last read hold each emit ONE event when waiters are queued (see fl_rw_wake in lib/rw.lua):
-- a writer at the head of the queue is woken by name; a reader at the head makes a `chain`
-- event that names every live reader up to the first live writer (the readers that may go now;
-- '*' for every reader when there are more than one event names).
--
-- KEYS[1] hold H, KEYS[2] readers R, KEYS[3] done D (see lib/rw.lua)
-- KEYS[4] queue, KEYS[5] alive (see lib/queue.lua)
-- KEYS[6] events, KEYS[7] seq (the shard's)
-- ARGV[1] owner id
-- ARGV[2] fencing token of the hold being released
-- ARGV[3] op id, unique per call; a retried call with the same op id is answered, not re-applied
-- ARGV[4] "1" to release every hold of this kind of the owner at once, "0" to release one
-- ARGV[5] retry window in ms
-- ARGV[6] notification mode, ARGV[7] stream max length, ARGV[8] lock id (see lib/notify.lua)
-- ARGV[9] "read" or "write"
--
-- Returns {1, holds of this kind left} when released, {0, 0} when not held (expired),
--         {-1, 0} when held under another token (a newer hold of this owner).
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'zset')
fl_expect(KEYS[3], 'zset')
fl_expect(KEYS[4], 'list')
fl_expect(KEYS[5], 'zset')
fl_expect_events(KEYS[6], KEYS[7], ARGV[6])
local H, R, D, Q, A = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, token, op, all, tomb = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode = ARGV[9]
local now = fl_now()

if redis.call('ZSCORE', D, op) then
  return {1, 0}
end
local writer = fl_rw_purge(H, R, now)
if redis.call('HGET', H, 'op:' .. owner) == op then
  local field = mode == 'write' and 'wc' or ('rc:' .. owner)
  return {1, tonumber(redis.call('HGET', H, field) or 0)}
end

local left, freed
if mode == 'write' then
  if writer ~= owner then
    return {0, 0}
  end
  if redis.call('HGET', H, 'wf') ~= token then
    return {-1, 0}
  end
  left = tonumber(redis.call('HGET', H, 'wc')) - 1
  if all == '1' or left <= 0 then
    left = 0
    redis.call('HDEL', H, 'w', 'wc', 'wf', 'we')
    freed = true
  else
    redis.call('HSET', H, 'wc', left)
  end
else
  local count = redis.call('HGET', H, 'rc:' .. owner)
  if not count then
    return {0, 0}
  end
  if redis.call('HGET', H, 'rt:' .. owner) ~= token then
    return {-1, 0}
  end
  left = tonumber(count) - 1
  if all == '1' or left <= 0 then
    left = 0
    redis.call('HDEL', H, 'rc:' .. owner, 'rt:' .. owner)
    redis.call('ZREM', R, owner)
    freed = redis.call('ZCARD', R) == 0 and not redis.call('HGET', H, 'w')
  else
    redis.call('HSET', H, 'rc:' .. owner, left)
  end
end

fl_rw_done(H, D, owner, op, now, tomb)
fl_rw_keep(H, R, now, tomb)
if freed then
  fl_rw_wake(Q, A, now, KEYS[6], KEYS[7], ARGV[6], ARGV[7], ARGV[8])
end
return {1, left}
