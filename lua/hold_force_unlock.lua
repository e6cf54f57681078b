-- hold_force_unlock.lua: free an exclusive lock whoever holds it, and grant it to the first
-- waiter of its queue. The token continues from the removed hold's. Uses lib/fence.lua,
-- lib/notify.lua and lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/hold.lua)
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..4]       unused (no call)
-- ARGV[5] window   tombstone ttl in ms, when the lock ends up free
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
--
-- Returns {1} when a hold was removed, {0} when the lock was free,
--         a WRONGTYPE error (and no change) when the hold or the queue key holds a foreign
--         value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local window, mode, lock_id = ARGV[5], ARGV[6], ARGV[8]

local fields = fl_hold_read(hold)
if not fields[1] then
  return {0}
end
local freed_by = fields[6] or ''
if not fl_grant_next(hold, queue, fields, freed_by, events, mode, lock_id) then
  fl_free(hold, 'force', freed_by, window)
end
return {1}
