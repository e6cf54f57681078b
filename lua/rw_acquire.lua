-- rw_acquire.lua: take or re-enter a read or write hold of a read-write lock, or queue for it.
-- Uses lib/fence.lua, lib/queue.lua, lib/rw.lua and lib/notify.lua.
--
-- Writers: a write hold needs no live writer (except the owner itself: re-entry) and no reader,
-- and the writer must be first in the queue. An owner holding a read hold is refused at once
-- (no upgrade). Readers: a read hold needs no live writer (except the owner itself: downgrade)
-- and no live writer queued ahead of the reader, so once a writer waits, new readers queue
-- behind it (writer-starvation prevention). Dead writers met in the queue are dropped.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] readers  ZSET reader owner -> lease end (see lib/rw.lua)
-- KEYS[3] fence    the shard's fence key (see lib/fence.lua)
-- KEYS[4] events, KEYS[5] seq   unused (passed for the canonical positions, lua/README.md)
-- KEYS[6] queue    LIST of waiter ids, writers prefixed "w", readers "r" (see lib/queue.lua)
-- KEYS[7] alive    ZSET waiter id -> waiter lease end
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   waiter id of this acquisition
-- ARGV[5] waiter-lease  waiter lease in ms; 0 for a try that must not join the queue
-- ARGV[6..8]       unused (the event arguments: this script emits nothing)
-- ARGV[9] side     "read" or "write"
-- ARGV[10] margin  key TTL margin in ms: the retry window (see lib/rw.lua)
-- ARGV[11] fence   the fence argument "<0|1><layout>" (see lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered (a read hold's token is
--         the shard's last token when the owner's read hold began),
--         {0, ms to wait at most before trying again} when it must wait,
--         {-2} when the owner holds a read hold and asked for a write hold,
--         a FLFENCE error (and no change) when the fence key is missing or carries another
--         layout (lib/fence.lua).
local hold, readers, fence, queue, alive = KEYS[1], KEYS[2], KEYS[3], KEYS[6], KEYS[7]
local owner, lease, op, id = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local waiter_lease, side = tonumber(ARGV[5]), ARGV[9]
local tomb, fence_arg = tonumber(ARGV[10]), ARGV[11]

-- Reads first (lib/rw.lua): the fence (GET), the hash (HMGET), then what the path needs. The
-- one key whose first access may be a write is the queue of a waiter kept out before it looked
-- at the queue (by a live writer, or by live readers): its RPUSH is then the script's first
-- write (else a typed read of the queue comes first, below).
local last, refusal = fl_fence_read(fence, fence_arg)
if not last then
  return redis.error_reply(refusal)
end
local f = fl_rw_read(hold, owner)
local now, now_us = fl_now()

-- Another owner's live write hold decides alone (no reader holds besides it, so the readers
-- ZSET has nothing to say, and its expired entries can wait for the next purge).
local purge
if not (f.w and f.w ~= owner and tonumber(f.we) > now and not f.rc) then
  purge = fl_rw_purge(hold, readers, f, owner, now)
end
local writer = f.w
local reading = purge and purge.any

-- The writes begin here: first the purge of expired holds (read above).
local function begin_writes()
  if purge then
    fl_rw_apply(hold, readers, purge, now)
    purge = nil
  end
end

if f.op == op then
  begin_writes()
  if side == 'write' then
    return {1, tonumber(f.wf), tonumber(f.wc)}
  end
  return {1, tonumber(f.rt), tonumber(f.rc)}
end

-- Queue entries to drop: the dead waiters ahead of the head (a writer's attempt), or the dead
-- writers queued ahead of this reader (a reader's), found while reading the queue.
local dead, looked = {}, false
local function drop_dead()
  if side == 'write' then
    fl_drop(queue, alive, #dead, dead)
    return
  end
  for _, entry in ipairs(dead) do
    redis.call('LREM', queue, 1, entry)
  end
  fl_drop(queue, alive, 0, dead)
end

-- A read hold for owner, with `token` (the write hold's, for a downgrade) or the shard's last
-- token. Writes only.
local function take_read(token)
  if not token and last > 0 then
    token = fl_fence_text(last)
  elseif not token then
    -- The shard's fence key was missing (and may be created): the read issues a token.
    token = fl_fence_next(fence, fence_arg, last, now_us)
  end
  redis.call('HSET', hold, 'rc:' .. owner, 1, 'rt:' .. owner, token, 'op:' .. owner, op)
  redis.call('ZADD', readers, now + lease, owner)
  fl_rw_keep(hold, readers, now, tomb, f.we, reading or now + lease)
  return {1, tonumber(token), 1}
end

if side == 'write' then
  if writer == owner then
    begin_writes()
    local count = tonumber(f.wc) + 1
    if tonumber(f.we) < now + lease then
      f.we = now + lease
      redis.call('HSET', hold, 'wc', count, 'we', f.we, 'op:' .. owner, op)
    else
      redis.call('HSET', hold, 'wc', count, 'op:' .. owner, op)
    end
    fl_rw_keep(hold, readers, now, tomb, f.we, reading)
    return {1, tonumber(f.wf), count}
  end
  if f.rc then
    begin_writes()
    return {-2}
  end
  if not writer and not reading then
    local head
    head, dead = fl_peek(queue, alive, now, 0)
    looked = true
    if not head or head == id then
      if head then
        dead[#dead + 1] = head
      end
      begin_writes()
      drop_dead()
      local token = fl_fence_next(fence, fence_arg, last, now_us)
      redis.call('HSET', hold, 'w', owner, 'wc', 1, 'wf', token, 'we', now + lease,
        'op:' .. owner, op)
      fl_rw_keep(hold, readers, now, tomb, now + lease, false)
      return {1, tonumber(token), 1}
    end
  end
else
  if f.rc then
    local mine = tonumber(redis.call('ZSCORE', readers, owner))
    begin_writes()
    local count = tonumber(f.rc) + 1
    redis.call('HSET', hold, 'rc:' .. owner, count, 'op:' .. owner, op)
    if mine < now + lease then
      redis.call('ZADD', readers, now + lease, owner)
    end
    fl_rw_keep(hold, readers, now, tomb, f.we, true)
    return {1, tonumber(f.rt), count}
  end
  if writer == owner then
    begin_writes()
    return take_read(f.wf)
  end
  if not writer then
    -- Only if no live writer is queued ahead of it (dead ones met on the way are dropped).
    local may_go, queued
    may_go, dead, queued = fl_rw_may_go(queue, alive, id, now)
    looked = true
    if may_go then
      -- It leaves the queue, if it was there.
      local lease_end = queued and redis.call('ZSCORE', alive, id)
      begin_writes()
      drop_dead()
      if queued then
        redis.call('LREM', queue, 1, id)
      end
      if lease_end then
        redis.call('ZREM', alive, id)
      end
      return take_read(nil)
    end
  end
end

-- It waits: it queues (unless it only tries), behind the live head or writer it met.
local queued = false
if waiter_lease > 0 then
  queued = redis.call('ZSCORE', alive, id)
  for _, entry in ipairs(dead) do
    if entry == id then
      -- Its own entry is dropped as dead: it queues again, at the tail.
      queued = false
    end
  end
  if not looked and (queued or (purge and fl_rw_purging(purge))) then
    -- Its RPUSH is not the script's first write: a typed read of the queue first.
    redis.call('LLEN', queue)
  end
end
local top
if not writer and side == 'write' and reading then
  top = tonumber(redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2])
end
begin_writes()
drop_dead()
if waiter_lease > 0 then
  fl_enqueue(queue, alive, id, now, waiter_lease, queued)
end
local wait
if writer then
  wait = tonumber(f.we) - now
elseif side == 'write' and reading then
  wait = top - now
else
  wait = math.max(waiter_lease, 1000)
end
if wait < 1 then
  wait = 1
end
return {0, wait}
