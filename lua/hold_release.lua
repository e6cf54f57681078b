-- hold_release.lua: give back one hold (or every hold) of an exclusive lock; when that frees
-- it, hand it to a task of the releasing process (barging mutex: unless the first waiter of
-- the queue is due, see ARGV[12]), else grant it to the first waiter of the queue, else leave
-- it free.
-- Uses lib/fence.lua, lib/notify.lua and lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/hold.lua)
-- KEYS[3] fence    unused (a hand-over or grant continues the hold's token)
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released (a stale hold of the same owner
--                  is refused)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of the owner at once, "0" to release one
-- ARGV[5] window   tombstone ttl in ms (see lib/hold.lua)
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
-- ARGV[9..14] are passed only with a successor; missing ones read as "" (none).
-- ARGV[9] successor  successor owner id, "" for none: a task of the releasing process that
--                  may be handed the lock when this release frees it (lock cohorting: a
--                  local waiter, or a task that asks for the lock right after this release)
-- ARGV[10] successor-waiter  the successor's waiter id
-- ARGV[11] successor-lease   its lease in ms
-- ARGV[12] limit   the first waiter of the queue is due once it has waited this many ms: the
--                  successor is then passed over for it, unless the hold being released was
--                  itself granted from the queue (t = "1") and the waiter has waited less than
--                  twice this: then the successor is handed the lock once more, and the next
--                  release grants. So the queue gets every other hold from `limit` on, and
--                  every hold from 2 × `limit` on (bounds every wait behind a barging mutex)
-- ARGV[13] inbox   the successor's client's inbox tag: a hold handed to the successor tells
--                  that client of its first waiter (field i of lib/hold.lua), and a successor
--                  that joins the queue (ARGV[14]) is granted the lock there
-- ARGV[14] successor-queues  "" for a successor that waits already (a local waiter); for a
--                  successor that asks by this very call (a task taking over its client's
--                  deferred release), its grant ms: when the queue's turn comes, it joins the
--                  queue behind the waiter granted the lock, as a busy hold_acquire would
-- ARGV[15] floor   the highest fencing token the releasing client issued for this hold within
--                  its own process (local hand-overs, docs/design.md), "" or missing for
--                  none: the next token of the lock (a hand-over, a grant, a later take from
--                  the tombstone) is above it
--
-- Returns {1, holds left} when released (0: freed, or granted to the first waiter),
--         {1, 0, token, queued} when the lock was handed to the successor with this fencing
--           token (also when this call is a retry of a release that did so); queued is about
--           how many waiters stay queued behind it,
--         {1, 0, token, queued, quiet} the same, when no queued waiter was due (ARGV[12]):
--           none will be for quiet ms (the first waiter other than the successor then has
--           waited `limit`; later ones queued later), so the successor's client may hand the
--           lock on within itself until then without asking this script again,
--         {2, bound ms, token} when the lock went to the queue and the successor (ARGV[14]
--           set) joined the queue: the granted holder's bound and token, as in
--           hold_acquire's busy reply (also to a retry, while the successor is queued: the
--           current holder's),
--         {0, 0} when the lock is not held (expired or released),
--         {-1, 0} when another owner (or a newer hold of this owner) holds it,
--         a WRONGTYPE error (and no change) when the hold or the queue key holds a foreign
--           value.
local hold, queue, events = KEYS[1], KEYS[2], KEYS[4]
local owner, token, op, all, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local mode, lock_id = ARGV[6], ARGV[8]
local successor, successor_waiter = ARGV[9] or '', ARGV[10] or ''
local successor_lease = tonumber(ARGV[11])
local limit = tonumber(ARGV[12])
local successor_inbox, successor_queues = ARGV[13] or '', ARGV[14] or ''

local fields = fl_hold_read(hold)
local current, count = fields[1], tonumber(fields[2])
local queued = fl_queue_count(fields)
if fields[5] == op then
  return {1, count or 0}
end
-- The member under which a successor that asks by this call (a take-over) joins the queue,
-- as its own attempts would (hold_acquire.lua).
local joins = successor ~= '' and successor_queues ~= '' and
  fl_queue_member(successor_waiter, successor_inbox, successor, ARGV[11],
    math.max(math.min(successor_lease, tonumber(successor_queues)), 0))
if fl_chain_has(fields[6], op) then
  if successor_waiter ~= '' and fields[8] == successor_waiter then
    return {1, 0, fields[3], queued}
  end
  if current and joins and queued > 0 and fl_queue_call(queue, 'ZSCORE', joins) then
    -- It granted the lock to the queue and queued the successor (a take-over), which waits.
    return {2, tonumber(fields[4]) or 0, fields[3]}
  end
  return {1, 0}
end
if not current then
  return {0, 0}
end
if current ~= owner or fields[3] ~= token then
  return {-1, 0}
end
if all ~= '1' and count > 1 then
  redis.call('HSET', hold, 'c', string.format('%d', count - 1), 'r', op)
  return {1, count - 1}
end
-- Tokens the client issued within its process continue the hold's: what follows goes above.
local floor = ARGV[15]
if floor and fl_above(floor, fields[3]) then
  fields[3] = floor
else
  floor = nil
end

local freed_by = fl_freed_chain(op, fields[6])

-- handed: whether the successor takes the hold over, with the queue as it is (false) or
-- emptied (true); nil: no hand-over. Straight-line code, not a closure: a closure over this
-- many locals costs the server more than the code it would share.
local handed, head, quiet
-- The hold as the hand-over writes over it: as read, unless a grant wrote it meanwhile.
local written = fields
if successor ~= '' then
  -- With limit 0 (a fair lock's take-over) anybody queued is due, and a successor that asks
  -- by this call is never queued: no need to look.
  local any_due = limit == 0 and joins
  if not any_due then
    head, quiet = fl_queue_due_head(queue, queued, fields[9] == '1' and 2 * limit or limit,
      successor_waiter, limit)
  end
  if queued == 0 or not (any_due or head) then
    handed = false
  end
end
if handed == nil then
  -- A successor asking by this call (a take-over) queues behind the waiter granted the lock.
  local granted, _, granted_token, granted_ms =
    fl_grant_next(hold, queue, fields, freed_by, events, mode, lock_id, joins or nil, head)
  if granted then
    if joins then
      return {2, granted_ms, granted_token}
    end
    return {1, 0}
  end
  if successor == '' then
    fl_free(hold, op, freed_by, window, floor, queued == 0 and fields or nil)
    return {1, 0}
  end
  -- The queue had nobody left to grant (dead clients, waiters only woken): the successor
  -- takes the lock rather than leave it free, over what a failed grant may have written.
  handed, written, queued = true, {}, 0
end
-- A successor that waits already (a task of this process) leaves the queue if it queued. One
-- that asks by this call (a take-over) is not queued: a call of its that queued it is a
-- release of this hold (its op id), which left the op id in x or the lock in other hands, and
-- either is answered above.
local left = queued
if not joins then
  left = fl_queue_remove(queue, queued, fl_queue_find(queue, queued, successor_waiter))
end
local next_token = fl_next_token(fields[3])
local q = (handed or left ~= queued) and left or nil
fl_hold_write(hold, queue, written, successor, next_token, ARGV[11], successor_waiter, freed_by,
  q, successor_waiter, successor_inbox)
if quiet and quiet > 0 then
  return {1, 0, next_token, left, quiet}
end
return {1, 0, next_token, left}
