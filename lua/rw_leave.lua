-- rw_leave.lua: a waiter of a read-write lock gives up (a timeout or a cancellation): it
-- leaves the queue, and a hold a release granted it meanwhile is released (which may grant the
-- lock to the next in line, lib/rw.lua).
-- Uses lib/fence.lua, lib/notify.lua, lib/hold.lua and lib/rw.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/rw.lua)
-- KEYS[3] fence    unused (kept for the canonical order)
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      unused (kept for the canonical order)
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV[1..3]       unused (the call section of an acquisition, lua/README.md)
-- ARGV[4] waiter   the waiter id that leaves
-- ARGV[5] window   the retry window in ms: the ttl of a lock left with no hold
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when the waiter was queued or granted a hold (now gone), {0} when it was
-- neither; a WRONGTYPE error (and no change) when the hold key holds a foreign value.
local hold, queue, events, reads = KEYS[1], KEYS[2], KEYS[4], KEYS[6]
local waiter, window, mode, lock_id = ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[8]

local fields = fl_rw_read(hold, '')
local now_us = fl_now_us()
local now_ms = math.floor(now_us / 1000)
local state = fl_rw_state(reads, fields, now_ms, '')
fl_rw_queue_head(queue, fields, now_ms)
-- A live read hold granted under this waiter id (its waiter column names it).
local granted_read = state.readers > 0 and fl_rw_read_of(hold, reads, waiter, now_ms)
local queued = fl_rw_leave(queue, waiter, nil)

local freed
if state.writer and fields[7] == waiter then
  local count = tonumber(fields[2])
  if count > 1 then
    -- Another task of the same owner re-entered the grant meanwhile: it keeps the lock, one
    -- level fewer (the level that was this waiter's).
    redis.call('HSET', hold, 'c', string.format('%d', count - 1), 'g', '')
    return {1}
  end
  state.writer, state.ends = false, 0
  freed = true
elseif granted_read then
  fields = fl_rw_read(hold, granted_read)
  state = fl_rw_state(reads, fields, now_ms, granted_read)
  local mine = state.mine
  if mine and mine.waiter == waiter then
    state.mine_changed = true
    if mine.count > 1 then
      mine.count, mine.waiter = mine.count - 1, '-'
    else
      state.mine = nil
      state.readers = state.readers - 1
      freed = true
    end
  end
end
if not freed and not queued and not state.changed and not granted_read then
  return {0}
end
local freed_by = fields[6] or ''
if freed then
  freed_by = fl_freed_chain(waiter, freed_by, 264)
end
-- The lock may be the queue's turn now: its holder's grant went, or this waiter was the writer
-- at the head that kept the readers behind it waiting.
fl_rw_settle(hold, queue, reads, fl_rw_head(queue), fields[3], state, now_us, freed_by, events,
  mode, lock_id, nil, window)
return {1}
