-- hold_acquire.lua: take, re-enter or queue for an exclusive lock (barging or fair).
-- Uses lib/fence.lua, lib/notify.lua and lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] marker   unused (kept for the canonical order)
-- KEYS[3] fence    the shard's fence key (lib/fence.lua), read only for a lock with no hash
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   the waiter id of this acquisition ("" for a try): a release may have
--                  granted or handed it the lock under this id already
-- ARGV[5] waiter-lease  0 for a try; > 0: when busy, the waiter joins the queue, and a
--                  release that grants it the lock makes the hold last min(lease, this) ms
--                  until the waiter's client renews it (a client that died meanwhile blocks
--                  the lock no longer than that); -1: when busy, the waiter joins the queue to
--                  be woken, never granted (a Redlock round)
-- ARGV[6] inbox    the inbox tag of the caller's client (where a grant is sent)
-- ARGV[7] stamp    "1": a queued waiter's line carries the server time it queued at (a barging
--                  mutex: the bound of its hand-overs, hold_release.lua); "0": it carries 0 (a
--                  fair lock never hands over, and saves the clock read)
-- ARGV[8] fence    the fence argument "<0|1><layout>" (lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered,
--         {1, fencing token, hold count, remaining ms} when a release had already granted or
--           handed the lock to this acquisition (its event has not been read yet),
--         {0, bound ms, fencing token} when another owner holds it: the holder's lease, which
--           its remaining time never exceeds (the waiter looks again after it, event or not),
--           and the holder's token (a grant read later with a token not above it is older
--           than this reply),
--         a FLFENCE error (and no change) when the fence key is missing or carries another
--         layout (lib/fence.lua), a WRONGTYPE error (and no change) when the hold or the fence
--         key holds a foreign value.
local hold, fence = KEYS[1], KEYS[3]
local owner, lease, op, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local waiter_lease, inbox, stamp, fence_arg = tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]

local fields = fl_hold_read(hold)
local current = fields[1]
if current and waiter ~= '' and fields[8] == waiter then
  return {1, tonumber(fields[3]), tonumber(fields[2]), redis.call('PTTL', hold)}
end
if current == owner then
  -- Another task of this owner holds it (a grant to a waiter of the same owner, say): this
  -- waiter re-enters, and must not stay queued for a grant it would never take up.
  local queue, queued = fl_queue_without(fields[7], waiter)
  if queued then
    redis.call('HSET', hold, 'q', queue)
  end
  return fl_reenter(hold, fields, owner, op, lease)
end
if not current then
  local token, refusal = fl_hold_token(fields, fence, fence_arg)
  if not token then
    return redis.error_reply(refusal)
  end
  fl_hold_write(hold, fields, owner, token, ARGV[2], op, fields[6], '', '')
  return {1, tonumber(token), 1}
end

if waiter_lease ~= 0 and not fl_queue_find(fields[7], waiter) then
  local lasts = math.max(math.min(lease, waiter_lease), 0)
  local line = fl_queue_line(waiter, inbox, owner, lease, lasts, stamp ~= '1' and 0 or nil)
  redis.call('HSET', hold, 'q', (fields[7] or '') .. line)
end
return {0, tonumber(fields[4]) or lease, tonumber(fields[3])}
