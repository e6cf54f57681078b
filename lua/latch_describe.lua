-- latch_describe.lua: read a count-down latch, its count and the clients waiting for it,
-- without changing them (one atomic snapshot, for inspection: src/lock/inspect.rs).
-- Uses lib/notify.lua and lib/latch.lua.
--
-- KEYS[1] hold     the latch's count (a string)
-- KEYS[2] queue    the set of the inbox tags of the clients waiting for it to open
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1..5]       unused (no call)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id (unused)   the event arguments
-- ARGV[9] limit    how many waiting clients to list at most
--
-- Returns {count (0: open), waiting clients, then for at most limit of them: the inbox tag,
--          whether the client listens (fl_listening: 1, 0, -1 unknown)};
--         a WRONGTYPE error when a key holds a foreign value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local mode, limit = ARGV[6], tonumber(ARGV[9])
local current = redis.call('GET', hold)
local count = current and fl_latch_count(hold, current) or 0
local reply = {count, redis.call('SCARD', queue)}
for _, inbox in ipairs(redis.call('SRANDMEMBER', queue, limit)) do
  reply[#reply + 1] = inbox
  reply[#reply + 1] = fl_listening(events .. ':to:' .. inbox, mode)
end
return reply
