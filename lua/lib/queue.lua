-- queue.lua: library prelude for locks that queue their waiters in Redis (fair lock),
-- prepended by src/scripts.rs. Not a script of its own.
--
-- A queue is a LIST of waiter ids in enqueue order (the acquisition order), a ZSET `alive`
-- mapping each waiter id to the server time (ms) when its waiter lease ends, and (fair lock
-- only) a HASH `bids` mapping each waiter id to what it asks for (see fl_bid in lib/fair.lua), so
-- that a release can hand the lock to the head directly (lib/fair.lua). Waiters' clients push
-- the lease forward with batched heartbeats; a waiter whose lease has passed is dead and is
-- evicted when it reaches the head. The read-write lock never records bids (its scripts, and
-- the shared queue scripts for a lock of kind "rw", pass nil). Every operation here is O(1) or
-- O(log n) except fl_leave (LREM, only on timeout or cancellation). Where these functions
-- write the bids hash, they write it first: a script that has read the queue and the alive set
-- (typed reads) needs no separate type check of the bids, since a foreign value there refuses
-- the bids write before anything else is changed. The fair lock never walks
-- the queue; the read-write lock's reader check (rw_acquire.lua) scans it up to the reader's
-- own place.
--
-- fl_now()                                   -> the server clock in ms (TIME)
-- fl_head(queue, alive, now, bids)           -> id of the first live waiter or false, how
--                                               many dead waiters were evicted before it, and
--                                               when its waiter lease ends (server ms)
-- fl_keep(queue, alive, lease, bids)         -> keeps the queue keys for one to two waiter
--                                               leases
-- fl_enqueue(queue, alive, id, now, lease, bids, bid)
--                                            -> appends id unless queued, refreshes its lease,
--                                               records its bid (when bids and bid are given)
-- fl_dequeue(queue, alive, id, bids)         -> removes the head id (it got the lock)
-- fl_leave(queue, alive, id, bids)           -> removes id wherever it is; true if it was head
local function fl_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fl_head(queue, alive, now, bids)
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
    if bids then
      redis.call('HDEL', bids, head)
    end
    redis.call('LPOP', queue)
    redis.call('ZREM', alive, head)
    evicted = evicted + 1
  end
end

local function fl_keep(queue, alive, lease, bids)
  local keep = lease * 2
  -- Pushed forward to two leases once less than one is left: not on every call.
  if redis.call('PTTL', queue) < lease then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', alive, keep)
    if bids then
      redis.call('PEXPIRE', bids, keep)
    end
  end
end

local function fl_enqueue(queue, alive, id, now, lease, bids, bid)
  if not redis.call('ZSCORE', alive, id) then
    if bids and bid then
      redis.call('HSET', bids, id, bid)
    end
    redis.call('RPUSH', queue, id)
  end
  redis.call('ZADD', alive, now + lease, id)
  fl_keep(queue, alive, lease, bids)
end

local function fl_dequeue(queue, alive, id, bids)
  if bids then
    redis.call('HDEL', bids, id)
  end
  redis.call('LPOP', queue)
  redis.call('ZREM', alive, id)
end

local function fl_leave(queue, alive, id, bids)
  local was_head = redis.call('LINDEX', queue, 0) == id
  redis.call('LREM', queue, 1, id)
  redis.call('ZREM', alive, id)
  if bids then
    redis.call('HDEL', bids, id)
  end
  return was_head
end
