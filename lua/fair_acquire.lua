-- fair_acquire.lua: take or re-enter a fair (FIFO) reentrant lock, or join its queue.
-- Uses lib/hold.lua, lib/fence.lua, lib/queue.lua, lib/notify.lua and lib/fair.lua.
--
-- The lock goes to the first live waiter of the queue; a newcomer gets it only when it is free
-- and nobody is queued. Usually a release grants the lock to the head directly (lib/fair.lua);
-- this script takes it for the head only when the lock was left free (force unlock, a waiter
-- that left, a lease that ran out). Dead waiters met at the head are evicted, and if that
-- leaves a free lock with a live head, the head is told by a `name` event.
--
-- KEYS[1] hold     hold hash (see lib/hold.lua)
-- KEYS[2] bids     HASH waiter id -> "<lease ms>|<inbox tag>|<owner id>" (see lib/fair.lua)
-- KEYS[3] fence    the shard's fence key (see lib/fence.lua)
-- KEYS[4] events   the shard's stream or channel
-- KEYS[5] seq      the shard's event counter
-- KEYS[6] queue    LIST of waiter ids (see lib/queue.lua)
-- KEYS[7] alive    ZSET waiter id -> lease end (server ms)
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   waiter id of this acquisition (unique per acquisition)
-- ARGV[5] waiter-lease  waiter lease in ms; 0 for a try that must not join the queue
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] inbox    the inbox tag of this acquisition's client: a grant is sent to that client
--                  alone (lib/fair.lua); "": to the shard's events key
-- ARGV[10] fence   the fence argument "<0|1><layout>" (see lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered,
--         {1, fencing token, hold count, remaining ms} when a release had already granted the
--           lock to this acquisition (the hold lasts only that long until it is renewed),
--         {0, ms to wait at most before trying again, server time in ms} otherwise,
--         a FLFENCE error (and no change) when the lock is free and the fence key is missing
--         or carries another layout (lib/fence.lua).
--
-- Every key is type-checked before the script's first write, where it is first needed: the
-- hold by HMGET, the queue by LINDEX and the alive set by ZSCORE (typed reads that come before
-- any write), the bids by the first write itself (lib/queue.lua writes them before the queue
-- and the alive set), the fence (by GET, a typed read) and the event keys only when the lock
-- is free (only then may it take the lock or emit).
local hold, bids, fence, events, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queue, alive = KEYS[6], KEYS[7]
local owner, lease, op, id = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local waiter_lease, mode, maxlen, lock_id = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
local inbox, fence_arg = ARGV[9], ARGV[10]

local fields = redis.call('HMGET', hold, 'o', 'r', 'f', 'c')
local current = fields[1]
local last
if not current then
  local refusal
  last, refusal = fl_fence_read(fence, fence_arg)
  if not last then
    return redis.error_reply(refusal)
  end
  fl_expect_events(events, seq, mode)
end
if current and fields[2] == id then
  return {1, tonumber(fields[3]), tonumber(fields[4]), redis.call('PTTL', hold)}
end
if current == owner then
  return fl_reenter(hold, owner, op, lease)
end

local now = fl_now()
local head, evicted = fl_head(queue, alive, now, bids)
if not current and (not head or head == id) then
  if head then
    fl_dequeue(queue, alive, id, bids)
  end
  return fl_take(hold, fl_fence_next(fence, fence_arg, last), owner, op, lease)
end
if evicted > 0 and not current and head then
  fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
end

if waiter_lease > 0 then
  fl_enqueue(queue, alive, id, now, waiter_lease, bids, fl_bid(lease, inbox, owner))
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
return {0, wait, now}
