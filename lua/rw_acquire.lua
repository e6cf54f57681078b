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
fl_expect(hold, 'hash')
fl_expect(readers, 'zset')
fl_expect(queue, 'list')
fl_expect(alive, 'zset')
local last, refusal = fl_fence_read(fence, fence_arg)
if not last then
  return redis.error_reply(refusal)
end
local now = fl_now()
local writer, reader_count = fl_rw_purge(hold, readers, now)

local function granted(token, count)
  redis.call('HSET', hold, 'op:' .. owner, op)
  fl_rw_keep(hold, readers, now, tomb)
  return {1, token, count}
end

local function write_reply()
  return {1, tonumber(redis.call('HGET', hold, 'wf')), tonumber(redis.call('HGET', hold, 'wc'))}
end

local function read_reply()
  return {1, tonumber(redis.call('HGET', hold, 'rt:' .. owner)),
    tonumber(redis.call('HGET', hold, 'rc:' .. owner))}
end

if redis.call('HGET', hold, 'op:' .. owner) == op then
  if side == 'write' then
    return write_reply()
  end
  return read_reply()
end

local function take_read(token)
  if not token and last > 0 then
    token = fl_fence_text(last)
  elseif not token then
    -- The shard's fence key was missing (and may be created): the read issues a token.
    token = fl_fence_next(fence, fence_arg, last)
  end
  redis.call('HSET', hold, 'rc:' .. owner, 1, 'rt:' .. owner, token)
  redis.call('ZADD', readers, now + lease, owner)
  return granted(tonumber(token), 1)
end

-- May a reader with waiter id `id` go? Only if no live writer is queued ahead of it.
local function reader_may_go()
  local entries = redis.call('LRANGE', queue, 0, -1)
  for _, entry in ipairs(entries) do
    if entry == id then
      return true
    end
    if string.sub(entry, 1, 1) == 'w' then
      local expiry = redis.call('ZSCORE', alive, entry)
      if expiry and tonumber(expiry) > now then
        return false
      end
      redis.call('LREM', queue, 1, entry)
      redis.call('ZREM', alive, entry)
    end
  end
  return true
end

if side == 'write' then
  if writer == owner then
    local count = redis.call('HINCRBY', hold, 'wc', 1)
    if tonumber(redis.call('HGET', hold, 'we')) < now + lease then
      redis.call('HSET', hold, 'we', now + lease)
    end
    return granted(tonumber(redis.call('HGET', hold, 'wf')), count)
  end
  if redis.call('HEXISTS', hold, 'rc:' .. owner) == 1 then
    return {-2}
  end
  if not writer and reader_count == 0 then
    local head = fl_head(queue, alive, now)
    if not head or head == id then
      if head then
        fl_dequeue(queue, alive, id)
      end
      local token = fl_fence_next(fence, fence_arg, last)
      redis.call('HSET', hold, 'w', owner, 'wc', 1, 'wf', token, 'we', now + lease)
      return granted(tonumber(token), 1)
    end
  end
else
  if redis.call('HEXISTS', hold, 'rc:' .. owner) == 1 then
    local count = redis.call('HINCRBY', hold, 'rc:' .. owner, 1)
    if tonumber(redis.call('ZSCORE', readers, owner)) < now + lease then
      redis.call('ZADD', readers, now + lease, owner)
    end
    return granted(tonumber(redis.call('HGET', hold, 'rt:' .. owner)), count)
  end
  if writer == owner then
    return take_read(redis.call('HGET', hold, 'wf'))
  end
  if not writer and reader_may_go() then
    fl_leave(queue, alive, id)
    return take_read(nil)
  end
end

if waiter_lease > 0 then
  fl_enqueue(queue, alive, id, now, waiter_lease)
end
local wait
if writer then
  wait = tonumber(redis.call('HGET', hold, 'we')) - now
elseif side == 'write' and reader_count > 0 then
  wait = tonumber(redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]) - now
else
  wait = math.max(waiter_lease, 1000)
end
if wait < 1 then
  wait = 1
end
return {0, wait}
