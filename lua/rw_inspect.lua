-- rw_inspect.lua: read a read-write lock without changing it (one atomic snapshot).
-- Uses lib/queue.lua (fl_now).
--
-- KEYS[1] hold, KEYS[2] readers (see lib/rw.lua)
-- ARGV    none
--
-- Returns {write held (0|1), write hold count, write fencing token (0 when free),
--          live reader owners, ms until the last live hold ends (-2 when free)}.
local hold, readers = KEYS[1], KEYS[2]
fl_expect(hold, 'hash')
fl_expect(readers, 'zset')
local now = fl_now()
local writer = redis.call('HGET', hold, 'w')
local we = tonumber(redis.call('HGET', hold, 'we') or 0)
local last = -2
local held, count, token = 0, 0, 0
if writer and we > now then
  held, count, token = 1, tonumber(redis.call('HGET', hold, 'wc')), tonumber(redis.call('HGET', hold, 'wf'))
  last = we - now
end
local reader_count = redis.call('ZCOUNT', readers, '(' .. now, '+inf')
local top = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) - now > last then
  last = tonumber(top[2]) - now
end
return {held, count, token, reader_count, last}
