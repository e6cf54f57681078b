-- fair_leave.lua: a waiter gives up (timeout or cancellation) and leaves the queue.
-- Shared by the fair lock and the read-write lock. Uses lib/queue.lua, lib/notify.lua and
-- lib/rw.lua.
--
-- KEYS[1] hold     the fair lock's hold hash, or the read-write lock's hash H
-- KEYS[2] queue, KEYS[3] alive, KEYS[4] events, KEYS[5] seq (see fair_release.lua)
-- ARGV[1] waiter id
-- ARGV[2] notification mode, ARGV[3] stream max length, ARGV[4] lock id (see lib/notify.lua)
--
-- If the leaving waiter was the head of a free lock (no owner `o`, no writer `w`; readers may
-- hold a read-write lock), the turn passes on at once, without waiting for any lease: one
-- `name` event for the next live waiter, or for a read-write lock whose next live waiter is a
-- reader, one `chain` event naming the readers that may go now (fl_wake_head in lib/rw.lua).
-- Returns {1} when the waiter was queued, {0} when it was not.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'list')
fl_expect(KEYS[3], 'zset')
fl_expect_events(KEYS[4], KEYS[5], ARGV[2])
local was_queued = redis.call('ZSCORE', KEYS[3], ARGV[1]) ~= false
local was_head = fl_leave(KEYS[2], KEYS[3], ARGV[1])
if was_head and not redis.call('HGET', KEYS[1], 'o') and not redis.call('HGET', KEYS[1], 'w') then
  local now = fl_now()
  local head = fl_head(KEYS[2], KEYS[3], now)
  if head then
    fl_wake_head(KEYS[2], KEYS[3], head, now, KEYS[4], KEYS[5], ARGV[2], ARGV[3], ARGV[4])
  end
end
if was_queued then
  return {1}
end
return {0}
