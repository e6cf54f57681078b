-- fair_acquire.lua: take or re-enter a fair (FIFO) reentrant lock, or join its queue.
-- Uses lib/hold.lua, lib/queue.lua and lib/notify.lua.
--
-- The lock goes to the first live waiter of the queue; a newcomer gets it only when it is free
-- and nobody is queued. Dead waiters met at the head are evicted, and if that leaves a free lock
-- with a live head, the head is told by a `name` event.
--
-- KEYS[1] hold     hold hash (see lib/hold.lua)
-- KEYS[2] fence    fencing counter; never expires, never reset
-- KEYS[3] queue    LIST of waiter ids (see lib/queue.lua)
-- KEYS[4] alive    ZSET waiter id -> lease end (server ms)
-- KEYS[5] events   the shard's stream or channel
-- KEYS[6] seq      the shard's event counter
-- ARGV[1] owner id
-- ARGV[2] lease in ms (> 0)
-- ARGV[3] op id, unique per call; a retried call with the same op id is answered, not re-applied
-- ARGV[4] waiter id of this acquisition
-- ARGV[5] waiter lease in ms; 0 for a try that must not join the queue
-- ARGV[6] notification mode, ARGV[7] stream max length, ARGV[8] lock id (see lib/notify.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered,
--         {0, ms to wait at most before trying again} otherwise.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'string')
fl_expect(KEYS[3], 'list')
fl_expect(KEYS[4], 'zset')
fl_expect_events(KEYS[5], KEYS[6], ARGV[6])
local hold, fence, queue, alive = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, lease, op, id, waiter_lease = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5])

local current = redis.call('HGET', hold, 'o')
if current == owner then
  return fl_reenter(hold, owner, op, lease)
end

local now = fl_now()
local head, evicted = fl_head(queue, alive, now)
if not current and (not head or head == id) then
  if head then
    fl_dequeue(queue, alive, id)
  end
  return fl_take(hold, fence, owner, op, lease)
end
if evicted > 0 and not current and head then
  fl_emit(KEYS[5], KEYS[6], ARGV[6], ARGV[7], ARGV[8], 'name', head)
end

if waiter_lease > 0 then
  fl_enqueue(queue, alive, id, now, waiter_lease)
end

-- Wait at most until the holder's lease ends, or (free but reserved) the head's waiter lease.
local wait
if current then
  wait = redis.call('PTTL', hold)
else
  wait = tonumber(redis.call('ZSCORE', alive, head)) - now
end
if wait < 1 then
  wait = 1
end
return {0, wait}
