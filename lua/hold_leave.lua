-- hold_leave.lua: a waiter of an exclusive lock gives up (timeout, cancellation): it leaves
-- the queue, and a hold that a release granted it meanwhile (which it never took up) passes
-- to the next waiter (or, when another task of the same owner re-entered it meanwhile, loses
-- the level that was this waiter's). Uses lib/fence.lua, lib/notify.lua and lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/hold.lua)
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..3]       unused (no call)
-- ARGV[4] waiter   the waiter id
-- ARGV[5] window   tombstone ttl in ms, when the lock ends up free
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when the waiter was queued or had been granted the lock, {0} otherwise,
--         a WRONGTYPE error (and no change) when the hold or the queue key holds a foreign
--         value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local waiter, window, mode, lock_id = ARGV[4], ARGV[5], ARGV[6], ARGV[8]

local fields = fl_hold_read(hold)
local count, queued = fl_queue_remove(queue, fl_queue_count(fields),
  fl_queue_find(queue, fl_queue_count(fields), waiter))
fields[7] = count
if fields[1] and fields[8] == waiter then
  local holds = tonumber(fields[2])
  if holds > 1 then
    -- Another task of the same owner re-entered the grant meanwhile: it keeps the lock, one
    -- level fewer (the level that was this waiter's).
    redis.call('HSET', hold, 'c', string.format('%d', holds - 1), 'g', '',
      'q', string.format('%d', count))
    return {1}
  end
  local freed_by = fl_freed_chain(waiter, fields[6])
  if not fl_grant_next(hold, queue, fields, freed_by, events, mode, lock_id) then
    fl_free(hold, waiter, freed_by, window)
  end
  return {1}
end
if queued then
  redis.call('HSET', hold, 'q', string.format('%d', count))
  return {1}
end
return {0}
