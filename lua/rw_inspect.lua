-- rw_inspect.lua: read a read-write lock without changing it (one atomic snapshot).
-- Uses lib/queue.lua (fl_now).
--
-- KEYS[1] hold H, KEYS[2] readers R (see lib/rw.lua)
-- ARGV    none
--
-- Returns {write held (0|1), write hold count, write fencing token (0 when free),
--          live reader owners, ms until the last live hold ends (-2 when free)}.
fl_expect(KEYS[1], 'hash')
fl_expect(KEYS[2], 'zset')
local H, R = KEYS[1], KEYS[2]
local now = fl_now()
local writer = redis.call('HGET', H, 'w')
local we = tonumber(redis.call('HGET', H, 'we') or 0)
local last = -2
local held, count, token = 0, 0, 0
if writer and we > now then
  held, count, token = 1, tonumber(redis.call('HGET', H, 'wc')), tonumber(redis.call('HGET', H, 'wf'))
  last = we - now
end
local readers = redis.call('ZCOUNT', R, '(' .. now, '+inf')
local top = redis.call('ZRANGE', R, -1, -1, 'WITHSCORES')
if top[2] and tonumber(top[2]) - now > last then
  last = tonumber(top[2]) - now
end
return {held, count, token, readers, last}
