-- hold_inspect.lua: read a hold without changing it (one atomic snapshot).
--
-- KEYS[1] hold hash {o, c, f}
-- ARGV    none
--
-- Returns {locked (0|1), hold count, fencing token (0 when free), remaining ttl in ms (-2 when free)}.
fl_expect(KEYS[1], 'hash')
local hold = KEYS[1]
local fields = redis.call('HMGET', hold, 'o', 'c', 'f')
if not fields[1] or fields[1] == '' then
  return {0, 0, 0, -2}
end
return {1, tonumber(fields[2]) or 0, tonumber(fields[3]) or 0, redis.call('PTTL', hold)}
