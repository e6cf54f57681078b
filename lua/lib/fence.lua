-- fence.lua: library prelude for every script that issues fencing tokens or reads the server
-- clock, prepended by src/scripts.rs. Not a script of its own.
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
-- fl_clock                         the TIME reply this call read (false before the first read:
--                                      a script runs at one instant, so it reads TIME once)
-- fl_time()                        -> that reply, read on first use
-- fl_now_us()                      -> the server clock in us, a number
-- fl_now_text()                    -> the server clock in us as a decimal string, built from the
--                                      TIME reply's text alone
-- fl_above(a, b)                   -> whether decimal string a is a larger whole number than b
--                                      (no leading zeros; nil or '' counts as 0)
-- fl_next_token(last)              -> max(last + 1, the server clock in us) as a decimal string
--                                      (last: a decimal string, nil or '' for none)
--
-- Numbers cost the server: Lua turns text into a number with strtod, and a number into text
-- (tostring, "..", "%.0f", or Redis for a number passed to redis.call) through the
-- floating-point path of sprintf, each a few thousand instructions for a 16-digit token. So
-- tokens and clock readings stay text from the reply they are read from to the reply that
-- returns them (the client parses them; see `int_array` in src/scripts.rs), compared as
-- decimal text, and the other numbers these scripts pass to Redis go through
-- string.format('%d') or are passed as text (ARGV as given, literals quoted).
--
-- fl_fence_read(fence, arg)       -> the shard's last token (a decimal string; '0' when the
--                                    key is missing and arg allows creating it), or nil and the
--                                    refusal text. arg is the fence ARGV "<0|1><layout>" (1: the
--                                    client has just checked the layout record). Reads only
--                                    (GET is a typed read; a foreign string is WRONGTYPE).
-- fl_fence_next(fence, arg, last) -> the next token (fl_next_token above) as a decimal string;
--                                    writes the key

local fl_clock = false

local function fl_time()
  if not fl_clock then
    fl_clock = redis.call('TIME')
  end
  return fl_clock
end

local function fl_now_us()
  local clock = fl_time()
  return clock[1] * 1000000 + clock[2]
end

local function fl_now_text()
  local clock = fl_time()
  return clock[1] .. string.sub('00000' .. clock[2], -6)
end

local function fl_above(a, b)
  a, b = a or '', b or ''
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end

local function fl_next_token(last)
  local now = fl_now_text()
  if fl_above(now, last) then
    return now
  end
  return string.format('%d', tonumber(last) + 1)
end

local function fl_fence_read(fence, arg)
  local value = redis.call('GET', fence)
  if not value then
    if string.sub(arg, 1, 1) == '1' then
      return '0'
    end
    return nil, 'FLFENCE missing'
  end
  local sep = string.find(value, '|', 1, true)
  local last = sep and string.sub(value, 1, sep - 1)
  if not (last and (last == '0' or string.find(last, '^[1-9]%d*$'))) then
    error('WRONGTYPE fredlock key ' .. fence .. ' holds a foreign string')
  end
  if string.sub(value, sep + 1) ~= string.sub(arg, 2) then
    return nil, 'FLFENCE layout ' .. string.sub(value, sep + 1)
  end
  return last
end

local function fl_fence_next(fence, arg, last)
  local token = fl_next_token(last)
  redis.call('SET', fence, token .. '|' .. string.sub(arg, 2))
  return token
end
