-- hold_renew.lua: renew (or extend) a batch of holds, all in one hash slot.
-- Serves the exclusive locks (lib/hold.lua): a renewal also records the new ttl in field l,
-- the bound the lock's waiters are given.
--
-- A batch script (lua/README.md): one group of keys per hold.
-- KEYS[2i-1] hold  hold hash of the i-th lock
-- KEYS[2i] queue   its wait queue (lib/hold.lua), extended when the renewed hold would
--                 outlast it (field k)
-- ARGV[1] lease   lease in ms: each renewed hold expires this long from now; 0 checks the
--                 holds without renewing them (after the client saw signs of a data loss)
-- ARGV[2i], ARGV[2i+1]   owner id and fencing token of the i-th hold
--
-- Returns an array with one code per hold:
--   1 renewed (or, with lease 0, held), 0 the key is gone (expired or deleted), -1 another owner holds it,
--  -2 the same owner holds it under a newer fencing token (this hold was lost meanwhile).
for i = 1, #KEYS, 2 do
  fl_expect(KEYS[i], 'hash')
  fl_expect(KEYS[i + 1], 'zset')
end
local lease = tonumber(ARGV[1])
local codes = {}
for i = 1, #KEYS / 2 do
  local hold, queue = KEYS[2 * i - 1], KEYS[2 * i]
  local fields = redis.call('HMGET', hold, 'o', 'f', 'q', 'k')
  local owner, token = ARGV[2 * i], ARGV[2 * i + 1]
  if not fields[1] or fields[1] == '' then
    codes[i] = 0
  elseif fields[1] ~= owner then
    codes[i] = -1
  elseif fields[2] ~= token then
    codes[i] = -2
  else
    if lease > 0 then
      local k, queue_ttl = fl_queue_outlast(fields[4], tonumber(fields[3]) or 0, ARGV[1])
      if k then
        redis.call('HSET', hold, 'l', ARGV[1], 'k', k)
        redis.call('PEXPIRE', queue, queue_ttl)
      else
        redis.call('HSET', hold, 'l', ARGV[1])
      end
      redis.call('PEXPIRE', hold, ARGV[1])
    end
    codes[i] = 1
  end
end
return codes
