-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs (after
-- lib/queue.lua, whose fl_now it uses), and for the queue scripts shared with the fair lock
-- (queue_leave.lua, queue_heartbeat.lua). Not a script of its own.
--
-- State of one read-write lock:
--   hold hash      w = writer owner, wc = write count, wf = write fencing token,
--                  we = write lease end (server ms); per reader owner X: rc:X = read count,
--                  rt:X = read token; per owner X with holds: op:X = last op id of X
--   readers ZSET   reader owner -> lease end (server ms): each read hold expires on its own
--   done ZSET      op ids of final releases -> end of their retry window (answers retries)
-- Key TTLs only collect garbage: they follow the latest lease end plus the retry window.
--
-- fl_rw_purge(hold, readers, now)      -> writer owner or false, number of live reader owners;
--                                         drops expired write and read holds first
-- fl_rw_keep(hold, readers, now, tomb) -> sets the key TTLs after a change
-- fl_rw_holds(hold, owner)             -> true if owner still has a read or write hold
-- fl_rw_done(hold, done, owner, op, now, tomb) -> records op as owner's last op; if owner has
--                                         no hold left, forgets its op field and remembers op
--                                         in done instead
-- fl_rw_admitted(queue, alive, now)    -> the waiter ids of the live readers at the head of the
--                                         queue, up to the first live writer (the readers
--                                         rw_acquire.lua admits now; dead entries, whose waiter
--                                         lease in alive has passed or is missing, are
--                                         skipped), at most FL_RW_NAMED of them; and true when
--                                         that list is incomplete (more admitted readers, or
--                                         FL_RW_SCAN entries scanned without reaching a live
--                                         writer)
-- fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id) -> emits ONE
--                                         event for the live head `head`: a writer is named
--                                         (rule `name`, only it wakes); for a reader, rule
--                                         `chain` names the admitted readers: target = their
--                                         ids joined by ',' (waiter ids are 'r' or 'w' and hex
--                                         digits, never a ',' or '|'), or '*' when the list is
--                                         incomplete (every local reader of the lock wakes)
-- fl_rw_wake(queue, alive, now, events, seq, mode, maxlen, lock_id) -> when waiters are
--                                         queued, evicts dead heads and announces the first
--                                         live one (above)
-- For the queue scripts, which serve both kinds and take the kind as an argument:
-- fl_queue_kind(kind)                  -> kind when it is "fair" or "rw"; raises an error
--                                         (before the script writes anything) otherwise
-- fl_queue_free(kind, hold)            -> true when nobody holds the lock exclusively: no
--                                         owner `o` (fair), no writer `w` (read-write; readers
--                                         may hold it)
-- fl_wake_head(kind, queue, alive, head, now, events, seq, mode, maxlen, lock_id) -> announces
--                                         `head` as above for a read-write lock, names it for
--                                         a fair lock
-- The wake functions need lib/queue.lua and lib/notify.lua before this file.
local function fl_rw_purge(hold, readers, now)
  local expired = redis.call('ZRANGEBYSCORE', readers, '-inf', now)
  for _, owner in ipairs(expired) do
    redis.call('HDEL', hold, 'rc:' .. owner, 'rt:' .. owner, 'op:' .. owner)
  end
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
  end
  local writer = redis.call('HGET', hold, 'w')
  if writer and tonumber(redis.call('HGET', hold, 'we')) <= now then
    redis.call('HDEL', hold, 'w', 'wc', 'wf', 'we')
    if not redis.call('HGET', hold, 'rc:' .. writer) then
      redis.call('HDEL', hold, 'op:' .. writer)
    end
    writer = false
  end
  return writer, redis.call('ZCARD', readers)
end

local function fl_rw_keep(hold, readers, now, tomb)
  local last = tonumber(redis.call('HGET', hold, 'we') or 0)
  local top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
  if top[2] and tonumber(top[2]) > last then
    last = tonumber(top[2])
  end
  local ttl = last - now + tomb
  if ttl < tomb then
    ttl = tomb
  end
  if redis.call('EXISTS', hold) == 1 then
    redis.call('PEXPIRE', hold, ttl)
  end
  if redis.call('EXISTS', readers) == 1 then
    redis.call('PEXPIRE', readers, ttl)
  end
end

local function fl_rw_holds(hold, owner)
  return redis.call('HGET', hold, 'w') == owner
    or redis.call('HEXISTS', hold, 'rc:' .. owner) == 1
end

local function fl_rw_done(hold, done, owner, op, now, tomb)
  if fl_rw_holds(hold, owner) then
    redis.call('HSET', hold, 'op:' .. owner, op)
  else
    redis.call('HDEL', hold, 'op:' .. owner)
    redis.call('ZREMRANGEBYSCORE', done, '-inf', now)
    redis.call('ZADD', done, now + tomb, op)
    redis.call('PEXPIRE', done, tomb)
  end
end

-- Most reader ids one event names, and most queue entries one announcement looks at.
local FL_RW_NAMED = 32
local FL_RW_SCAN = 256

local function fl_rw_admitted(queue, alive, now)
  local ids = {}
  local scanned = 0
  while scanned < FL_RW_SCAN do
    local batch = redis.call('LRANGE', queue, scanned, scanned + 63)
    if #batch == 0 then
      return ids, false
    end
    for _, entry in ipairs(batch) do
      local expiry = redis.call('ZSCORE', alive, entry)
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

local function fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  if string.sub(head, 1, 1) == 'w' then
    fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
    return
  end
  local ids, incomplete = fl_rw_admitted(queue, alive, now)
  local target = '*'
  if not incomplete and #ids > 0 then
    target = table.concat(ids, ',')
  end
  fl_emit(events, seq, mode, maxlen, lock_id, 'chain', target)
end

local function fl_rw_wake(queue, alive, now, events, seq, mode, maxlen, lock_id)
  local head = fl_head(queue, alive, now)
  if head then
    fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  end
end

local function fl_queue_kind(kind)
  if kind ~= 'fair' and kind ~= 'rw' then
    error('ERR fredlock: unknown lock kind ' .. tostring(kind) .. ' (expected fair or rw)')
  end
  return kind
end

local function fl_queue_free(kind, hold)
  if kind == 'fair' then
    return not redis.call('HGET', hold, 'o')
  end
  return not redis.call('HGET', hold, 'w')
end

local function fl_wake_head(kind, queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  if kind == 'rw' then
    fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  else
    fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
  end
end
