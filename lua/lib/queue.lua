-- queue.lua: library prelude for the read-write lock's wait queue in Redis, prepended by
-- src/scripts.rs. Not a script of its own.
--
-- A queue is a LIST of waiter ids in enqueue order (the acquisition order) and a ZSET `alive`
-- mapping each waiter id to the server time (ms) when its waiter lease ends. Waiters' clients
-- push the lease forward with batched heartbeats (queue_heartbeat.lua); a waiter whose lease
-- has passed is dead and is evicted when it reaches the head. Every operation here is O(1) or
-- O(log n) except fl_leave (LREM, only on timeout or cancellation); the reader check
-- (rw_acquire.lua) scans the queue up to the reader's own place.
--
-- fl_now()                             -> the server clock in ms (TIME)
-- fl_head(queue, alive, now)           -> id of the first live waiter or false, how many dead
--                                         waiters were evicted before it, and when its waiter
--                                         lease ends (server ms)
-- fl_keep(queue, alive, lease)         -> keeps the queue keys for one to two waiter leases
-- fl_enqueue(queue, alive, id, now, lease) -> appends id unless queued, refreshes its lease
-- fl_dequeue(queue, alive, id)         -> removes the head id (it got the lock)
-- fl_leave(queue, alive, id)           -> removes id wherever it is; true if it was head
local function fl_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fl_head(queue, alive, now)
  local evicted = 0
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return false, evicted
    end
    local expiry = redis.call('ZSCORE', alive, head)
    if expiry and tonumber(expiry) > now then
      return head, evicted, tonumber(expiry)
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', alive, head)
    evicted = evicted + 1
  end
end

local function fl_keep(queue, alive, lease)
  local keep = lease * 2
  if redis.call('PTTL', queue) < lease then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', alive, keep)
  end
end

local function fl_enqueue(queue, alive, id, now, lease)
  if not redis.call('ZSCORE', alive, id) then
    redis.call('RPUSH', queue, id)
  end
  redis.call('ZADD', alive, now + lease, id)
  fl_keep(queue, alive, lease)
end

local function fl_dequeue(queue, alive, id)
  redis.call('LPOP', queue)
  redis.call('ZREM', alive, id)
end

local function fl_leave(queue, alive, id)
  local was_head = redis.call('LINDEX', queue, 0) == id
  redis.call('LREM', queue, 1, id)
  redis.call('ZREM', alive, id)
  return was_head
end
