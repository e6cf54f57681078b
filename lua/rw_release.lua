-- rw_release.lua: give back one read or write hold (or all of them) of a read-write lock.
-- Uses lib/queue.lua, lib/rw.lua and lib/notify.lua.
--
-- Freeing the write hold (a write unlock or the write half of a downgrade) and freeing the
-- last read hold each emit ONE event when waiters are queued (see fl_rw_wake in lib/rw.lua):
-- a writer at the head of the queue is woken by name; a reader at the head makes a `chain`
-- event that names every live reader up to the first live writer (the readers that may go now;
-- '*' for every reader when there are more than one event names).
--
-- KEYS[1] hold, KEYS[2] readers (see lib/rw.lua)
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- KEYS[6] queue, KEYS[7] alive (see lib/queue.lua)
-- KEYS[8] done     ZSET of final releases (see lib/rw.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of this side of the owner at once, "0" to release
--                  one
-- ARGV[5] window   retry window in ms
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] side     "read" or "write"
--
-- Returns {1, holds of this side left} when released, {0, 0} when not held (expired),
--         {-1, 0} when held under another token (a newer hold of this owner).
local hold, readers, events, seq = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local queue, alive, done = KEYS[6], KEYS[7], KEYS[8]
local owner, token, op, all, tomb = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode, maxlen, lock_id, side = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
fl_expect(hold, 'hash')
fl_expect(readers, 'zset')
fl_expect(done, 'zset')
fl_expect(queue, 'list')
fl_expect(alive, 'zset')
fl_expect_events(events, seq, mode)
local now = fl_now()

if redis.call('ZSCORE', done, op) then
  return {1, 0}
end
local writer = fl_rw_purge(hold, readers, now)
if redis.call('HGET', hold, 'op:' .. owner) == op then
  local field = side == 'write' and 'wc' or ('rc:' .. owner)
  return {1, tonumber(redis.call('HGET', hold, field) or 0)}
end

local left, freed
if side == 'write' then
  if writer ~= owner then
    return {0, 0}
  end
  if redis.call('HGET', hold, 'wf') ~= token then
    return {-1, 0}
  end
  left = tonumber(redis.call('HGET', hold, 'wc')) - 1
  if all == '1' or left <= 0 then
    left = 0
    redis.call('HDEL', hold, 'w', 'wc', 'wf', 'we')
    freed = true
  else
    redis.call('HSET', hold, 'wc', left)
  end
else
  local count = redis.call('HGET', hold, 'rc:' .. owner)
  if not count then
    return {0, 0}
  end
  if redis.call('HGET', hold, 'rt:' .. owner) ~= token then
    return {-1, 0}
  end
  left = tonumber(count) - 1
  if all == '1' or left <= 0 then
    left = 0
    redis.call('HDEL', hold, 'rc:' .. owner, 'rt:' .. owner)
    redis.call('ZREM', readers, owner)
    freed = redis.call('ZCARD', readers) == 0 and not redis.call('HGET', hold, 'w')
  else
    redis.call('HSET', hold, 'rc:' .. owner, left)
  end
end

fl_rw_done(hold, done, owner, op, now, tomb)
fl_rw_keep(hold, readers, now, tomb)
if freed then
  fl_rw_wake(queue, alive, now, events, seq, mode, maxlen, lock_id)
end
return {1, left}
