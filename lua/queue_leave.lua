-- queue_leave.lua: a waiter gives up (timeout or cancellation) and leaves the queue.
-- Serves every lock kind that queues its waiters in Redis, the fair lock and the read-write
-- lock, which share the queue (lib/queue.lua) and the way a turn passes on; the kind comes as
-- an argument and is checked (one script rather than one per kind: the two would differ only
-- in the free test and the announcement, see fl_wake_head). Uses lib/queue.lua, lib/notify.lua
-- and lib/rw.lua.
--
-- KEYS[1] hold     the fair lock's hold hash, or the read-write lock's hash
-- KEYS[2] bids     the fair lock's bids (see lib/fair.lua); for a read-write lock its readers
--                  (unused)
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- KEYS[6] queue, KEYS[7] alive (see lib/queue.lua)
-- ARGV[1..3]       unused
-- ARGV[4] waiter   the waiter id that leaves
-- ARGV[5]          unused
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] kind     "fair" or "rw"
--
-- A fair lock that a release had already granted to this waiter (field r = its waiter id, see
-- lib/fair.lua) is freed: the waiter never took the hold up. If the leaving waiter was the head
-- of a free lock (fair: no owner `o`; read-write: no writer `w`, readers may hold it), or had
-- been granted it, the turn passes on at once, without waiting for any lease: one `name` event
-- for the next live waiter, or for a read-write lock whose next live waiter is a reader, one
-- `chain` event naming the readers that may go now (fl_wake_head in lib/rw.lua).
-- Returns {1} when the waiter was queued (or granted the lock), {0} when it was not.
local kind = fl_queue_kind(ARGV[9])
local hold, events, seq, queue, alive = KEYS[1], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local bids = kind == 'fair' and KEYS[2] or nil
local id, mode, maxlen, lock_id = ARGV[4], ARGV[6], ARGV[7], ARGV[8]
fl_expect(hold, 'hash')
fl_expect(queue, 'list')
fl_expect(alive, 'zset')
if bids then
  fl_expect(bids, 'hash')
end
fl_expect_events(events, seq, mode)
local was_queued = redis.call('ZSCORE', alive, id) ~= false
local granted = kind == 'fair' and redis.call('HMGET', hold, 'o', 'r', 'x')
local was_head = fl_leave(queue, alive, id, bids)
if granted and granted[1] and granted[2] == id then
  -- Keep the ids of the release that granted it and of those before (x, see lib/hold.lua) as
  -- a tombstone, so that their retries are still answered.
  local ttl = redis.call('PTTL', hold)
  redis.call('DEL', hold)
  if granted[3] and ttl > 0 then
    redis.call('HSET', hold, 'x', granted[3])
    redis.call('PEXPIRE', hold, ttl)
  end
  was_queued, was_head = true, true
end
if was_head and fl_queue_free(kind, hold) then
  local now = fl_now()
  local head = fl_head(queue, alive, now, bids)
  if head then
    fl_wake_head(kind, queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  end
end
if was_queued then
  return {1}
end
return {0}
