-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs (after
-- lib/queue.lua, whose fl_now it uses), also for its queue scripts (queue_leave.lua,
-- queue_heartbeat.lua). Not a script of its own.
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
-- fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id) -> tells the
--                                         live head `head`: a writer is named (rule `name`,
--                                         only it wakes); for a reader, rule `chain` names the
--                                         admitted readers: target = their ids joined by ','.
--                                         A waiter id is 'r' or 'w', its client's inbox tag,
--                                         '.', an op id (never a ',' or '|'), so each event
--                                         goes to the inbox of the clients concerned alone:
--                                         one `name` event, or one `chain` event per client
--                                         with admitted readers, naming its own (fl_emit_to in
--                                         lib/notify.lua). When a client is not there to hear
--                                         it, or the list is incomplete, ONE event on the
--                                         shard's stream or channel serves them all instead
--                                         (target '*' when incomplete: every local reader of
--                                         the lock wakes)
-- fl_rw_wake(queue, alive, now, events, seq, mode, maxlen, lock_id) -> when waiters are
--                                         queued, evicts dead heads and announces the first
--                                         live one (above)
-- For the queue scripts, which take the kind of the queue's lock as an argument:
-- fl_queue_kind(kind)                  -> kind when it is "rw" (the only lock kind whose queue
--                                         is kept apart from its hash); raises an error
--                                         (before the script writes anything) otherwise
-- fl_queue_free(hold)                  -> true when no writer `w` holds the lock (readers may)
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

local function fl_rw_inbox(events, id)
  local tag = string.match(id, '^[rw](%w+)%.')
  return tag and events .. ':to:' .. tag
end

local function fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  if string.sub(head, 1, 1) == 'w' then
    local inbox = fl_rw_inbox(events, head)
    if not (inbox and fl_emit_to(inbox, mode, '0|name|' .. head .. '|' .. lock_id)) then
      fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
    end
    return
  end
  local ids, incomplete = fl_rw_admitted(queue, alive, now)
  if incomplete or #ids == 0 then
    fl_emit(events, seq, mode, maxlen, lock_id, 'chain', '*')
    return
  end
  local inboxes, order = {}, {}
  for _, id in ipairs(ids) do
    local inbox = fl_rw_inbox(events, id)
    if not inbox then
      fl_emit(events, seq, mode, maxlen, lock_id, 'chain', table.concat(ids, ','))
      return
    end
    if not inboxes[inbox] then
      inboxes[inbox] = {}
      order[#order + 1] = inbox
    end
    local mine = inboxes[inbox]
    mine[#mine + 1] = id
  end
  local missed = {}
  for _, inbox in ipairs(order) do
    local target = table.concat(inboxes[inbox], ',')
    if not fl_emit_to(inbox, mode, '0|chain|' .. target .. '|' .. lock_id) then
      missed[#missed + 1] = target
    end
  end
  if #missed > 0 then
    fl_emit(events, seq, mode, maxlen, lock_id, 'chain', table.concat(missed, ','))
  end
end

local function fl_rw_wake(queue, alive, now, events, seq, mode, maxlen, lock_id)
  local head = fl_head(queue, alive, now)
  if head then
    fl_rw_announce(queue, alive, head, now, events, seq, mode, maxlen, lock_id)
  end
end

local function fl_queue_kind(kind)
  if kind ~= 'rw' then
    error('ERR fredlock: unknown lock kind ' .. tostring(kind) .. ' (expected rw)')
  end
  return kind
end

local function fl_queue_free(hold)
  return not redis.call('HGET', hold, 'w')
end
