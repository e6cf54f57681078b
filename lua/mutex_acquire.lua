-- mutex_acquire.lua: take or re-enter an exclusive reentrant lock (barging).
-- Uses lib/hold.lua and lib/fence.lua.
--
-- KEYS[1] hold     hold hash (see lib/hold.lua)
-- KEYS[2] marker   "someone may be waiting"; releases emit an event only while it exists
-- KEYS[3] fence    the shard's fence key (see lib/fence.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] lease    lease in ms (> 0)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] waiter   the waiter id of this acquisition ("" for a try): a release of its process
--                  may have handed it the lock under this id already (mutex_release.lua)
-- ARGV[5] waiter-lease  the waiter grace in ms: when busy and > 0, keep the marker alive for
--                  PTTL + grace (0 for a try)
-- ARGV[6] others   "1" when other waiters of the caller's process wait for this lock: on
--                  success the marker is set for them (the release that let the caller in
--                  deleted it, and only one waiter per process was woken, so nobody else would
--                  set it again)
-- ARGV[7] fence    the fence argument "<0|1><layout>" (see lib/fence.lua)
--
-- Returns {1, fencing token, hold count} when acquired or re-entered,
--         {1, fencing token, hold count, remaining ms} when a release had already handed the
--           lock to this acquisition (its reply never reached the waiter),
--         {0, remaining ttl of the hold in ms} when another owner holds the lock,
--         a FLFENCE error (and no change) when the fence key is missing or carries another
--         layout (lib/fence.lua),
--         a WRONGTYPE error (and no change) when a key it touches holds a foreign value
--         (lib/check.lua); a foreign value under a key it does not touch is left alone.
--
-- Type checks cost server time on the hottest path, so each key is checked where it is first
-- touched, always before the script's first write: the hold by HMGET and the fence by GET
-- (typed reads), the marker by fl_expect before SET.
local hold, marker, fence = KEYS[1], KEYS[2], KEYS[3]
local owner, lease, op, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local grace, others, fence_arg = tonumber(ARGV[5]), ARGV[6], ARGV[7]

local fields = redis.call('HMGET', hold, 'o', 'r', 'f', 'c', 'x')
local current = fields[1]
if current and waiter ~= '' and fields[2] == waiter then
  return {1, tonumber(fields[3]), tonumber(fields[4]), redis.call('PTTL', hold)}
end
if not current then
  local last, refusal = fl_fence_read(fence, fence_arg)
  if not last then
    return redis.error_reply(refusal)
  end
  if others == '1' then
    fl_expect(marker, 'string')
    redis.call('SET', marker, '1', 'PX', lease + grace)
  end
  local token = fl_fence_next(fence, fence_arg, last)
  return fl_take(hold, token, owner, op, lease, fl_tomb_chain(fields[2], fields[5]))
end
if current == owner then
  return fl_reenter(hold, owner, op, lease)
end

local ttl = redis.call('PTTL', hold)
if grace > 0 and ttl > 0 then
  fl_expect(marker, 'string')
  local want = ttl + grace
  if redis.call('PTTL', marker) < want then
    redis.call('SET', marker, '1', 'PX', want)
  end
end
return {0, ttl}
