-- rw_describe.lua: read a read-write lock or a semaphore, its holds and its wait queue,
-- without changing them (one atomic snapshot, for inspection: src/lock/inspect.rs).
-- Uses lib/fence.lua, lib/notify.lua, lib/hold.lua and lib/rw.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/rw.lua)
-- KEYS[3] fence    unused
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      unused (kept for the canonical order)
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV[1..5]       unused (no call)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id (unused)   the event arguments
-- ARGV[9] limit    how many read holds and waiters to list at most each
--
-- Returns {writer's owner id ("" without a live write hold), write hold count, the lock's last
--          fencing token ("" when it has no hash), ms until the write hold's lease ends (-2
--          without), the semaphore's permit count (0 on a read-write lock), live read holds,
--          read holds listed (r), waiters queued (alive), then r times {owner id, count,
--          token, ms until its lease ends} (the earliest end first), then per listed waiter, head first: {waiter id,
--          inbox tag, owner id, whether its client listens (fl_listening: 1, 0, -1 unknown)}};
--         a WRONGTYPE error when the key holds a foreign value (HMGET: a typed read).
local hold, queue, events, reads = KEYS[1], KEYS[2], KEYS[4], KEYS[6]
local mode, limit = ARGV[6], tonumber(ARGV[9])
local fields = fl_rw_read(hold, '')
local now_ms = math.floor(fl_now_us() / 1000)
local state = fl_rw_state(reads, fields, now_ms, '')
local readers = {}
if state.readers > 0 then
  local live = redis.call('ZRANGEBYSCORE', reads, '(' .. string.format('%d', now_ms), '+inf',
    'WITHSCORES', 'LIMIT', '0', string.format('%d', limit))
  for i = 1, #live, 2 do
    local count, token = string.match(redis.call('HGET', hold, '=' .. live[i]) or '',
      '^(%d+) (%d+) ')
    if count then
      readers[#readers + 1] = live[i]
      readers[#readers + 1] = tonumber(count)
      readers[#readers + 1] = token
      readers[#readers + 1] = tonumber(live[i + 1]) - now_ms
    end
  end
end
-- The waiters whose time passed are left out (a call that changes the lock drops them), and
-- so is the queue of a lock whose hash is gone.
local waiters, queued = {}, 0
if fields[3] then
  local lapsed = {}
  for _, waiter in ipairs(fl_queue_call(queue, 'ZRANGEBYSCORE', '-inf',
      string.format('%d', now_ms))) do
    lapsed[waiter] = true
  end
  queued = fl_rw_count(queue)
  local places = redis.call('ZRANGEBYSCORE', queue, FL_RW_PLACES, '+inf')
  for _, place in ipairs(places) do
    local waiter, inbox, owner = fl_queue_parse(place)
    if waiter and lapsed[waiter] then
      queued = queued - 1
    elseif waiter and #waiters < 4 * limit then
      waiters[#waiters + 1] = waiter
      waiters[#waiters + 1] = inbox
      waiters[#waiters + 1] = owner
      waiters[#waiters + 1] = fl_listening(events .. ':to:' .. inbox, mode)
    end
  end
end
local reply = {state.writer or '', state.writer and (tonumber(fields[2]) or 0) or 0,
  fields[3] or '', state.writer and (state.ends - now_ms) or -2, state.cap or 0, state.readers,
  #readers / 4, queued}
for _, item in ipairs(readers) do
  reply[#reply + 1] = item
end
for _, item in ipairs(waiters) do
  reply[#reply + 1] = item
end
return reply
