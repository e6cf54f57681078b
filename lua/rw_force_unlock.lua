-- rw_force_unlock.lua: remove every read and write hold of a read-write lock, whoever holds
-- them, and grant the lock to the head of its queue (lib/rw.lua). The token f is kept.
-- Uses lib/fence.lua, lib/notify.lua, lib/hold.lua and lib/rw.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/rw.lua)
-- KEYS[3] fence    unused (kept for the canonical order)
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      unused (kept for the canonical order)
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV[1..4]       unused (the call section of an acquisition, lua/README.md)
-- ARGV[5] window   the retry window in ms: the ttl of a lock left with no hold
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when a hold was removed, {0} when the lock had no live hold (waiters queued
--         behind lapsed holds are granted the lock all the same),
--         a WRONGTYPE error (and no change) when the hold key holds a foreign value.
local hold, queue, events, reads = KEYS[1], KEYS[2], KEYS[4], KEYS[6]
local window, mode, lock_id = tonumber(ARGV[5]), ARGV[6], ARGV[8]

local fields = fl_rw_read(hold, '')
local now_us = fl_now_us()
local now_ms = math.floor(now_us / 1000)
local state = fl_rw_state(reads, fields, now_ms, '')
local removed = (state.writer or state.readers > 0) and 1 or 0
local head = fl_rw_queue_head(queue, fields, now_ms)
if removed == 0 and not head then
  return {0}
end
-- No hold is left; the queue gets its turn, also when only lapsed holds were in its way.
-- Every read hold goes, lapsed or live.
state.lapsed = redis.call('ZRANGE', reads, '0', '-1')
state.writer, state.ends, state.last, state.readers = false, 0, 0, 0
state.mine = nil
fl_rw_settle(hold, queue, reads, head, fields[3], state, now_us, fields[6] or '', events, mode,
  lock_id, nil, window)
return {removed}
