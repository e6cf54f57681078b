-- latch.lua: library prelude for the count-down latch, prepended by src/scripts.rs. Not a
-- script of its own.
--
-- A latch is two keys of one hash tag: its count, a string holding a decimal number above 0
-- (KEYS[1], "hold"; missing: the latch is open), and the set of the inbox tags of the clients
-- that wait for it to open (KEYS[2], "queue"; one member per client, not per waiting task).
-- Neither has a ttl: a latch lasts until it opens or is deleted. Opening deletes both and sends
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
local FL_LATCH_MAX = 9007199254740991

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
