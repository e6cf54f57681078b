-- fair_force_unlock.lua: free a fair lock whoever holds it (administrative); grant it to the
-- head. Uses lib/hold.lua, lib/fence.lua, lib/queue.lua, lib/notify.lua and lib/fair.lua. The
-- shard's fence key is left alone (the grant takes its next token).
--
-- KEYS[1] hold, KEYS[2] bids, KEYS[3] fence, KEYS[4] events, KEYS[5] seq, KEYS[6] queue,
-- KEYS[7] alive (see fair_release.lua)
-- ARGV[1..5]       unused (this script has no call arguments)
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] fence    the fence argument (lib/fence.lua)
--
-- Returns {1} when a hold was removed, {0} when the lock was free.
local hold, bids, fence, events, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queue, alive = KEYS[6], KEYS[7]
local mode, maxlen, lock_id, fence_arg = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
fl_expect(hold, 'hash')
fl_expect(queue, 'list')
fl_expect(alive, 'zset')
fl_expect(bids, 'hash')
fl_expect_events(events, seq, mode)
local last = fl_fence_read(fence, fence_arg)
if not redis.call('HGET', hold, 'o') then
  return {0}
end
local next_token = last and function()
  return fl_fence_next(fence, fence_arg, last)
end
redis.call('DEL', hold)
fl_grant_head(hold, next_token, queue, alive, bids, fl_now(), events, seq, mode, maxlen, lock_id)
return {1}
