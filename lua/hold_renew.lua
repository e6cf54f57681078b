-- hold_renew.lua: renew (or extend) a batch of holds, all in one hash slot.
-- Serves the exclusive locks (lib/hold.lua): a renewal also records the new ttl in field l,
-- the bound the lock's waiters are given.
--
-- A batch script (lua/README.md): one group of keys per hold.
-- KEYS[i]         hold hash of the i-th lock
-- ARGV[1] lease   lease in ms: each renewed hold expires this long from now; 0 checks the
--                 holds without renewing them (after the client saw signs of a data loss)
-- ARGV[2i], ARGV[2i+1]   owner id and fencing token of the i-th hold
--
-- Returns an array with one code per key:
--   1 renewed (or, with lease 0, held), 0 the key is gone (expired or deleted), -1 another owner holds it,
--  -2 the same owner holds it under a newer fencing token (this hold was lost meanwhile).
for _, key in ipairs(KEYS) do
  fl_expect(key, 'hash')
end
local lease = tonumber(ARGV[1])
local codes = {}
for i, hold in ipairs(KEYS) do
  local fields = redis.call('HMGET', hold, 'o', 'f')
  local owner, token = ARGV[2 * i], ARGV[2 * i + 1]
  if not fields[1] or fields[1] == '' then
    codes[i] = 0
  elseif fields[1] ~= owner then
    codes[i] = -1
  elseif fields[2] ~= token then
    codes[i] = -2
  else
    if lease > 0 then
      redis.call('HSET', hold, 'l', lease)
      redis.call('PEXPIRE', hold, lease)
    end
    codes[i] = 1
  end
end
return codes
