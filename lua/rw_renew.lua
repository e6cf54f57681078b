-- rw_renew.lua: renew (or extend) a batch of read or write holds of read-write locks, all in
-- one hash slot. Uses lib/hold.lua and lib/rw.lua.
--
-- A batch script (lua/README.md): one group of keys per hold.
-- KEYS[2i-1] hold  hold hash of the i-th hold's lock (see lib/rw.lua)
-- KEYS[2i] reads   the ends of that lock's read holds (see lib/rw.lua)
-- ARGV[1] lease   lease in ms: each renewed hold ends this long from now; 0 checks the holds
--                 without renewing them (after the client saw signs of a data loss)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]   side ("read" or "write"), owner id and fencing token
--                 of the i-th hold
--
-- Returns an array with one code per key:
--   1 renewed (or, with lease 0, held), 0 the hold is gone (expired, released, deleted),
--  -1 another owner holds the write hold, -2 the owner's hold carries a newer fencing token
--   (this hold was lost meanwhile); a WRONGTYPE error (and no change) when a key holds a
--   foreign value.
local lease = tonumber(ARGV[1])
local now_ms = math.floor(fl_now_us() / 1000)
-- Every hash is read (a typed read) before any is written: a foreign value under any key of
-- the batch fails the whole call before it changes anything.
local holds = #KEYS / 2
for i = 1, holds do
  fl_rw_read(KEYS[2 * i - 1], '')
  fl_queue_call(KEYS[2 * i], 'ZCARD')
end
local codes = {}
for i = 1, holds do
  local hold, reads = KEYS[2 * i - 1], KEYS[2 * i]
  local side, owner, token = ARGV[3 * i - 1], ARGV[3 * i], ARGV[3 * i + 1]
  -- Read now: an earlier hold of the batch may be of the same lock, and wrote it.
  local fields = fl_rw_read(hold, owner)
  local state = fl_rw_state(reads, fields, now_ms, owner)
  local code
  if side == 'write' then
    if not state.writer then
      code = 0
    elseif state.writer ~= owner then
      code = -1
    elseif fields[3] ~= token then
      code = -2
    else
      code = 1
      if lease > 0 then
        state.ends = now_ms + lease
        redis.call('HSET', hold, 'l', ARGV[1], 'e', string.format('%d', state.ends))
      end
    end
  else
    local mine = state.mine
    if not mine then
      code = 0
    elseif mine.token ~= token then
      code = -2
    else
      code = 1
      if lease > 0 then
        mine.ends = now_ms + lease
        state.mine_changed = true
        fl_rw_put_reads(hold, reads, state)
      end
    end
  end
  if code == 1 and lease > 0 then
    fl_rw_keep(hold, reads, state, now_ms, lease)
  end
  codes[i] = code
end
return codes
