-- fair_release.lua: give back one hold (or all holds) of a fair lock; grant it to the head.
-- Uses lib/hold.lua, lib/fence.lua, lib/queue.lua, lib/notify.lua and lib/fair.lua.
--
-- KEYS[1] hold, KEYS[2] bids (see fair_acquire.lua)
-- KEYS[3] fence    the shard's fence key (a grant takes the next token, lib/fence.lua)
-- KEYS[4] events   the shard's stream or channel
-- KEYS[5] seq      the shard's event counter
-- KEYS[6] queue, KEYS[7] alive (see fair_acquire.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of the owner at once, "0" to release one
-- ARGV[5] window   tombstone ttl in ms (see lib/hold.lua)
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] fence    the fence argument (lib/fence.lua)
--
-- When the lock becomes free, dead waiters at the head are evicted and the lock is granted to
-- the first live waiter, whose process alone is told (one `grant` event; see lib/fair.lua).
-- Returns {1, holds left} when released, {0, 0} when not held, {-1, 0} when held by another.
local hold, bids, fence, events, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queue, alive = KEYS[6], KEYS[7]
local owner, token, op, all, window = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode, maxlen, lock_id, fence_arg = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
-- Type checks, all before the first write (fl_release's DEL), and only where needed: the hold
-- by fl_release's HMGET; when the release frees the lock, the queue, alive set and bids by the
-- typed reads that look at the head; the fence and the event keys only when there is a head
-- to grant the lock to (or to name). A release that leaves holds, or frees a lock nobody waits
-- for, touches no other key.
local function prepare()
  local now = fl_now()
  local peek = fl_peek_head(queue, alive, bids, now)
  local next_token
  if not peek or peek[1] then
    local last = fl_fence_read(fence, fence_arg)
    if last then
      next_token = function()
        return fl_fence_next(fence, fence_arg, last)
      end
    end
    fl_expect_events(events, seq, mode)
  end
  return {now, peek, next_token}
end
local function grant(freed_by, prepared)
  return fl_grant_head(hold, prepared[3], queue, alive, bids, prepared[1], events, seq, mode,
    maxlen, lock_id, freed_by, prepared[2])
end
local status, left = fl_release(hold, owner, token, op, all, window, grant, prepare)
return fl_release_reply(status, left)
