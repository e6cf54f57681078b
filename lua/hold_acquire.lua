-- hold_acquire.lua: take, re-enter or queue for an exclusive lock (barging or fair).
-- Uses lib/fence.lua, lib/notify.lua and lib/hold.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/hold.lua)
-- KEYS[2] queue    the lock's wait queue (see lib/hold.lua)
-- KEYS[3] fence    the shard's fence key (lib/fence.lua), read only for a lock with no hash
-- KEYS[4] events   the shard's stream or channel: the base name of the inboxes
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
-- ARGV[6] mode, ARGV[7] maxlen (unused), ARGV[8] lock-id   the event arguments
-- ARGV[9] inbox    the inbox tag of the caller's client (where a grant is sent)
-- ARGV[10] notice  "1": when this call takes the lock, the first waiter that queues behind
--                  the hold tells the caller's client (event "0|held|<token>|<lock id>" into
--                  its inbox; field i of lib/hold.lua), which may then defer the hold's
--                  release for a task of its own; "": no such event
-- ARGV[11] fence   the fence argument "<0|1><layout>" (lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered,
--         {1, fencing token, hold count, remaining ms} when a release had already granted or
--           handed the lock to this acquisition (its event has not been read yet),
--         {0, bound ms, fencing token} when another owner holds it: the holder's lease, which
--           its remaining time never exceeds (the waiter looks again after it, event or not),
--           and the holder's token (a grant read later with a token not above it is older
--           than this reply),
--         a FLFENCE error (and no change) when the fence key is missing or carries another
--         layout (lib/fence.lua), a WRONGTYPE error (and no change) when the hold, the queue
--         or the fence key holds a foreign value.
local hold, queue, fence, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, lease, op, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local waiter_lease, mode, lock_id = tonumber(ARGV[5]), ARGV[6], ARGV[8]
local inbox, notice, fence_arg = ARGV[9], ARGV[10], ARGV[11]

local fields = fl_hold_read(hold)
local current = fields[1]
if current and waiter ~= '' and fields[8] == waiter then
  return {1, fields[3], tonumber(fields[2]), redis.call('PTTL', hold)}
end
-- The waiter's queue member: the same on every attempt of this acquisition.
local grant_ms = math.max(math.min(lease, waiter_lease), 0)
local member = waiter_lease ~= 0 and fl_queue_member(waiter, inbox, owner, ARGV[2], grant_ms)
if current == owner then
  -- Another task of this owner holds it (a grant to a waiter of the same owner, say): this
  -- waiter re-enters, and must not stay queued for a grant it would never take up.
  local count, queued = fl_queue_remove(queue, fl_queue_count(fields), member)
  if queued then
    redis.call('HSET', hold, 'q', string.format('%d', count))
    fields[7] = count
  end
  return fl_reenter(hold, queue, fields, owner, op, ARGV[2])
end
if not current then
  -- No hash: a queue may have outlived its hold (lib/hold.lua). ZCARD, a typed read, refuses a
  -- foreign value there before anything changes; the queue goes after the hold is written (a
  -- write refused for want of memory is then the first), and its waiters queue again when
  -- they look.
  local left_behind = not fields[3] and fl_queue_call(queue, 'ZCARD') > 0
  local token, refusal = fl_hold_token(fields, fence, fence_arg)
  if not token then
    return redis.error_reply(refusal)
  end
  fl_hold_write(hold, queue, fields, owner, token, ARGV[2], op, fields[6], '', '',
    notice == '1' and inbox or '')
  if left_behind then
    redis.call('DEL', queue)
  end
  return {1, token, 1}
end

if member then
  local count, k = fl_queue_join(queue, fields, member)
  if k then
    -- The hold's first waiter: its holder's client hears of it if it asked to (field i), once.
    local told = redis.call('HMGET', hold, 'i')[1]
    if told and told ~= '' then
      fl_emit_to(events .. ':to:' .. told, mode, '0|held|' .. fields[3] .. '|' .. lock_id)
      redis.call('HSET', hold, 'q', '1', 'k', k, 'i', '')
    else
      redis.call('HSET', hold, 'q', '1', 'k', k)
    end
  elseif count ~= fl_queue_count(fields) then
    redis.call('HSET', hold, 'q', string.format('%d', count))
  end
end
return {0, tonumber(fields[4]) or lease, fields[3] or nil}
