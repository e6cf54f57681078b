-- queue_heartbeat.lua: one client's heartbeat for its queued waiters, batched per hash slot.
-- Serves every lock kind that queues its waiters in Redis (the fair lock and the read-write
-- lock; one call may carry locks of both kinds, each with its kind, see queue_leave.lua for
-- why one script). Uses lib/queue.lua, lib/notify.lua and lib/rw.lua.
--
-- Refreshes each listed waiter's lease, and on every lock that is free evicts dead waiters at
-- the head; if that uncovers a live head, it is told with a `name` event (a reader at the head
-- of a read-write lock: one `chain` event naming the readers that may go now, see fl_wake_head
-- in lib/rw.lua). A free fair lock with a live head is always stalled (releases grant the lock
-- to the head, lib/fair.lua): a grant to a waiter that died ran out, or a holder's lease did;
-- its head is named even when nobody was evicted. Thanks to this, a waiter that died at the
-- head of a free lock stalls the queue for at most one waiter lease plus one heartbeat.
--
-- A batch script (lua/README.md): one group of keys per lock, then the shard's keys.
-- KEYS[4i-3], KEYS[4i-2], KEYS[4i-1], KEYS[4i]   hold (fair hold hash or read-write hash),
--                  bids (fair) or readers (read-write; unused), queue and alive keys of the
--                  i-th lock (i = 1..m)
-- KEYS[4m+1] events, KEYS[4m+2] seq (the shard's)
-- ARGV[1] waiter-lease  waiter lease in ms
-- ARGV[2] mode, ARGV[3] maxlen (see lib/notify.lua)
-- then for each lock i: its kind ("fair" or "rw"), its lock id, the number n of waiter ids,
-- and the n waiter ids
--
-- Returns one code per waiter id, in order: 1 refreshed, 0 not queued (evicted or already
-- acquired; an evicted waiter that is still alive re-joins at the tail on its next attempt).
local events, seq = KEYS[#KEYS - 1], KEYS[#KEYS]
local lease, mode, maxlen = tonumber(ARGV[1]), ARGV[2], ARGV[3]
fl_expect_events(events, seq, mode)
-- Before any write: every lock's kind, and the type of every key the script touches.
local arg = 4
for base = 1, #KEYS - 2, 4 do
  local kind = fl_queue_kind(ARGV[arg])
  fl_expect(KEYS[base], 'hash')
  if kind == 'fair' then
    fl_expect(KEYS[base + 1], 'hash')
  end
  fl_expect(KEYS[base + 2], 'list')
  fl_expect(KEYS[base + 3], 'zset')
  arg = arg + 3 + tonumber(ARGV[arg + 2])
end
local now = fl_now()
local codes = {}
arg = 4
local base = 1
while arg <= #ARGV do
  local kind, lock_id, n = ARGV[arg], ARGV[arg + 1], tonumber(ARGV[arg + 2])
  local hold, queue, alive = KEYS[base], KEYS[base + 2], KEYS[base + 3]
  local bids = kind == 'fair' and KEYS[base + 1] or nil
  arg = arg + 3
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    if redis.call('ZSCORE', alive, id) then
      redis.call('ZADD', alive, now + lease, id)
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
  fl_keep(queue, alive, lease, bids)
  if fl_queue_free(kind, hold) then
    local head, evicted = fl_head(queue, alive, now, bids)
    if head and (evicted > 0 or kind == 'fair') then
      fl_wake_head(kind, queue, alive, head, now, events, seq, mode, maxlen, lock_id)
    end
  end
  base = base + 4
end
return codes
