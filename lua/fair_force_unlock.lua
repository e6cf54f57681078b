-- fair_force_unlock.lua: free a fair lock whoever holds it (administrative); grant it to the
-- head. Uses lib/hold.lua, lib/fence.lua, lib/queue.lua, lib/notify.lua and lib/fair.lua. The
-- shard's fence key is left alone (the grant takes its next token).
--
-- KEYS[1] hold, KEYS[2] queue, KEYS[3] alive, KEYS[4] events, KEYS[5] seq, KEYS[6] bids,
-- KEYS[7] fence (see fair_release.lua)
-- ARGV[1] notification mode, ARGV[2] stream max length, ARGV[3] lock id (see lib/notify.lua)
-- ARGV[4] the fence argument (lib/fence.lua)
--
-- Returns {1} when a hold was removed, {0} when the lock was free.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'list')
fl_expect(KEYS[3], 'zset')
fl_expect(KEYS[6], 'hash')
fl_expect_events(KEYS[4], KEYS[5], ARGV[1])
local last = fl_fence_read(KEYS[7], ARGV[4])
if not redis.call('HGET', KEYS[1], 'o') then
  return {0}
end
local next_token = last and function()
  return fl_fence_next(KEYS[7], ARGV[4], last)
end
redis.call('DEL', KEYS[1])
fl_grant_head(KEYS[1], next_token, KEYS[2], KEYS[3], KEYS[6], fl_now(),
  KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3])
return {1}
