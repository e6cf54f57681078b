-- queue_leave.lua: a waiter of a read-write lock gives up (timeout or cancellation) and leaves
-- the queue. Uses lib/queue.lua, lib/notify.lua and lib/rw.lua.
--
-- KEYS[1] hold     the read-write lock's hash
-- KEYS[2] readers  unused
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- KEYS[6] queue, KEYS[7] alive (see lib/queue.lua)
-- ARGV[1..3]       unused
-- ARGV[4] waiter   the waiter id that leaves
-- ARGV[5]          unused
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] kind     "rw" (checked)
--
-- If the leaving waiter was the head and no writer holds the lock (readers may), the turn
-- passes on at once, without waiting for any lease: one `name` event for the next live waiter
-- if it is a writer, or one `chain` event naming the readers that may go now
-- (fl_rw_plan in lib/rw.lua).
-- Returns {1} when the waiter was queued, {0} when it was not.
fl_queue_kind(ARGV[9])
local hold, events, seq, queue, alive = KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, mode, maxlen, lock_id = ARGV[4], ARGV[6], ARGV[7], ARGV[8]
-- Reads first (lib/rw.lua): ZSCORE and LRANGE are typed reads; the hash and the
-- shard's keys are read only when the turn passes on.
local lease_end = redis.call('ZSCORE', alive, id)
local was_head = redis.call('LRANGE', queue, 0, 0)[1] == id
local dead, plan = {}, false
if was_head and fl_queue_free(hold) then
  dead, plan = fl_rw_next(queue, alive, fl_now(), 1, events, seq, mode)
end
if was_head then
  -- It is the head: it goes with the dead waiters behind it.
  table.insert(dead, 1, id)
  fl_drop(queue, alive, #dead, dead)
else
  redis.call('LREM', queue, 1, id)
  if lease_end then
    redis.call('ZREM', alive, id)
  end
end
if plan then
  fl_rw_announce(plan, events, seq, mode, maxlen, lock_id)
end
if lease_end then
  return {1}
end
return {0}
