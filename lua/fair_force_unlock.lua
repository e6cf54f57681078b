-- fair_force_unlock.lua: free a fair lock whoever holds it (administrative) and wake the head.
-- Uses lib/queue.lua and lib/notify.lua. The fencing counter is left alone.
--
-- KEYS[1] hold, KEYS[2] queue, KEYS[3] alive, KEYS[4] events, KEYS[5] seq (see fair_release.lua)
-- ARGV[1] notification mode, ARGV[2] stream max length, ARGV[3] lock id (see lib/notify.lua)
--
-- Returns {1} when a hold was removed, {0} when the lock was free.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'list')
fl_expect(KEYS[3], 'zset')
fl_expect_events(KEYS[4], KEYS[5], ARGV[1])
if not redis.call('HGET', KEYS[1], 'o') then
  return {0}
end
redis.call('DEL', KEYS[1])
local head = fl_head(KEYS[2], KEYS[3], fl_now())
if head then
  fl_emit(KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], 'name', head)
end
return {1}
