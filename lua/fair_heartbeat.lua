-- fair_heartbeat.lua: one client's heartbeat for its queued waiters, batched per hash slot.
-- Shared by the fair lock and the read-write lock. Uses lib/queue.lua, lib/notify.lua and
-- lib/rw.lua.
--
-- Refreshes each listed waiter's lease, and on every lock that is free evicts dead waiters at
-- the head; if that uncovers a live head, it is told with a `name` event (a reader at the head
-- of a read-write lock: one `chain` event naming the readers that may go now, see fl_wake_head
-- in lib/rw.lua). A free fair lock with a live head is always stalled (releases grant the lock
-- to the head, lib/fair.lua): a grant to a waiter that died ran out, or a holder's lease did;
-- its head is named even when nobody was evicted. Thanks to this, a waiter that died at the
-- head of a free lock stalls the queue for at most one waiter lease plus one heartbeat.
--
-- KEYS[1] events, KEYS[2] seq (the shard's)
-- KEYS[4i-1], KEYS[4i], KEYS[4i+1], KEYS[4i+2]   hold (fair hold hash or read-write hash H),
--                                    queue, alive and bids keys of the i-th lock (i = 1..m)
-- ARGV[1] waiter lease in ms
-- ARGV[2] notification mode, ARGV[3] stream max length (see lib/notify.lua)
-- then for each lock i: its lock id, the number n of waiter ids, and the n waiter ids
--
-- Returns one code per waiter id, in order: 1 refreshed, 0 not queued (evicted or already
-- acquired; an evicted waiter that is still alive re-joins at the tail on its next attempt).
fl_expect_events(KEYS[1], KEYS[2], ARGV[2])
for i = 3, #KEYS, 4 do
  fl_expect(KEYS[i], 'hash')
  fl_expect(KEYS[i + 1], 'list')
  fl_expect(KEYS[i + 2], 'zset')
  fl_expect(KEYS[i + 3], 'hash')
end
local lease = tonumber(ARGV[1])
local now = fl_now()
local codes = {}
local arg = 4
local lock = 1
while arg <= #ARGV do
  local base = 4 * lock - 1
  local hold, queue, alive, bids = KEYS[base], KEYS[base + 1], KEYS[base + 2], KEYS[base + 3]
  local lock_id, n = ARGV[arg], tonumber(ARGV[arg + 1])
  arg = arg + 2
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
  -- Free: no exclusive owner (fair lock: o) and no writer (read-write lock: w).
  if not redis.call('HGET', hold, 'o') and not redis.call('HGET', hold, 'w') then
    local head, evicted = fl_head(queue, alive, now, bids)
    local fair = string.sub(lock_id, 1, 3) ~= 'rw:'
    if head and (evicted > 0 or fair) then
      fl_wake_head(queue, alive, head, now, KEYS[1], KEYS[2], ARGV[2], ARGV[3], lock_id)
    end
  end
  lock = lock + 1
end
return codes
