-- rw_heartbeat.lua: one client's heartbeat over its waiters queued on read-write locks,
-- batched per hash slot. Uses lib/hold.lua and lib/rw.lua.
--
-- A queued waiter of a read-write lock must show that it is alive: a writer that died waiting
-- would otherwise keep new readers out for as long as readers hold the lock. Each queue line
-- carries the time until which its waiter is known alive (lib/rw.lua); this call moves that
-- time a waiter lease on for each of the client's waiters still queued, every third of the
-- waiter lease. It also tells which waiters lost their place (a grant to them lapsed, or the
-- hash expired), so that the client wakes them to try again.
--
-- A batch script (lua/README.md): one key per lock.
-- KEYS[i] hold     the i-th lock's hash (see lib/rw.lua)
-- ARGV[1] waiter-lease  ms: each queued waiter of the call is known alive this long from now
-- ARGV             then for each lock i: the number n of waiter ids, then the n waiter ids
--
-- Returns one code per waiter id, in order: 1 queued (its time moved on), or granted a live
-- hold (the live write hold's g, or a live read hold line's waiter column, is its id); 0
-- neither (it must try again); a WRONGTYPE error (and no change) when a hold key holds a foreign value (each key is
-- read with HMGET before it is written).
local now_ms = math.floor(fl_now_us() / 1000)
local alive_until = now_ms + tonumber(ARGV[1])
-- Every hash is read (a typed read) before any is written: a foreign value under any key of
-- the batch fails the whole call before it changes anything.
local all = {}
for i, hold in ipairs(KEYS) do
  all[i] = fl_rw_read(hold)
end
local codes = {}
local arg = 2
for i, hold in ipairs(KEYS) do
  local fields = all[i]
  local state = fl_rw_state(fields, now_ms, '')
  local q = fields[7] or ''
  local moved = q
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    local from, to = fl_rw_find(moved, id)
    if from then
      local line = string.sub(moved, from, to)
      local head = string.match(line, '^(.* )%d+\n$')
      moved = string.sub(moved, 1, from - 1) .. string.format('%s%d\n', head, alive_until) ..
        string.sub(moved, to + 1)
      codes[#codes + 1] = 1
    elseif (state.writer and fields[8] == id) or fl_find_word(state.others, id, 32, 10) then
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
  if moved ~= q then
    redis.call('HSET', hold, 'q', moved)
  end
end
return codes
