-- mutex_force_unlock.lua: free an exclusive lock whoever holds it (administrative).
-- The fencing counter is left alone, so tokens keep increasing after a forced unlock.
--
-- KEYS[1] hold, KEYS[2] waiters, KEYS[3] events, KEYS[4] seq (see mutex_release.lua)
-- ARGV[1] notification mode, ARGV[2] stream max length, ARGV[3] lock id (see notify.lua)
--
-- Returns {1} when a hold was removed, {0} when the lock was free.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'string')
fl_expect_events(KEYS[3], KEYS[4], ARGV[1])
local hold, waiters = KEYS[1], KEYS[2]
if not redis.call('HGET', hold, 'o') then
  return {0}
end
redis.call('DEL', hold)
if redis.call('DEL', waiters) == 1 then
  fl_emit(KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], 'one', '')
end
return {1}
