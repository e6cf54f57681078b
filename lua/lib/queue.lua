-- queue.lua: library prelude for the read-write lock's wait queue in Redis, prepended by
-- src/scripts.rs. Not a script of its own.
--
-- A queue is a LIST of waiter ids in enqueue order (the acquisition order) and a ZSET `alive`
-- mapping each waiter id to the server time (ms) when its waiter lease ends. Waiters' clients
-- push the lease forward with batched heartbeats (queue_heartbeat.lua); a waiter whose lease
-- has passed is dead and is evicted when it reaches the head. Every operation here is O(1) or
-- O(log n) per waiter it looks at; the reader check (rw_acquire.lua) scans the queue up to the
-- reader's own place.
--
-- Each function either only reads or only writes: a script first looks (fl_peek: LRANGE and
-- ZSCORE, typed reads that fail with WRONGTYPE on a foreign value), and writes (fl_drop,
-- fl_enqueue) only once every key it touches has been read (lib/check.lua).
--
-- fl_now()                             -> the server clock in ms, and in us (one TIME)
-- fl_peek(queue, alive, now, from, live) -> the first live waiter id at or after queue position
--                                         `from` (0: the head) or false, and the list of the
--                                         dead waiter ids before it (waiter lease passed or
--                                         missing). Reads only. `live` (or nil) is a set of ids
--                                         that count as live whatever their score (waiters the
--                                         script refreshes before it looks)
-- fl_drop(queue, alive, count, ids)    -> removes the first `count` queue entries, and `ids`
--                                         from alive: the dead waiters fl_peek found, and a
--                                         head that got the lock or left
-- fl_keep(queue, alive, lease)         -> keeps the queue keys for one to two waiter leases
-- fl_enqueue(queue, alive, id, now, lease, queued) -> appends id unless `queued` (id's score in
--                                         alive, read before; false when it is not queued),
--                                         refreshes its lease
local function fl_now()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

local function fl_peek(queue, alive, now, from, live)
  local dead = {}
  -- The head alone first: it is almost always live.
  local at, size = from, 1
  while true do
    local batch = redis.call('LRANGE', queue, at, at + size - 1)
    for _, id in ipairs(batch) do
      if live and live[id] then
        return id, dead
      end
      local expiry = redis.call('ZSCORE', alive, id)
      if expiry and tonumber(expiry) > now then
        return id, dead
      end
      dead[#dead + 1] = id
    end
    if #batch < size then
      return false, dead
    end
    at, size = at + size, 64
  end
end

local function fl_drop(queue, alive, count, ids)
  -- LPOP one by one (LTRIM would do it at once, but is no command of the documented ACL;
  -- tests/acl.rs): there is rarely more than the head to drop.
  for _ = 1, count do
    redis.call('LPOP', queue)
  end
  -- At most 64 members per ZREM: unpack stays far below Lua's stack limit.
  for first = 1, #ids, 64 do
    redis.call('ZREM', alive, unpack(ids, first, math.min(first + 63, #ids)))
  end
end

local function fl_keep(queue, alive, lease)
  local keep = lease * 2
  if redis.call('PTTL', queue) < lease then
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', alive, keep)
  end
end

local function fl_enqueue(queue, alive, id, now, lease, queued)
  if not queued then
    redis.call('RPUSH', queue, id)
  end
  redis.call('ZADD', alive, now + lease, id)
  fl_keep(queue, alive, lease)
end
