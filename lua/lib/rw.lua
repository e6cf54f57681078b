-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs (after
-- lib/queue.lua, whose fl_now, fl_peek and fl_drop it uses), also for its queue scripts
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
-- Reads before writes. A script is not a transaction (lib/check.lua), so every script here
-- reads first and writes after: each key's first access is a typed read (HMGET/HGET on the
-- hash, ZRANGE/ZSCORE/ZCARD on a ZSET, LRANGE/LLEN on the queue, GET on the fence), which
-- fails with WRONGTYPE on a foreign value while nothing is written yet. The functions below
-- that only read say so; the others write. Where a key's first access is a write, it is the
-- script's very first write (its header says where): a foreign value fails it before anything
-- was written. Expired holds are purged the same way: planned while reading (fl_rw_purge),
-- written with the script's first writes (fl_rw_apply).
--
-- fl_rw_read(hold, owner)              -> {w, wc, wf, we, op, rc, rt}: the write hold's fields
--                                         and owner's op:X, rc:X, rt:X, false where absent
--                                         (one HMGET). Reads only
-- fl_rw_purge(hold, readers, f, owner, now) -> the plan that drops the expired write and read
--                                         holds, and whether live read holds remain (`any`).
--                                         Turns f (fl_rw_read) into the state after the purge.
--                                         Reads only (ZRANGE; ZRANGEBYSCORE and ZCARD when a
--                                         read hold expired, HEXISTS when the write hold did)
-- fl_rw_purging(plan)                  -> true when the plan writes anything
-- fl_rw_apply(hold, readers, plan, now) -> writes the plan
-- fl_rw_count(readers, plan)           -> the number of live read holds after the purge
-- fl_rw_keep(hold, readers, now, tomb, we, top) -> sets the key TTLs after a change: the later
--                                         of the write lease end `we` (or false) and the last
--                                         read lease end `top` (a number; true: read it; false:
--                                         no read hold), plus tomb, at least tomb
-- fl_rw_forget(done, op, now, tomb)    -> remembers op in done (a final release: its owner has
--                                         no hold left, its op field is deleted)
-- fl_rw_may_go(queue, alive, id, now)  -> whether the reader with waiter id `id` may go (no
--                                         live writer queued ahead of it), the dead writers met
--                                         before it (to drop) and whether `id` is queued. Reads
--                                         only (LRANGE, ZSCORE)
-- fl_rw_admitted(queue, alive, from, now, live) -> the waiter ids of the live readers from
--                                         queue position `from` on, up to the first live writer
--                                         (the readers rw_acquire.lua admits now; dead entries,
--                                         whose waiter lease in alive has passed or is missing,
--                                         are skipped), at most FL_RW_NAMED of them; and true
--                                         when that list is incomplete (more admitted readers,
--                                         or FL_RW_SCAN entries scanned without reaching a live
--                                         writer). Reads only
-- fl_rw_plan(queue, alive, head, from, now, events, seq, mode, live) -> the announcement for
--                                         the live head `head`, at queue position `from`:
--                                         a writer is named (rule `name`, only it wakes); for
--                                         a reader, rule `chain` names the admitted readers:
--                                         target = their ids joined by ','. A waiter id is 'r'
--                                         or 'w', its client's inbox tag, '.', an op id (never
--                                         a ',' or '|'), so each event goes to the inbox of the
--                                         clients concerned alone: one `name` event, or one
--                                         `chain` event per client with admitted readers,
--                                         naming its own (fl_emit_to in lib/notify.lua). When a
--                                         client is not there to hear it, or the list is
--                                         incomplete, ONE event on the shard's stream or
--                                         channel serves them all instead (target '*' when
--                                         incomplete: every local reader of the lock wakes).
--                                         Reads only: it checks the shard's stream and counter
--                                         (fl_expect_events) unless every inbox it sends to is
--                                         a stream, which then takes the event for sure
-- fl_rw_announce(plan, events, seq, mode, maxlen, lock_id) -> sends it
-- fl_rw_next(queue, alive, now, from, events, seq, mode, live) -> the dead waiters before the
--                                         first live one at or after position `from` (fl_peek)
--                                         and the plan that announces it, or false when nobody
--                                         waits. Reads only; the caller drops the dead
--                                         (fl_drop) and sends the plan (fl_rw_announce) after
--                                         its other writes
-- For the queue scripts, which take the kind of the queue's lock as an argument:
-- fl_queue_kind(kind)                  -> kind when it is "rw" (the only lock kind whose queue
--                                         is kept apart from its hash); raises an error
--                                         (before the script writes anything) otherwise
-- fl_queue_free(hold)                  -> true when no writer `w` holds the lock (readers may).
--                                         Reads only (HGET)
-- The wake functions need lib/queue.lua and lib/notify.lua before this file.
local function fl_rw_read(hold, owner)
  local v = redis.call('HMGET', hold, 'w', 'wc', 'wf', 'we',
    'op:' .. owner, 'rc:' .. owner, 'rt:' .. owner)
  return {w = v[1], wc = v[2], wf = v[3], we = v[4], op = v[5], rc = v[6], rt = v[7]}
end

local function fl_rw_purge(hold, readers, f, owner, now)
  local plan = {fields = {}, readers = false, any = false}
  local first = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
  local gone = {}
  if first[2] and tonumber(first[2]) <= now then
    local expired = redis.call('ZRANGEBYSCORE', readers, '-inf', now)
    plan.readers = true
    plan.count = redis.call('ZCARD', readers) - #expired
    plan.any = plan.count > 0
    for _, reader in ipairs(expired) do
      local fields = plan.fields
      fields[#fields + 1] = 'rc:' .. reader
      fields[#fields + 1] = 'rt:' .. reader
      fields[#fields + 1] = 'op:' .. reader
      gone[reader] = true
    end
    if gone[owner] then
      f.rc, f.rt, f.op = false, false, false
    end
  else
    plan.any = first[1] ~= nil
  end
  local writer = f.w
  if writer and tonumber(f.we) <= now then
    local fields = plan.fields
    fields[#fields + 1] = 'w'
    fields[#fields + 1] = 'wc'
    fields[#fields + 1] = 'wf'
    fields[#fields + 1] = 'we'
    -- The writer's op field goes with its last hold (a read hold of its own may stay).
    local reads
    if writer == owner then
      reads = f.rc
    else
      reads = not gone[writer] and redis.call('HEXISTS', hold, 'rc:' .. writer) == 1
    end
    if not reads then
      fields[#fields + 1] = 'op:' .. writer
      if writer == owner then
        f.op = false
      end
    end
    f.w, f.wc, f.wf, f.we = false, false, false, false
  end
  return plan
end

local function fl_rw_purging(plan)
  return plan.readers or #plan.fields > 0
end

local function fl_rw_apply(hold, readers, plan, now)
  local fields = plan.fields
  for first = 1, #fields, 96 do
    redis.call('HDEL', hold, unpack(fields, first, math.min(first + 95, #fields)))
  end
  if plan.readers then
    redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
  end
end

local function fl_rw_count(readers, plan)
  if not plan.count then
    -- Nothing expired: every member is live.
    plan.count = plan.any and redis.call('ZCARD', readers) or 0
  end
  return plan.count
end

local function fl_rw_keep(hold, readers, now, tomb, we, top)
  if top == true then
    top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]
    top = top and tonumber(top)
  end
  local last = tonumber(we or 0)
  if top and top > last then
    last = top
  end
  local ttl = last - now + tomb
  if ttl < tomb then
    ttl = tomb
  end
  -- PEXPIRE on a missing key does nothing: no EXISTS first.
  redis.call('PEXPIRE', hold, ttl)
  if top then
    redis.call('PEXPIRE', readers, ttl)
  end
end

local function fl_rw_forget(done, op, now, tomb)
  redis.call('ZREMRANGEBYSCORE', done, '-inf', now)
  redis.call('ZADD', done, now + tomb, op)
  redis.call('PEXPIRE', done, tomb)
end

local function fl_rw_may_go(queue, alive, id, now)
  local dead = {}
  local entries = redis.call('LRANGE', queue, 0, -1)
  for _, entry in ipairs(entries) do
    if entry == id then
      return true, dead, true
    end
    if string.sub(entry, 1, 1) == 'w' then
      local expiry = redis.call('ZSCORE', alive, entry)
      if expiry and tonumber(expiry) > now then
        return false, dead, false
      end
      dead[#dead + 1] = entry
    end
  end
  return true, dead, false
end

-- Most reader ids one event names, and most queue entries one announcement looks at.
local FL_RW_NAMED = 32
local FL_RW_SCAN = 256

local function fl_rw_admitted(queue, alive, from, now, live)
  local ids = {}
  local scanned = 0
  while scanned < FL_RW_SCAN do
    local batch = redis.call('LRANGE', queue, from + scanned, from + scanned + 63)
    if #batch == 0 then
      return ids, false
    end
    for _, entry in ipairs(batch) do
      local alive_now = live and live[entry]
      if not alive_now then
        local expiry = redis.call('ZSCORE', alive, entry)
        alive_now = expiry and tonumber(expiry) > now
      end
      if alive_now then
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

-- True when an event for this inbox cannot miss: a stream in a Stream mode (fl_emit_to adds to
-- it whatever happens; the script has written already, so no memory check refuses it).
local function fl_rw_listens(inbox, mode)
  return (mode == 'stream' or mode == 'stream6') and redis.call('TYPE', inbox).ok == 'stream'
end

local function fl_rw_plan(queue, alive, head, from, now, events, seq, mode, live)
  local plan = {head = head}
  if string.sub(head, 1, 1) == 'w' then
    plan.inbox = fl_rw_inbox(events, head)
    if not (plan.inbox and fl_rw_listens(plan.inbox, mode)) then
      fl_expect_events(events, seq, mode)
    end
    return plan
  end
  local ids, incomplete = fl_rw_admitted(queue, alive, from, now, live)
  plan.ids = ids
  local sure = not incomplete and #ids > 0
  if sure then
    local inboxes, order = {}, {}
    for _, id in ipairs(ids) do
      local inbox = fl_rw_inbox(events, id)
      if not inbox then
        sure, order = false, nil
        break
      end
      if not inboxes[inbox] then
        inboxes[inbox] = {}
        order[#order + 1] = inbox
      end
      local mine = inboxes[inbox]
      mine[#mine + 1] = id
    end
    plan.inboxes, plan.order = inboxes, order
    for _, inbox in ipairs(order or {}) do
      if sure and not fl_rw_listens(inbox, mode) then
        sure = false
      end
    end
  end
  plan.incomplete = incomplete
  if not sure then
    fl_expect_events(events, seq, mode)
  end
  return plan
end

local function fl_rw_announce(plan, events, seq, mode, maxlen, lock_id)
  local head = plan.head
  if not plan.ids then
    local inbox = plan.inbox
    if not (inbox and fl_emit_to(inbox, mode, '0|name|' .. head .. '|' .. lock_id)) then
      fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
    end
    return
  end
  local ids = plan.ids
  if plan.incomplete or #ids == 0 then
    fl_emit(events, seq, mode, maxlen, lock_id, 'chain', '*')
    return
  end
  if not plan.order then
    -- A reader without an inbox tag: one event on the shard's stream names them all.
    fl_emit(events, seq, mode, maxlen, lock_id, 'chain', table.concat(ids, ','))
    return
  end
  local missed = {}
  for _, inbox in ipairs(plan.order) do
    local target = table.concat(plan.inboxes[inbox], ',')
    if not fl_emit_to(inbox, mode, '0|chain|' .. target .. '|' .. lock_id) then
      missed[#missed + 1] = target
    end
  end
  if #missed > 0 then
    fl_emit(events, seq, mode, maxlen, lock_id, 'chain', table.concat(missed, ','))
  end
end

local function fl_rw_next(queue, alive, now, from, events, seq, mode, live)
  local head, dead = fl_peek(queue, alive, now, from, live)
  if not head then
    return dead, false
  end
  return dead, fl_rw_plan(queue, alive, head, from + #dead, now, events, seq, mode, live)
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
