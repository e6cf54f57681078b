-- fair_leave.lua: a waiter gives up (timeout or cancellation) and leaves the queue.
-- Shared by the fair lock and the read-write lock. Uses lib/queue.lua, lib/notify.lua and
-- lib/rw.lua.
--
-- KEYS[1] hold     the fair lock's hold hash, or the read-write lock's hash H
-- KEYS[2] queue, KEYS[3] alive, KEYS[4] events, KEYS[5] seq (see fair_release.lua)
-- KEYS[6] bids     the fair lock's bids (see lib/fair.lua); never written for a read-write lock
-- ARGV[1] waiter id
-- ARGV[2] notification mode, ARGV[3] stream max length, ARGV[4] lock id (see lib/notify.lua)
--
-- A fair lock that a release had already granted to this waiter (field r = its waiter id, see
-- lib/fair.lua) is freed: the waiter never took the hold up. If the leaving waiter was the head
-- of a free lock (no owner `o`, no writer `w`; readers may hold a read-write lock), or had been
-- granted it, the turn passes on at once, without waiting for any lease: one `name` event for
-- the next live waiter, or for a read-write lock whose next live waiter is a reader, one
-- `chain` event naming the readers that may go now (fl_wake_head in lib/rw.lua).
-- Returns {1} when the waiter was queued (or granted the lock), {0} when it was not.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'list')
fl_expect(KEYS[3], 'zset')
fl_expect(KEYS[6], 'hash')
fl_expect_events(KEYS[4], KEYS[5], ARGV[2])
local hold, id = KEYS[1], ARGV[1]
local granted = redis.call('HMGET', hold, 'o', 'r', 'x')
local was_queued = redis.call('ZSCORE', KEYS[3], id) ~= false
local was_head = fl_leave(KEYS[2], KEYS[3], id, KEYS[6])
if granted[1] and granted[2] == id then
  -- Keep the ids of the release that granted it and of those before (x, see lib/hold.lua) as
  -- a tombstone, so that their retries are still answered.
  local ttl = redis.call('PTTL', hold)
  redis.call('DEL', hold)
  if granted[3] and ttl > 0 then
    redis.call('HSET', hold, 'x', granted[3])
    redis.call('PEXPIRE', hold, ttl)
  end
  was_queued, was_head = true, true
end
if was_head and not redis.call('HGET', hold, 'o') and not redis.call('HGET', hold, 'w') then
  local now = fl_now()
  local head = fl_head(KEYS[2], KEYS[3], now, KEYS[6])
  if head then
    fl_wake_head(KEYS[2], KEYS[3], head, now, KEYS[4], KEYS[5], ARGV[2], ARGV[3], ARGV[4])
  end
end
if was_queued then
  return {1}
end
return {0}
