-- mutex_release.lua: give back one hold (or all holds) of an exclusive reentrant lock, or hand
-- it straight to a waiter of the releasing process. Uses lib/hold.lua, lib/fence.lua and lib/notify.lua.
--
-- KEYS[1] hold     hold hash (see lib/hold.lua); field h counts hand-overs in a row
-- KEYS[2] marker   when the lock becomes free and the marker exists, it is deleted and one
--                  event is emitted (waiters that lose the race set it again)
-- KEYS[3] fence    the shard's fence key (a hand-over takes the next token, lib/fence.lua)
-- KEYS[4] events   the shard's stream or channel
-- KEYS[5] seq      the shard's event counter
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released (a stale hold of the same owner
--                  is refused)
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of the owner at once, "0" to release one
-- ARGV[5] window   tombstone ttl in ms (see lib/hold.lua)
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] successor  successor owner id, "" for none: a waiter of the releasing process that
--                  may be handed the lock when this release frees it (barging, but local
--                  first: lock cohorting)
-- ARGV[10] successor-waiter  the successor's waiter id (the op id its hold is taken under)
-- ARGV[11] successor-lease   its lease in ms
-- ARGV[12] streak  at most this many hand-overs in a row (then the lock is freed for all)
-- ARGV[13] fence   the fence argument (lib/fence.lua); a fence that is missing or carries
--                  another layout only turns the hand-over off: the lock is freed for all
--
-- Returns {1, holds left} when released (0: the lock is free now),
--         {1, 0, token} when the lock was handed to the successor with this fencing token (also
--           when this call is a retry of a release that did so),
--         {0, 0} when the lock is not held (expired or released),
--         {-1, 0} when another owner (or a newer hold of this owner) holds it.
--
-- Each key is type-checked before the first write, where it is first needed: the marker by GET
-- (a typed read), the event keys only when there is an event to emit, the fence only when a
-- hand-over may take a token, the hold by fl_release's HMGET (a typed read).
local hold, marker, fence, events, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, token, op, all, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode, maxlen, lock_id = ARGV[6], ARGV[7], ARGV[8]
local successor, successor_waiter, successor_lease = ARGV[9], ARGV[10], tonumber(ARGV[11])
local streak_cap, fence_arg = tonumber(ARGV[12]), ARGV[13]
local waiting = redis.call('GET', marker)
if waiting then
  fl_expect_events(events, seq, mode)
end
local handed
local hand_over
local last = successor ~= '' and fl_fence_read(fence, fence_arg)
if last then
  local streak = tonumber(redis.call('HGET', hold, 'h') or 0)
  if streak < streak_cap then
    hand_over = function(freed_by)
      local next_token = fl_fence_next(fence, fence_arg, last)
      handed = fl_take(hold, next_token, successor, successor_waiter, successor_lease, freed_by)[2]
      redis.call('HSET', hold, 'h', streak + 1)
      return true
    end
  end
end
local status, left = fl_release(hold, owner, token, op, all, window, hand_over)
-- The client re-sends the commands of a broken connection: a retried release that had handed
-- the lock over still tells which token the successor got, or it would never learn it.
if status == 'retried' and successor_waiter ~= '' then
  local now_held = redis.call('HMGET', hold, 'r', 'f')
  if now_held[1] == successor_waiter then
    handed = tonumber(now_held[2])
  end
end
if handed then
  return {1, 0, handed}
end
if status == 'freed' and waiting then
  redis.call('DEL', marker)
  fl_emit(events, seq, mode, maxlen, lock_id, 'one', '')
end
return fl_release_reply(status, left)
