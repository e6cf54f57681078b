-- rw_inspect.lua: read a read-write lock without changing it (one atomic snapshot).
-- Uses lib/hold.lua and lib/rw.lua.
--
-- KEYS[1] hold     the lock's hash (see lib/rw.lua)
-- KEYS[2] queue    unused (kept for the canonical order)
-- KEYS[3] fence    unused
-- KEYS[4] events   unused
-- KEYS[5] ops      unused
-- KEYS[6] reads    the ends of the lock's read holds (see lib/rw.lua)
-- ARGV    none
--
-- Returns {write held (0|1), write hold count, write fencing token (0 when free), live reader
--          owners, ms until the last live hold ends (-2 when free)}; a WRONGTYPE error when the
--          key holds a foreign value (HMGET: a typed read).
local fields = fl_rw_read(KEYS[1], '')
local now_ms = math.floor(fl_now_us() / 1000)
local state = fl_rw_state(KEYS[6], fields, now_ms, '')
local last = fl_rw_last(state)
local held = state.writer and 1 or 0
return {held, held == 1 and tonumber(fields[2]) or 0, held == 1 and tonumber(fields[3]) or 0,
  state.readers, last > now_ms and math.ceil(last - now_ms) or -2}
