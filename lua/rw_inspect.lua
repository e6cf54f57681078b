-- rw_inspect.lua: read a read-write lock without changing it (one atomic snapshot).
-- Uses lib/queue.lua (fl_now).
--
-- KEYS[1] hold, KEYS[2] readers (see lib/rw.lua)
-- ARGV    none
--
-- Returns {write held (0|1), write hold count, write fencing token (0 when free),
--          live reader owners, ms until the last live hold ends (-2 when free)}.
local hold, readers = KEYS[1], KEYS[2]
-- Typed reads only (HMGET, ZCOUNT, ZRANGE): a foreign value fails with WRONGTYPE.
local v = redis.call('HMGET', hold, 'w', 'we', 'wc', 'wf')
local now = fl_now()
local writer, we = v[1], tonumber(v[2] or 0)
local last = -2
local held, count, token = 0, 0, 0
if writer and we > now then
  held, count, token = 1, tonumber(v[3]), tonumber(v[4])
  last = we - now
end
local reader_count = redis.call('ZCOUNT', readers, '(' .. now, '+inf')
local top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) - now > last then
  last = tonumber(top[2]) - now
end
return {held, count, token, reader_count, last}
