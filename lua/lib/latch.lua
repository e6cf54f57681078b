-- latch.lua: library prelude for the count-down latch, prepended by src/scripts.rs. Not a
-- script of its own.
--
-- A latch is two keys of one hash tag: its count, a string holding a decimal number above 0
-- (KEYS[1], "hold"; missing: the latch is open), and the set of the inbox tags of the clients
-- that wait for it to open (KEYS[2], "queue"; one member per client, not per waiting task).
-- Neither has a ttl: a latch lasts until it opens or is deleted. A third key of the tag
-- (KEYS[5], "ops"; "{P:s}:latch.op:N") remembers for a retry window which calls set or
-- deleted the latch lately: the op ids of `try_set_count` and `delete` calls that changed it,
-- newest first and ","-joined, so that the same call delivered again (fred re-sends a command
-- whose reply a broken connection lost) is answered as its first delivery was instead of
-- finding its own change. A call that changed nothing leaves no record: delivered again it
-- answers by the state it finds, and applies at most once all the same. Opening deletes both and sends
-- "0|all||<lock id>" into the inbox of every client in the set, which wakes every task of that
-- client that waits on the latch (src/notify/event.rs); a client that left meanwhile misses
-- nothing (its inbox is gone, or nobody listens).
--
-- FL_LATCH_MAX                  the largest count (2^53 - 1: a Lua number holds it exactly)
-- fl_latch_count(latch, value)  -> the count held in value (GET's reply, not false); raises
--                                 WRONGTYPE when value is not a count fredlock wrote
-- fl_latch_open(latch, waiting, events, mode, lock_id) -> deletes the latch and its set of
--                                 waiting clients (`waiting`, SMEMBERS read before any write)
--                                 and wakes each of them
-- fl_latch_ops(ops)             -> the op ids the ops key records ("" when none); raises
--                                 WRONGTYPE when it holds anything else (a typed read)
-- fl_latch_changed(ops, recorded, op, window) records that the call op changed the latch:
--                                 its id goes before the `recorded` ones (as many as fit in
--                                 FL_LATCH_OPS_BYTES), for window ms
local FL_LATCH_MAX = 9007199254740991
local FL_LATCH_OPS_BYTES = 168

local function fl_latch_count(latch, value)
  local count = string.find(value, '^[1-9]%d*$') and tonumber(value)
  if not count or count > FL_LATCH_MAX then
    error('WRONGTYPE fredlock key ' .. latch .. ' holds a foreign string')
  end
  return count
end

local function fl_latch_open(latch, waiting, events, mode, lock_id)
  redis.call('DEL', latch, waiting.key)
  for _, inbox in ipairs(waiting.members) do
    fl_emit_to(events .. ':to:' .. inbox, mode, '0|all||' .. lock_id)
  end
end

local function fl_latch_ops(ops)
  local value = redis.pcall('GET', ops)
  if type(value) == 'table' and value.err then
    error('WRONGTYPE fredlock key ' .. ops .. ' holds a ' .. redis.call('TYPE', ops).ok ..
      ', expected a string')
  end
  if not value then
    return ''
  end
  if not string.find(value, '^[%x,]+$') then
    error('WRONGTYPE fredlock key ' .. ops .. ' holds a foreign string')
  end
  return value
end

local function fl_latch_changed(ops, recorded, op, window)
  redis.call('SET', ops, fl_freed_chain(op, recorded, FL_LATCH_OPS_BYTES), 'PX', window)
end
