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
for i = 1, #KEYS, 2 do
  fl_expect(KEYS[i], 'hash')
  fl_expect(KEYS[i + 1], 'zset')
end
local lease = tonumber(ARGV[1])
local now = fl_now()
local codes = {}
for i = 1, #KEYS / 2 do
  local hold, readers = KEYS[2 * i - 1], KEYS[2 * i]
  local side, owner, token = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  local writer = fl_rw_purge(hold, readers, now)
  if side == 'write' then
    if writer ~= owner then
      codes[i] = 0
    elseif redis.call('HGET', hold, 'wf') ~= token then
      codes[i] = -2
    else
      if lease > 0 then
        redis.call('HSET', hold, 'we', now + lease)
      end
      codes[i] = 1
    end
  else
    local held = redis.call('HGET', hold, 'rt:' .. owner)
    if not held then
      codes[i] = 0
    elseif held ~= token then
      codes[i] = -2
    else
      if lease > 0 then
        redis.call('ZADD', readers, now + lease, owner)
      end
      codes[i] = 1
    end
  end
  if codes[i] == 1 and lease > 0 then
    fl_rw_keep(hold, readers, now, lease)
  end
end
return codes
