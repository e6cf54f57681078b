-- fair_heartbeat.lua: one client's heartbeat for its queued waiters, batched per hash slot.
-- Shared by the fair lock and the read-write lock. Uses lib/queue.lua, lib/notify.lua and
-- lib/rw.lua.
--
-- Refreshes each listed waiter's lease, and on every lock that is free evicts dead waiters at
-- the head; if that uncovers a live head, it is told with a `name` event (a reader at the head
-- of a read-write lock: one `chain` event naming the readers that may go now, see fl_wake_head
-- in lib/rw.lua). Thanks to this, a waiter that died at the head of a free lock stalls the
-- queue for at most one waiter lease.
--
-- KEYS[1] events, KEYS[2] seq (the shard's)
-- KEYS[3i], KEYS[3i+1], KEYS[3i+2]   hold (fair hold hash or read-write hash H), queue and
--                                    alive keys of the i-th lock (i = 1..m)
-- ARGV[1] waiter lease in ms
-- ARGV[2] notification mode, ARGV[3] stream max length (see lib/notify.lua)
-- then for each lock i: its lock id, the number n of waiter ids, and the n waiter ids
--
-- Returns one code per waiter id, in order: 1 refreshed, 0 not queued (evicted or already
-- acquired; an evicted waiter that is still alive re-joins at the tail on its next attempt).
fl_expect_events(KEYS[1], KEYS[2], ARGV[2])
for i = 3, #KEYS, 3 do
  fl_expect(KEYS[i], 'hash')
  fl_expect(KEYS[i + 1], 'list')
  fl_expect(KEYS[i + 2], 'zset')
end
local lease = tonumber(ARGV[1])
local now = fl_now()
local codes = {}
local arg = 4
local lock = 1
while arg <= #ARGV do
  local hold, queue, alive = KEYS[3 * lock], KEYS[3 * lock + 1], KEYS[3 * lock + 2]
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
  fl_keep(queue, alive, lease)
  -- Free: no exclusive owner (fair lock: o) and no writer (read-write lock: w).
  if not redis.call('HGET', hold, 'o') and not redis.call('HGET', hold, 'w') then
    local head, evicted = fl_head(queue, alive, now)
    if head and evicted > 0 then
      fl_wake_head(queue, alive, head, now, KEYS[1], KEYS[2], ARGV[2], ARGV[3], lock_id)
    end
  end
  lock = lock + 1
end
return codes
