-- queue_heartbeat.lua: one client's heartbeat for its waiters queued on read-write locks,
-- batched per hash slot. Uses lib/queue.lua, lib/notify.lua and lib/rw.lua.
--
-- Refreshes each listed waiter's lease, and on every lock that no writer holds evicts dead
-- waiters at the head; if that uncovers a live head, it is told with a `name` event (a writer)
-- or one `chain` event naming the readers that may go now (fl_rw_announce in lib/rw.lua).
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
fl_expect_events(events, seq, mode)
-- Before any write: every lock's kind, and the type of every key the script touches.
local arg = 4
for base = 1, #KEYS - 2, 4 do
  fl_queue_kind(ARGV[arg])
  fl_expect(KEYS[base], 'hash')
  fl_expect(KEYS[base + 2], 'list')
  fl_expect(KEYS[base + 3], 'zset')
  arg = arg + 3 + tonumber(ARGV[arg + 2])
end
local now = fl_now()
local codes = {}
arg = 4
local base = 1
while arg <= #ARGV do
  local lock_id, n = ARGV[arg + 1], tonumber(ARGV[arg + 2])
  local hold, queue, alive = KEYS[base], KEYS[base + 2], KEYS[base + 3]
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
  fl_keep(queue, alive, lease)
  if fl_queue_free(hold) then
    local head, evicted = fl_head(queue, alive, now)
    if head and evicted > 0 then
      fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
    end
  end
  base = base + 4
end
return codes
