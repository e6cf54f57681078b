-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs (after
-- lib/queue.lua, whose fl_now it uses). Not a script of its own.
--
-- State of one read-write lock:
--   hold hash H    w = writer owner, wc = write count, wf = write fencing token,
--                  we = write lease end (server ms); per reader owner X: rc:X = read count,
--                  rt:X = read token; per owner X with holds: op:X = last op id of X
--   readers ZSET R reader owner -> lease end (server ms): each read hold expires on its own
--   done ZSET D    op ids of final releases -> end of their retry window (answers retries)
-- Key TTLs only collect garbage: they follow the latest lease end plus the retry window.
--
-- fl_rw_purge(H, R, now)        -> writer owner or false, number of live reader owners;
--                                  drops expired write and read holds first
-- fl_rw_keep(H, R, now, tomb)   -> sets the key TTLs after a change
-- fl_rw_holds(H, owner)         -> true if owner still has a read or write hold
-- fl_rw_done(H, D, owner, op, now, tomb) -> records op as owner's last op; if owner has no hold
--                                  left, forgets its op field and remembers op in D instead
-- fl_rw_admitted(Q, A, now)    -> the waiter ids of the live readers at the head of the queue,
--                                  up to the first live writer (the readers rw_acquire.lua
--                                  admits now; dead entries, whose waiter lease in A has passed
--                                  or is missing, are skipped), at most FL_RW_NAMED of them; and
--                                  true when that list is incomplete (more admitted readers, or
--                                  FL_RW_SCAN entries scanned without reaching a live writer)
-- fl_rw_announce(Q, A, head, now, events, seq, mode, maxlen, lock_id) -> emits ONE event for the
--                                  live head `head`: a writer is named (rule `name`, only it
--                                  wakes); for a reader, rule `chain` names the admitted readers:
--                                  target = their ids joined by ',' (waiter ids are 'r' or 'w'
--                                  and hex digits, never a ',' or '|'), or '*' when the list is
--                                  incomplete (every local reader of the lock wakes)
-- fl_rw_wake(Q, A, now, events, seq, mode, maxlen, lock_id) -> when waiters are queued, evicts
--                                  dead heads and announces the first live one (above)
-- fl_wake_head(Q, A, head, now, events, seq, mode, maxlen, lock_id) -> for the shared queue
--                                  scripts (fair_leave, fair_heartbeat): announces `head` as
--                                  above for a read-write lock (lock id "rw:..."), names it for
--                                  any other lock
-- The wake functions need lib/queue.lua and lib/notify.lua before this file.
local function fl_rw_purge(H, R, now)
  local expired = redis.call('ZRANGEBYSCORE', R, '-inf', now)
  for _, owner in ipairs(expired) do
    redis.call('HDEL', H, 'rc:' .. owner, 'rt:' .. owner, 'op:' .. owner)
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', R, '-inf', now)
  end
  local writer = redis.call('HGET', H, 'w')
  if writer and tonumber(redis.call('HGET', H, 'we')) <= now then
    redis.call('HDEL', H, 'w', 'wc', 'wf', 'we')
    if not redis.call('HGET', H, 'rc:' .. writer) then
      redis.call('HDEL', H, 'op:' .. writer)
    end
    writer = false
  end
  return writer, redis.call('ZCARD', R)
end

local function fl_rw_keep(H, R, now, tomb)
  local last = tonumber(redis.call('HGET', H, 'we') or 0)
  local top = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
  if top[2] and tonumber(top[2]) > last then
    last = tonumber(top[2])
  end
  local ttl = last - now + tomb
  if ttl < tomb then
    ttl = tomb
  end
  if redis.call('EXISTS', H) == 1 then
    redis.call('PEXPIRE', H, ttl)
  end
  if redis.call('EXISTS', R) == 1 then
    redis.call('PEXPIRE', R, ttl)
  end
end

local function fl_rw_holds(H, owner)
  return redis.call('HGET', H, 'w') == owner or redis.call('HEXISTS', H, 'rc:' .. owner) == 1
end

local function fl_rw_done(H, D, owner, op, now, tomb)
  if fl_rw_holds(H, owner) then
    redis.call('HSET', H, 'op:' .. owner, op)
  else
    redis.call('HDEL', H, 'op:' .. owner)
    redis.call('ZREMRANGEBYSCORE', D, '-inf', now)
    redis.call('ZADD', D, now + tomb, op)
    redis.call('PEXPIRE', D, tomb)
  end
end

-- Most reader ids one event names, and most queue entries one announcement looks at.
local FL_RW_NAMED = 32
local FL_RW_SCAN = 256

local function fl_rw_admitted(Q, A, now)
  local ids = {}
  local scanned = 0
  while scanned < FL_RW_SCAN do
    local batch = redis.call('LRANGE', Q, scanned, scanned + 63)
    if #batch == 0 then
      return ids, false
    end
    for _, entry in ipairs(batch) do
      local expiry = redis.call('ZSCORE', A, entry)
      if expiry and tonumber(expiry) > now then
        if string.sub(entry, 1, 1) == 'w' then
          return ids, false
        end
        if #ids == FL_RW_NAMED then
          return ids, true
        end
        ids[#ids + 1] = entry
      end
    end
    if #batch < 64 then
      return ids, false
    end
    scanned = scanned + #batch
  end
  return ids, true
end

local function fl_rw_announce(Q, A, head, now, events, seq, mode, maxlen, lock_id)
  if string.sub(head, 1, 1) == 'w' then
    fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
    return
  end
  local ids, incomplete = fl_rw_admitted(Q, A, now)
  local target = '*'
  if not incomplete and #ids > 0 then
    target = table.concat(ids, ',')
  end
  fl_emit(events, seq, mode, maxlen, lock_id, 'chain', target)
end

local function fl_rw_wake(Q, A, now, events, seq, mode, maxlen, lock_id)
  local head = fl_head(Q, A, now)
  if head then
    fl_rw_announce(Q, A, head, now, events, seq, mode, maxlen, lock_id)
  end
end

local function fl_wake_head(Q, A, head, now, events, seq, mode, maxlen, lock_id)
  if string.sub(lock_id, 1, 3) == 'rw:' then
    fl_rw_announce(Q, A, head, now, events, seq, mode, maxlen, lock_id)
  else
    fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
  end
end
