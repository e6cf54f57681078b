-- rw_release.lua: give back one read or write hold (or all of them) of a read-write lock.
-- Uses lib/queue.lua, lib/rw.lua and lib/notify.lua.
--
-- Freeing the write hold (a write unlock or the write half of a downgrade) and freeing the
-- last read hold each emit ONE event when waiters are queued (see fl_rw_plan in lib/rw.lua):
-- a writer at the head of the queue is woken by name; a reader at the head makes a `chain`
-- event that names every live reader up to the first live writer (the readers that may go now;
-- '*' for every reader when there are more than one event names).
--
-- KEYS[1] hold, KEYS[2] readers (see lib/rw.lua)
-- KEYS[3] fence    unused (passed for the canonical positions, lua/README.md)
-- KEYS[4] events, KEYS[5] seq (the shard's)
-- KEYS[6] queue, KEYS[7] alive (see lib/queue.lua)
-- KEYS[8] done     ZSET of final releases (see lib/rw.lua)
-- ARGV[1] owner    owner id
-- ARGV[2] token    fencing token of the hold being released
-- ARGV[3] op       op id, unique per call; a retried call with the same op id is answered, not
--                  re-applied
-- ARGV[4] all      "1" to release every hold of this side of the owner at once, "0" to release
--                  one
-- ARGV[5] window   retry window in ms
-- ARGV[6] mode, ARGV[7] maxlen, ARGV[8] lock-id   the event arguments (see lib/notify.lua)
-- ARGV[9] side     "read" or "write"
--
-- Returns {1, holds of this side left} when released, {0, 0} when not held (expired),
--         {-1, 0} when held under another token (a newer hold of this owner).
local hold, readers, events, seq = KEYS[1], KEYS[2], KEYS[4], KEYS[5]
local queue, alive, done = KEYS[6], KEYS[7], KEYS[8]
local owner, token, op, all, tomb = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local mode, maxlen, lock_id, side = ARGV[6], ARGV[7], ARGV[8], ARGV[9]

-- Reads first (lib/rw.lua), writes after. A write release reads `done` only to answer a
-- refused call (a retry of a final release: its hold, with its unique token, is gone); when it
-- frees the lock for good, the first write of the script is to `done` (fl_rw_forget).
local f = fl_rw_read(hold, owner)
local now = fl_now()
local was_done
local function retried()
  if was_done == nil then
    was_done = redis.call('ZSCORE', done, op) ~= false
  end
  return was_done
end
-- A read hold's token is the shard's last token, which a later read hold of the same owner
-- may carry again: a read release asks `done` first.
if side ~= 'write' and retried() then
  return {1, 0}
end

-- Its own live write hold excludes other holds: unless the owner reads too, the readers ZSET
-- has nothing to say (its expired entries wait for the next purge).
local purge
if not (side == 'write' and f.w and tonumber(f.we) > now and not f.rc) then
  purge = fl_rw_purge(hold, readers, f, owner, now)
  if fl_rw_purging(purge) and retried() then
    return {1, 0}
  end
end
local function begin_writes()
  if purge then
    fl_rw_apply(hold, readers, purge, now)
  end
end

if f.op == op then
  begin_writes()
  local count = f.rc
  if side == 'write' then
    count = f.wc
  end
  return {1, tonumber(count or 0)}
end

-- What the release changes: the fields it deletes or sets, whether it frees the lock, and
-- what stays held (the write lease end, whether read holds stay).
local left, freed, gone, set
if side == 'write' then
  if f.w ~= owner or f.wf ~= token then
    if retried() then
      return {1, 0}
    end
    begin_writes()
    return {f.w == owner and -1 or 0, 0}
  end
  left = tonumber(f.wc) - 1
  if all == '1' or left <= 0 then
    left, freed = 0, true
    gone = {'w', 'wc', 'wf', 'we'}
    f.w, f.we = false, false
  else
    set = {'wc', left}
  end
else
  if not f.rc then
    begin_writes()
    return {0, 0}
  end
  if f.rt ~= token then
    begin_writes()
    return {-1, 0}
  end
  left = tonumber(f.rc) - 1
  if all == '1' or left <= 0 then
    left = 0
    gone = {'rc:' .. owner, 'rt:' .. owner}
    f.rc = false
    -- The owner's read hold was one of the live ones.
    freed = fl_rw_count(readers, purge) == 1 and not f.w
  else
    set = {'rc:' .. owner, left}
  end
end
-- Does the owner keep a hold? Then its op field answers a retry; else `done` does.
local keeps = f.w == owner or f.rc
if keeps then
  set = set or {}
  set[#set + 1] = 'op:' .. owner
  set[#set + 1] = op
else
  gone[#gone + 1] = 'op:' .. owner
end
local dead, plan = {}, false
if freed then
  dead, plan = fl_rw_next(queue, alive, now, 0, events, seq, mode)
end
-- Read holds left after it: none when the lock was freed, else (a count) ask the ZSET.
local top = false
if purge and (side == 'write' or not freed) then
  top = purge.any
end

if not keeps then
  fl_rw_forget(done, op, now, tomb)
end
begin_writes()
if gone then
  redis.call('HDEL', hold, unpack(gone))
end
if set then
  redis.call('HSET', hold, unpack(set))
end
if side ~= 'write' and gone then
  redis.call('ZREM', readers, owner)
end
if f.w or top then
  fl_rw_keep(hold, readers, now, tomb, f.we, top)
end
if freed then
  fl_drop(queue, alive, #dead, dead)
  if plan then
    fl_rw_announce(plan, events, seq, mode, maxlen, lock_id)
  end
end
return {1, left}
