-- rw_force_unlock.lua: free a read-write lock of all its holds (administrative).
-- Uses lib/queue.lua, lib/notify.lua and lib/rw.lua. The fencing counter is left alone.
--
-- KEYS[1] hold, KEYS[2] readers (see lib/rw.lua)
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- KEYS[6] queue, KEYS[7] alive (see lib/queue.lua)
-- ARGV[1..5]       unused (this script has no call arguments)
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
--
-- When a hold was removed and waiters are queued, emits one event like rw_release.lua: `name`
-- for a writer at the head, `chain` with the admitted readers for a reader (fl_rw_next).
-- Returns {1} when any hold was removed, {0} when the lock was free.
local hold, readers, events, seq = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local queue, alive = KEYS[6], KEYS[7]
local mode, maxlen, lock_id = ARGV[6], ARGV[7], ARGV[8]
-- Reads first (lib/rw.lua): HGET and ZCARD are typed reads, and DEL (which takes any type)
-- comes after them. The queue and the shard's keys are read, and written, only when a hold
-- is removed.
redis.call('HGET', hold, 'w')
redis.call('ZCARD', readers)
if redis.call('EXISTS', hold, readers) == 0 then
  return {0}
end
local dead, plan = fl_rw_next(queue, alive, fl_now(), 0, events, seq, mode)
redis.call('DEL', hold, readers)
fl_drop(queue, alive, #dead, dead)
if plan then
  fl_rw_announce(plan, events, seq, mode, maxlen, lock_id)
end
return {1}
