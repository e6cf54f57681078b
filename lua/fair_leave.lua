-- fair_leave.lua: a waiter gives up (timeout or cancellation) and leaves the queue.
-- Uses lib/queue.lua and lib/notify.lua.
--
-- KEYS[1] hold, KEYS[2] queue, KEYS[3] alive, KEYS[4] events, KEYS[5] seq (see fair_release.lua)
-- ARGV[1] waiter id
-- ARGV[2] notification mode, ARGV[3] stream max length, ARGV[4] lock id (see lib/notify.lua)
--
-- If the leaving waiter was the head of a free lock, the turn passes to the next live waiter at
-- once (one `name` event), without waiting for any lease.
-- Returns {1} when the waiter was queued, {0} when it was not.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'list')
fl_expect(KEYS[3], 'zset')
fl_expect_events(KEYS[4], KEYS[5], ARGV[2])
local was_queued = redis.call('ZSCORE', KEYS[3], ARGV[1]) ~= false
local was_head = fl_leave(KEYS[2], KEYS[3], ARGV[1])
if was_head and not redis.call('HGET', KEYS[1], 'o') then
  local head = fl_head(KEYS[2], KEYS[3], fl_now())
  if head then
    fl_emit(KEYS[4], KEYS[5], ARGV[2], ARGV[3], ARGV[4], 'name', head)
  end
end
if was_queued then
  return {1}
end
return {0}
