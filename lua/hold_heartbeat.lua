-- hold_heartbeat.lua: one client's check of its waiters queued on exclusive locks, batched per
-- hash slot. Read only. Uses lib/fence.lua, lib/notify.lua and lib/hold.lua.
--
-- A queued waiter sleeps until a grant or wakeup reaches it, or until the bound its last
-- attempt was given (the holder's lease). Its place can vanish before either: a grant to a
-- client that died (and was not yet known dead) lapses, and the lock's hash, queue included,
-- expires with it. The client runs this every third of `waiter_lease` while it has waiters
-- queued, and wakes those whose place is gone, so they try again at once.
--
-- A batch script (lua/README.md): two keys per lock.
-- KEYS[2i-1] hold  the i-th lock's hash (see lib/hold.lua)
-- KEYS[2i] queue   the i-th lock's wait queue
-- ARGV             for each lock i: the number n of waiter ids, then the n waiter ids
--
-- Returns one code per waiter id, in order: 1 queued, or granted the lock (field g is its id);
-- 0 neither (it must try again),
--         a WRONGTYPE error when a hold or a queue key holds a foreign value.
local codes = {}
local arg = 1
for i = 1, #KEYS, 2 do
  local fields = fl_hold_read(KEYS[i])
  -- The waiter ids of the queue, read once per lock.
  local queued = {}
  if fl_queue_count(fields) > 0 then
    for _, member in ipairs(fl_queue_call(KEYS[i + 1], 'ZRANGE', '0', '-1')) do
      queued[fl_queue_parse(member) or ''] = true
    end
  end
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for _ = 1, n do
    local id = ARGV[arg]
    arg = arg + 1
    if (fields[1] and fields[8] == id) or queued[id] then
      codes[#codes + 1] = 1
    else
      codes[#codes + 1] = 0
    end
  end
end
return codes
