-- fence.lua: library prelude for every script that issues fencing tokens, prepended by
-- src/scripts.rs. Not a script of its own.
--
-- Fencing tokens are counted per shard, not per lock name: a lock name leaves no key behind
-- once its hold, tombstone and queue expire. The shard's fence key "{P:s}:fence" (with the
-- shard's event keys, the only keys of a shard that never expire) holds "<last>|<layout>": the
-- last token the shard issued, and the layout of the clients of the prefix (the value of
-- {P:layout}, see src/layout.rs). A new token is max(last + 1, the server clock in us), so:
--   * the tokens of a shard, hence of every lock name in it, strictly increase while the key
--     lives (last + 1);
--   * when the server loses the key (a restart without persistence, FLUSHALL, a failover to a
--     replica that missed the last writes), the next token is the server clock, above every
--     token issued before: a shard issues at most one token per us (a script takes longer),
--     so no token ran ahead of the clock. This holds as long as the server clock did not step
--     back, between the last token before the loss and the first after it, by more than the
--     time in between (docs/design.md, known limits).
-- Tokens stay below 2^53, so Lua's numbers hold them exactly; they are written as decimal
-- strings (a Lua number passed to redis.call would be cut to 14 digits).
--
-- A missing key is the trace of a data loss (or the shard's first use): the script then does
-- not issue a token but refuses with "FLFENCE missing", and its client checks the layout
-- record {P:layout} (which the loss took too) before it calls again with create = 1. So a
-- client whose shard count or mode differs from the other clients' is refused even after the
-- record was lost. A key stamped with another layout is refused with "FLFENCE layout <stamp>".
--
-- fl_fence_read(fence, arg)       -> the shard's last token (a number; 0 when the key is
--                                    missing and arg allows creating it), or nil and the
--                                    refusal text. arg is the fence ARGV "<0|1><layout>" (1: the
--                                    client has just checked the layout record). Reads only
--                                    (GET is a typed read; a foreign string is WRONGTYPE).
-- fl_fence_next(fence, arg, last, now_us) -> the next token (max(last + 1, server us)) as a
--                                    decimal string (now_us: the server clock in us if the
--                                    script read it already, else nil: read here);
--                                    writes the key
-- fl_fence_text(token)            -> a token number as a decimal string
local function fl_fence_text(token)
  return string.format('%d', token)
end

local function fl_fence_read(fence, arg)
  local value = redis.call('GET', fence)
  if not value then
    if string.sub(arg, 1, 1) == '1' then
      return 0
    end
    return nil, 'FLFENCE missing'
  end
  local sep = string.find(value, '|', 1, true)
  local last = sep and tonumber(string.sub(value, 1, sep - 1))
  if not last then
    error('WRONGTYPE fredlock key ' .. fence .. ' holds a foreign string')
  end
  if string.sub(value, sep + 1) ~= string.sub(arg, 2) then
    return nil, 'FLFENCE layout ' .. string.sub(value, sep + 1)
  end
  return last
end

local function fl_fence_next(fence, arg, last, now_us)
  local token = now_us
  if not token then
    local clock = redis.call('TIME')
    token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  end
  if token <= last then
    token = last + 1
  end
  local text = fl_fence_text(token)
  redis.call('SET', fence, text .. '|' .. string.sub(arg, 2))
  return text
end
