-- rw_heartbeat.lua: one client's check of its waiters queued on read-write locks, batched per
-- hash slot. Read only. Uses lib/hold.lua and lib/rw.lua.
--
-- The read-write lock's counterpart of hold_heartbeat.lua (see there why): a waiter whose
-- place is gone (its grant lapsed with its client, or the hash expired) is woken to try again.
--
-- A batch script (lua/README.md): one key per lock.
-- KEYS[i] hold     the i-th lock's hash (see lib/rw.lua)
-- ARGV             for each lock i: the number n of waiter ids, then the n waiter ids
--
-- Returns one code per waiter id, in order: 1 queued, or granted a hold (the write hold's g,
-- or a read hold line's waiter column, is its id); 0 neither (it must try again);
--         a WRONGTYPE error when a hold key holds a foreign value.
local codes = {}
local arg = 1
for _, hold in ipairs(KEYS) do
  local fields = fl_rw_read(hold)
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    if (fields[1] and fields[8] == id) or fl_queue_find(fields[7], id) or
        (fields[10] and fl_find_word(fields[10], id, 32, 10)) then
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
end
return codes
