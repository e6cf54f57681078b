-- mutex_force_unlock.lua: free an exclusive lock whoever holds it (administrative).
-- Uses lib/hold.lua and lib/notify.lua. The shard's fence key is left alone, so tokens keep
-- increasing after a forced unlock.
--
-- KEYS[1] hold, KEYS[2] marker (see mutex_release.lua)
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- ARGV[1..5]       unused (this script has no call arguments)
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
--
-- Returns {1} when a hold was removed, {0} when the lock was free.
local hold, marker, events, seq = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local mode, maxlen, lock_id = ARGV[6], ARGV[7], ARGV[8]
fl_expect(hold, 'hash')
fl_expect(marker, 'string')
fl_expect_events(events, seq, mode)
if not redis.call('HGET', hold, 'o') then
  return {0}
end
redis.call('DEL', hold)
if redis.call('DEL', marker) == 1 then
  fl_emit(events, seq, mode, maxlen, lock_id, 'one', '')
end
return {1}
