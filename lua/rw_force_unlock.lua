-- rw_force_unlock.lua: free a read-write lock of all its holds (administrative).
-- Uses lib/queue.lua, lib/notify.lua and lib/rw.lua. The fencing counter is left alone.
--
-- KEYS[1] hold H, KEYS[2] readers R, KEYS[3] queue, KEYS[4] events, KEYS[5] seq, KEYS[6] alive
-- ARGV[1] notification mode, ARGV[2] stream max length, ARGV[3] lock id (see lib/notify.lua)
--
-- When a hold was removed and waiters are queued, emits one event like rw_release.lua: `name`
-- for a writer at the head, `chain` with the admitted readers for a reader (fl_rw_wake).
-- Returns {1} when any hold was removed, {0} when the lock was free.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'zset')
fl_expect(KEYS[3], 'list')
fl_expect_events(KEYS[4], KEYS[5], ARGV[1])
fl_expect(KEYS[6], 'zset')
local removed = redis.call('DEL', KEYS[1], KEYS[2])
if removed > 0 then
  fl_rw_wake(KEYS[3], KEYS[6], fl_now(), KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3])
end
if removed > 0 then
  return {1}
end
return {0}
