-- queue_heartbeat.lua: one client's heartbeat for its waiters queued on read-write locks,
-- batched per hash slot. Uses lib/queue.lua, lib/notify.lua and lib/rw.lua.
--
-- Refreshes each listed waiter's lease, and on every lock that no writer holds evicts dead
-- waiters at the head; if that uncovers a live head, it is told with a `name` event (a writer)
-- or one `chain` event naming the readers that may go now (fl_rw_plan in lib/rw.lua).
-- Thanks to this, a waiter that died at the head stalls the queue for at most one waiter
-- lease plus one heartbeat.
--
-- A batch script (lua/README.md): one group of keys per lock, then the shard's keys.
-- KEYS[4i-3], KEYS[4i-2], KEYS[4i-1], KEYS[4i]   hash, readers (unused), queue and alive
--                  keys of the i-th lock (i = 1..m)
-- KEYS[4m+1] events, KEYS[4m+2] seq (the shard's)
-- ARGV[1] waiter-lease  waiter lease in ms
-- ARGV[2] mode, ARGV[3] maxlen (see lib/notify.lua)
-- then for each lock i: its kind ("rw", checked), its lock id, the number n of waiter ids,
-- and the n waiter ids
--
-- Returns one code per waiter id, in order: 1 refreshed, 0 not queued (evicted or already
-- acquired; an evicted waiter that is still alive re-joins at the tail on its next attempt).
local events, seq = KEYS[#KEYS - 1], KEYS[#KEYS]
local lease, mode, maxlen = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local now = fl_now()
-- Reads first, for every lock (lib/rw.lua): its kind, its waiters' scores (ZSCORE), whether a
-- writer holds it (HGET) and its queue (LLEN, or fl_peek's LRANGE when it is free: the waiters
-- refreshed below count as live there). The shard's keys are read only for an announcement.
-- A lock listed twice is one lock: its waiters are refreshed, and its queue looked at, once.
local locks, by_hold, codes = {}, {}, {}
local arg, base = 4, 1
while arg <= #ARGV do
  fl_queue_kind(ARGV[arg])
  local lock = by_hold[KEYS[base]]
  if not lock then
    lock = {hold = KEYS[base], queue = KEYS[base + 2], alive = KEYS[base + 3],
      lock_id = ARGV[arg + 1], refreshed = {}, live = {}, dead = {}}
    by_hold[lock.hold] = lock
    locks[#locks + 1] = lock
  end
  local n = tonumber(ARGV[arg + 2])
  lock.scored = lock.scored or n > 0
  arg = arg + 3
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    if lock.live[id] or redis.call('ZSCORE', lock.alive, id) then
      if not lock.live[id] then
        lock.refreshed[#lock.refreshed + 1] = id
        lock.live[id] = true
      end
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
  base = base + 4
end
for _, lock in ipairs(locks) do
  if not lock.scored then
    -- No waiter listed: a typed read of alive all the same (fl_keep sets its ttl).
    redis.call('ZCARD', lock.alive)
  end
  if fl_queue_free(lock.hold) then
    local head
    head, lock.dead = fl_peek(lock.queue, lock.alive, now, 0, lock.live)
    if head and #lock.dead > 0 then
      lock.plan = fl_rw_plan(lock.queue, lock.alive, head, #lock.dead, now, events, seq, mode,
        lock.live)
    end
  else
    redis.call('LLEN', lock.queue)
  end
end
for _, lock in ipairs(locks) do
  local refreshed = lock.refreshed
  -- One ZADD refreshes every waiter of the lock (at most 64 per call: Lua's stack).
  for first = 1, #refreshed, 64 do
    local members = {}
    for k = first, math.min(first + 63, #refreshed) do
      members[#members + 1] = now + lease
      members[#members + 1] = refreshed[k]
    end
    redis.call('ZADD', lock.alive, unpack(members))
  end
  fl_keep(lock.queue, lock.alive, lease)
  fl_drop(lock.queue, lock.alive, #lock.dead, lock.dead)
  if lock.plan then
    fl_rw_announce(lock.plan, events, seq, mode, maxlen, lock.lock_id)
  end
end
return codes
