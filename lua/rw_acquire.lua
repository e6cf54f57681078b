-- rw_acquire.lua: take, re-enter or queue for a read or write hold of a read-write lock.
-- Uses lib/fence.lua, lib/notify.lua, lib/hold.lua and lib/rw.lua.
--
-- Writers: a write hold needs no live write hold (but the owner's own: re-entry), no live read
-- hold, and nobody queued ahead. An owner holding a read hold is refused at once (no upgrade:
-- waiting would deadlock on itself). Readers: a read hold needs no live write hold (but the
-- owner's own: a downgrade) and no writer queued, so once a writer waits, new readers queue
-- behind it (writer-starvation prevention). A lock found free with waiters still queued (its
-- holds lapsed) is first granted to them (lib/rw.lua), and the caller queues behind.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/rw.lua)
-- KEYS[3] fence    the shard's fence key (lib/fence.lua), read only for a lock with no hash
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      unused (kept for the canonical order)
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   the waiter id of this acquisition ("" for a try): a release may have
--                  granted it the hold under this id already
-- ARGV[5] waiter-lease  0 for a try (never queues); > 0: when it must wait, the waiter joins
--                  the queue, and a release that grants it the hold makes the hold last
--                  min(lease, this) ms until the waiter's client renews it
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
-- ARGV[9] side     "read" or "write"
-- ARGV[10] inbox   the inbox tag of the caller's client (where a grant is sent)
-- ARGV[11] retry-window  ms: the ttl of a lock left with no hold (the tombstone)
-- ARGV[12] notice  "1": when this call takes the write hold, the first waiter that queues
--                  behind it tells the caller's client (event "0|held|<token>|<lock id>" into
--                  its inbox; field i, as in lib/hold.lua), which may then defer the hold's
--                  release for a task of its own; "": no such event
-- ARGV[13] permits  "" on a read-write lock; on a semaphore (read side only), its permit
--                  count n >= 1: a read hold then needs fewer than n live read holds and nobody
--                  queued (field n of lib/rw.lua). A semaphore that has holds or waiters under
--                  another count refuses the call (FLPERMITS error, no change); one without
--                  takes this count
-- ARGV[14] fence   the fence argument "<0|1><layout>" (lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered (every new read hold
--           draws its own token, as a write hold does; a downgrade carries the write's),
--         {1, fencing token, hold count, remaining ms} when a release had already granted
--           the hold to this acquisition (its event has not been read yet),
--         {0, bound ms, fencing token} when it must wait: the latest end of the lock's live
--           holds, which it looks again after (event or not), and the lock's f (a grant read
--           later with a token not above it was made before this reply),
--         {-2} when the owner holds a read hold and asked for a write hold,
--         a "FLPERMITS <count>" error (and no change) when a semaphore with holds or waiters
--           has another permit count,
--         a FLFENCE error (and no change) when the fence key is missing or carries another
--         layout (lib/fence.lua), a WRONGTYPE error (and no change) when the hold or the fence
--         key holds a foreign value.
local hold, queue, fence, events, reads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local owner, lease, op, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local waiter_lease, mode, lock_id = tonumber(ARGV[5]), ARGV[6], ARGV[8]
local side, inbox, window, notice = ARGV[9], ARGV[10], tonumber(ARGV[11]), ARGV[12]
local permits, fence_arg = tonumber(ARGV[13]), ARGV[14]

local fields = fl_rw_read(hold, owner)
local now_us = fl_now_us()
local now_ms = math.floor(now_us / 1000)
local state = fl_rw_state(reads, fields, now_ms, owner)
local writing = side == 'write'

-- Holds that lapsed left waiters queued behind them: the queue is served first (a writer at
-- its head is granted the lock once no read hold is left, readers at its head a read hold
-- each), unless this acquisition is the writer at its head. It then looks again.
local head = fl_rw_queue_head(queue, fields, now_ms)

-- A semaphore's permit count: every user must give the same while it is in use. An idle one
-- takes the caller's; a lock with no hash gets it with its take below, which may yet be
-- refused at the fence key (and must then leave no key behind).
if permits and state.cap ~= permits then
  if state.cap and (state.readers > 0 or head) then
    return redis.error_reply(string.format('FLPERMITS %d', state.cap))
  end
  if fields[3] then
    redis.call('HSET', hold, 'n', string.format('%d', permits))
  end
  state.cap = permits
end

-- Whether the queue's head is this acquisition's own place.
local function own(place)
  return place ~= nil and waiter ~= '' and string.sub(place, 1, #waiter + 1) == waiter .. ' '
end
if not state.writer and head then
  local reader_head = string.byte(head, 1) == 114
  if reader_head or (state.readers == 0 and not (writing and own(head))) then
    fl_rw_grant(hold, queue, reads, fields[3] or '0', state, now_us, fields[6] or '', events,
      mode, lock_id, nil, window)
    fields = fl_rw_read(hold, owner)
    state = fl_rw_state(reads, fields, now_ms, owner)
    head = fl_rw_head(queue)
  end
end
-- With no write hold, the head is a writer whenever one is queued: the readers ahead of the
-- first writer were granted above.
local queue_writer = head ~= nil and string.byte(head, 1) == 119
local mine = state.mine

-- Answered without a change: a hold a release granted to this acquisition, a retried call.
if waiter ~= '' and writing and state.writer and fields[7] == waiter then
  return {1, tonumber(fields[3]), tonumber(fields[2]), state.ends - now_ms}
end
if waiter ~= '' and not writing and mine and mine.waiter == waiter then
  return {1, tonumber(mine.token), mine.count, mine.ends - now_ms}
end
if writing and state.writer == owner and fields[5] == op then
  return {1, tonumber(fields[3]), tonumber(fields[2])}
end
if not writing and mine and mine.op == op then
  return {1, tonumber(mine.token), mine.count}
end
if writing and mine then
  return {-2}
end

-- This acquisition's place, as its queueing call wrote it.
local lasts = math.max(math.min(lease, waiter_lease), 0)
local member = fl_queue_member(waiter, inbox, owner, string.format('%d', lease),
  string.format('%d', lasts))
local queued = fl_rw_queued(queue, waiter)
local lease_end = now_ms + lease

-- Re-entry (and a downgrade): the owner's own hold grows by one level, and its place in the
-- queue, if it had queued meanwhile, goes.
if writing and state.writer == owner then
  local count = tonumber(fields[2]) + 1
  state.ends = math.max(state.ends, lease_end)
  redis.call('HSET', hold, 'c', string.format('%d', count), 'r', op,
    'e', string.format('%d', state.ends))
  fl_rw_put_reads(hold, reads, state)
  fl_rw_keep(hold, reads, state, now_ms, window)
  if queued then
    fl_rw_leave(queue, waiter, member)
  end
  return {1, tonumber(fields[3]), count}
end
if not writing and (mine or state.writer == owner) then
  if mine then
    mine.count, mine.ends, mine.op = mine.count + 1, math.max(mine.ends, lease_end), op
  else
    state.mine = {count = 1, token = fields[3], ends = lease_end, op = op, waiter = '-'}
    mine = state.mine
  end
  state.mine_changed = true
  fl_rw_put_reads(hold, reads, state)
  fl_rw_keep(hold, reads, state, now_ms, window)
  if queued then
    fl_rw_leave(queue, waiter, member)
  end
  return {1, tonumber(mine.token), mine.count}
end

-- A take: a writer needs no hold and nobody ahead in the queue; a reader no writer, holding
-- or queued.
local takes
if writing then
  takes = not state.writer and state.readers == 0 and (not head or own(head))
elseif state.cap then
  takes = state.readers < state.cap and
    (not head or (own(head) and fl_rw_count(queue) == 1))
else
  takes = not state.writer and not queue_writer
end
if takes then
  local token = fields[3]
  if not token then
    local last, refusal = fl_fence_read(fence, fence_arg)
    if not last then
      return redis.error_reply(refusal)
    end
    token = fl_fence_next(fence, fence_arg, last)
  else
    token = fl_next_token(token)
  end
  if writing then
    state.writer, state.ends = owner, lease_end
    redis.call('HSET', hold, 'o', owner, 'c', '1', 'f', token, 'l', ARGV[2], 'r', op, 'g', '',
      'e', string.format('%d', lease_end), 'i', notice == '1' and inbox or '')
  else
    state.mine = {count = 1, token = token, ends = lease_end, op = op, waiter = '-'}
    state.mine_changed = true
    redis.call('HSET', hold, 'f', token)
    if state.cap and not fields[3] then
      -- A semaphore's first take (no hash before it): its permit count goes with it.
      redis.call('HSET', hold, 'n', string.format('%d', state.cap))
    end
    if state.changed then
      redis.call('HSET', hold, 'o', '', 'c', '0', 'e', '')
    end
  end
  fl_rw_put_reads(hold, reads, state)
  fl_rw_keep(hold, reads, state, now_ms, window)
  if queued then
    fl_rw_leave(queue, waiter, member)
  end
  return {1, token, 1}
end

-- It waits: it queues (unless it only tries), at the tail; the lapsed holds it met go.
local joins = waiter_lease > 0 and not queued
if state.changed then
  fl_rw_put_reads(hold, reads, state)
  if not state.writer then
    redis.call('HSET', hold, 'o', '', 'c', '0', 'e', '')
  end
  fl_rw_keep(hold, reads, state, now_ms, window)
end
if joins then
  fl_rw_join(queue, member, waiter, now_ms + waiter_lease, waiter_lease)
  -- The write hold's first waiter: its holder's client hears of it if it asked to (field i),
  -- once.
  local told = not head and state.writer and redis.call('HMGET', hold, 'i')[1]
  if told and told ~= '' then
    redis.call('HSET', hold, 'i', '')
    fl_emit_to(events .. ':to:' .. told, mode, '0|held|' .. fields[3] .. '|' .. lock_id)
  end
end
-- It looks again (event or not) once the lock may be free for it: when the last hold ends, or
-- on a semaphore the first.
local bound = (state.cap and fl_rw_first(reads, now_ms) or fl_rw_last(state)) - now_ms
if bound < 1 then
  bound = math.max(waiter_lease, 1000)
end
return {0, bound, tonumber(fields[3]) or 0}
