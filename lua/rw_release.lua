-- rw_release.lua: give back one read or write hold (or every level of it) of a read-write lock;
-- when that leaves the lock free for the head of the queue, grant it (lib/rw.lua: a writer
-- alone once no read hold is left, or the readers at the head together).
-- Uses lib/fence.lua, lib/notify.lua, lib/hold.lua and lib/rw.lua.
--
-- A write release may name a successor: a task of the releasing process that waits for the
-- write hold, or asks for it right after this release (a take-over of a deferred release).
-- The successor is handed the lock unless a queued waiter is due (ARGV[13]); otherwise the
-- lock goes to the queue, and a successor that asks by this call joins its tail in the same
-- call, as a busy rw_acquire would.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/rw.lua)
-- KEYS[3] fence    unused (a grant or hand-over continues the lock's token)
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- KEYS[5] ops      unused (kept for the canonical order)
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released (a stale hold of the same owner
--                  is refused)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every level of the hold at once, "0" to release one
-- ARGV[5] window   the retry window in ms: the ttl of a lock left with no hold
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
-- ARGV[9] side     "read" or "write"
-- ARGV[10..15] are passed only with a successor; missing ones read as "" (none).
-- ARGV[10] successor  successor owner id, "" for none (write side only)
-- ARGV[11] successor-waiter  the successor's waiter id
-- ARGV[12] successor-lease   its lease in ms
-- ARGV[13] limit   the first waiter of the queue is due once it has waited this many ms (0:
--                  always): the successor is handed the write hold, and takes the place of its
--                  own line if it queued, unless read holds are live or another waiter is due
--                  (eventual fairness, as hold_release.lua's; bounds every wait behind the
--                  write side's hand-overs)
-- ARGV[14] inbox   the successor's client's inbox tag (a write hold handed to it tells that
--                  client of its first waiter: field i of lib/rw.lua)
-- ARGV[15] successor-queues  the waiter lease of its client (its grant ms at most): when the
--                  lock goes to the queue, the successor joins the queue's tail; "" for a
--                  successor that waits already (a task of the releasing process, queued here
--                  or not)
-- ARGV[16] floor   the highest fencing token the releasing client issued for this write hold
--                  within its own process (local hand-overs, docs/design.md), "" or missing
--                  for none: the lock's next token (a hand-over, a grant, a later take) is
--                  above it
--
-- Returns {1, holds left} when released (0: this side's hold is gone),
--         {1, 0, token, queued} when the write hold was handed to the successor with this
--           fencing token (also when this call is a retry of a release that did so); queued
--           is how many waiters stay queued behind it (0: none),
--         {2, bound ms, token} when the lock went to the queue and the successor joined the
--           queue: the latest end of the lock's live holds and the lock's f, as in
--           rw_acquire's busy reply (also to a retry, while the successor is queued),
--         {0, 0} when the hold is not there (expired or released),
--         {-1, 0} when the owner's hold carries another token (a newer hold of this owner),
--         a WRONGTYPE error (and no change) when the hold key holds a foreign value.
local hold, queue, events, reads = KEYS[1], KEYS[2], KEYS[4], KEYS[6]
local owner, token, op, all, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode, lock_id, side = ARGV[6], ARGV[8], ARGV[9]
local successor, successor_waiter = ARGV[10] or '', ARGV[11] or ''
local successor_lease, successor_inbox = tonumber(ARGV[12]) or 0, ARGV[14] or ''
local limit, successor_queues = tonumber(ARGV[13]) or 0, ARGV[15] or ''

-- The freed-by chain keeps up to eight op ids: the read holds of many owners end one after
-- the other, and each final release's retry must still find its own.
local CHAIN = 264

local fields = fl_rw_read(hold, owner)
local now_us = fl_now_us()
local now_ms = math.floor(now_us / 1000)
local state = fl_rw_state(reads, fields, now_ms, owner)
local head, since = fl_rw_queue_head(queue, fields, now_ms)

-- The bound and token of a busy reply, for a successor that queued: the lock's f, which a
-- grant made after it goes above.
local function queued_reply()
  return {2, math.max(fl_rw_last(state) - now_ms, 1), tonumber(state.f or fields[3])}
end

-- Once the hold is gone: the queue's turn, or the lock written as it is (lib/rw.lua). A
-- retried write release is answered by the chain x.
local function settle(freed_by, tail)
  return fl_rw_settle(hold, queue, reads, head, fields[3], state, now_us, freed_by, events, mode,
    lock_id, tail, window)
end

if side ~= 'write' then
  -- A retried final release is recognised by its op id first (its hold is gone; a newer read
  -- hold of the same owner has another token, so a stale call without its op id in the chain
  -- is refused below).
  local mine = state.mine
  if fl_chain_has(fields[6], op) then
    return {1, 0}
  end
  if not mine then
    return {0, 0}
  end
  if mine.token ~= token then
    return {-1, 0}
  end
  if mine.op == op then
    return {1, mine.count}
  end
  if all ~= '1' and mine.count > 1 then
    mine.count, mine.op = mine.count - 1, op
    state.mine_changed = true
    fl_rw_put_reads(hold, reads, state)
    return {1, mine.count}
  end
  state.mine, state.mine_changed = nil, true
  state.readers = state.readers - 1
  settle(fl_freed_chain(op, fields[6], CHAIN))
  return {1, 0}
end

if fields[5] == op then
  return {1, tonumber(fields[2]) or 0}
end
if fl_chain_has(fields[6], op) then
  if successor_waiter ~= '' and state.writer and fields[7] == successor_waiter then
    return {1, 0, tonumber(fields[3]), fl_rw_count(queue)}
  end
  if successor_queues ~= '' and fl_rw_queued(queue, successor_waiter) then
    return queued_reply()
  end
  return {1, 0}
end
if not state.writer then
  return {0, 0}
end
if state.writer ~= owner or fields[3] ~= token then
  return {-1, 0}
end
local count = tonumber(fields[2])
if all ~= '1' and count > 1 then
  redis.call('HSET', hold, 'c', string.format('%d', count - 1), 'r', op)
  return {1, count - 1}
end

-- Tokens the client issued within its process continue the hold's: what follows goes above.
local floor = ARGV[16]
if floor and fl_above(floor, fields[3]) then
  fields[3], state.f = floor, floor
end

local freed_by = fl_freed_chain(op, fields[6], CHAIN)
state.writer, state.ends = false, 0

-- The successor takes the write hold over, and leaves the queue if it is in it (`place`: its
-- place if known).
local function hand_over(place)
  local next_token = fl_next_token(state.f or fields[3])
  state.writer, state.ends = successor, now_ms + successor_lease
  redis.call('HSET', hold, 'o', successor, 'c', '1', 'f', next_token, 'l', ARGV[12],
    'r', successor_waiter, 'x', freed_by, 'g', successor_waiter,
    'e', string.format('%d', state.ends), 'i', successor_inbox)
  fl_rw_put_reads(hold, reads, state)
  fl_rw_keep(hold, reads, state, now_ms, window)
  if head then
    fl_rw_leave(queue, successor_waiter, place)
  end
  return {1, 0, next_token, fl_rw_count(queue)}
end

-- A successor that holds a read hold itself asks for an upgrade, which its own attempt refuses:
-- it is not named here; nor is a reader (only the write side takes a write release over).
if successor == '' or string.byte(successor_waiter, 1) ~= 119 or
    fl_rw_holds_read(reads, successor, now_ms) then
  settle(freed_by)
  return {1, 0}
end
-- Nobody else in line, the successor first in it, or nobody due: the successor (which may be
-- queued itself: it leaves the queue) takes the lock.
local own_head = head and string.sub(head, 1, #successor_waiter + 1) == successor_waiter .. ' '
if state.readers == 0 and (not head or own_head or not fl_rw_due(since, now_us, limit)) then
  return hand_over(own_head and head or nil)
end
local tail
if successor_queues ~= '' and not fl_rw_queued(queue, successor_waiter) then
  local waiter_lease = tonumber(successor_queues)
  local lasts = math.max(math.min(successor_lease, waiter_lease), 0)
  tail = {member = fl_queue_member(successor_waiter, successor_inbox, successor,
    string.format('%d', successor_lease), string.format('%d', lasts)),
    waiter = successor_waiter, alive = now_ms + waiter_lease, ttl = waiter_lease}
end
local granted = settle(freed_by, tail)
if not granted and state.readers == 0 then
  local first = fl_rw_head(queue)
  if not first or (tail and first == tail.member) then
    -- Nobody in line could be granted it (their clients are gone): the successor takes it.
    head = first
    return hand_over(tail and tail.member)
  end
end
if tail or fl_rw_queued(queue, successor_waiter) then
  return queued_reply()
end
return {1, 0}
