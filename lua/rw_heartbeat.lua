-- rw_heartbeat.lua: one client's heartbeat over its waiters queued on read-write locks,
-- batched per hash slot. Uses lib/hold.lua and lib/rw.lua.
--
-- A queued waiter of a read-write lock must show that it is alive: a writer that died waiting
-- would otherwise keep new readers out for as long as readers hold the lock. Each waiter's
-- sign of life in the queue carries the time until which it is known alive (lib/rw.lua);
-- this call moves that time a waiter lease on for each of the client's waiters still queued,
-- every third of the waiter lease. It also tells which waiters lost their place (a grant to them lapsed, or the
-- hash expired), so that the client wakes them to try again.
--
-- A batch script (lua/README.md): three keys per lock.
-- KEYS[3i-2] hold  the i-th lock's hash (see lib/rw.lua)
-- KEYS[3i-1] queue the i-th lock's wait queue (see lib/rw.lua)
-- KEYS[3i] reads   the ends of the i-th lock's read holds (see lib/rw.lua)
-- ARGV[1] waiter-lease  ms: each queued waiter of the call is known alive this long from now
-- ARGV             then for each lock i: the number n of waiter ids, then the n waiter ids
--
-- Returns one code per waiter id, in order: 1 queued (its time moved on), or granted a live
-- hold (the live write hold's g, or a live read hold's waiter column, is its id); 0
-- neither (it must try again); a WRONGTYPE error (and no change) when a key holds a foreign
-- value (each is read before any is written).
local waiter_lease = ARGV[1]
local alive_until = string.format('%d', math.floor(fl_now_us() / 1000) + tonumber(waiter_lease))
local now_ms = math.floor(fl_now_us() / 1000)
-- Every key is read (a typed read) before any is written: a foreign value under any key of the
-- batch fails the whole call before it changes anything.
local all = {}
for i = 1, #KEYS, 3 do
  all[i] = fl_rw_read(KEYS[i], '')
  fl_queue_call(KEYS[i + 1], 'ZCARD')
  fl_queue_call(KEYS[i + 2], 'ZCARD')
end
local codes = {}
local arg = 2
for i = 1, #KEYS, 3 do
  local hold, fields, queue, reads = KEYS[i], all[i], KEYS[i + 1], KEYS[i + 2]
  local state = fl_rw_state(reads, fields, now_ms, '')
  local moved = false
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    if fields[3] and fl_rw_queued(queue, id) then
      redis.call('ZADD', queue, 'XX', alive_until, id)
      moved = true
      codes[#codes + 1] = 1
    elseif (state.writer and fields[7] == id) or
        (state.readers > 0 and fl_rw_read_of(hold, reads, id, now_ms)) then
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
  if moved then
    redis.call('PEXPIRE', queue, waiter_lease)
  end
end
return codes
