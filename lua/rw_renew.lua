-- rw_renew.lua: renew (or extend) a batch of read and write holds, all in one hash slot.
-- Uses lib/queue.lua and lib/rw.lua.
--
-- A batch script (lua/README.md): one group of keys per hold.
-- KEYS[2i-1], KEYS[2i]    hold and readers of the i-th hold's lock (see lib/rw.lua)
-- ARGV[1] lease           lease in ms: each renewed hold ends this long from now; 0 checks
--                         the holds without renewing them (after signs of a data loss)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]   side ("read" or "write"), owner id and fencing token of
--                         hold i
--
-- Returns one code per hold: 1 renewed (with lease 0: held), 0 gone (expired or deleted), -2 the owner holds it
-- under another token (this hold was lost meanwhile). A read hold never blocks renewing another
-- reader's hold, and renewing one never extends another.
local lease = tonumber(ARGV[1])
local now = fl_now()
-- Reads first, for every hold (lib/rw.lua): its lock's hash (HMGET) and, unless it is a live
-- write hold of an owner that does not read too (no other hold can be live beside it), its
-- readers ZSET.
local holds = {}
for i = 1, #KEYS / 2 do
  local hold, readers = KEYS[2 * i - 1], KEYS[2 * i]
  local owner = ARGV[3 * i]
  local f = fl_rw_read(hold, owner)
  local purge
  if not (ARGV[3 * i - 1] == 'write' and f.w == owner and tonumber(f.we) > now and not f.rc) then
    purge = fl_rw_purge(hold, readers, f, owner, now)
  end
  holds[i] = {f = f, purge = purge}
end
local codes = {}
for i = 1, #KEYS / 2 do
  local hold, readers = KEYS[2 * i - 1], KEYS[2 * i]
  local side, owner, token = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local f, purge = holds[i].f, holds[i].purge
  if purge then
    fl_rw_apply(hold, readers, purge, now)
  end
  if side == 'write' then
    if f.w ~= owner then
      codes[i] = 0
    elseif f.wf ~= token then
      codes[i] = -2
    else
      if lease > 0 then
        f.we = now + lease
        redis.call('HSET', hold, 'we', f.we)
      end
      codes[i] = 1
    end
  else
    if not f.rt then
      codes[i] = 0
    elseif f.rt ~= token then
      codes[i] = -2
    else
      if lease > 0 then
        redis.call('ZADD', readers, now + lease, owner)
      end
      codes[i] = 1
    end
  end
  if codes[i] == 1 and lease > 0 then
    fl_rw_keep(hold, readers, now, lease, f.w and f.we, purge and purge.any)
  end
end
return codes
