-- hold.lua: library prelude for the exclusive locks (barging and fair), whose hash it
-- describes, prepended by src/scripts.rs; the read-write lock's scripts use its functions too
-- (lib/rw.lua, whose hash has these fields and more). Not a script of its own.
--
-- One hash per lock (KEYS[1], the hold) is the lock's whole state, so that the hot paths read
-- it with one HMGET and write it with one HSET (and one PEXPIRE):
--   o  owner id of the holder; "" or absent when the lock is free
--   c  hold count (re-entry depth)
--   f  fencing token of the hold; while free, of the last hold (the next take continues it)
--   l  the hold's ttl (ms) as last set by a take, grant or renewal: how long a waiter may
--      sleep before it looks again
--   r  op id of the last applied call (for a grant or a hand-over: the new holder's waiter id)
--   g  the waiter id of the acquisition a release granted or handed this hold to ("" for a
--      hold its owner took itself): that acquisition's own attempts are answered "yours" even
--      after another task of the same owner re-entered
--   x  op ids of the releases that freed the lock lately, newest first, ","-joined, at most 64
--      bytes (two op ids: more would take the hash out of Redis's compact listpack encoding)
--   t  "1" while the hold is the queue's turn: a release granted it to the first waiter of the
--      queue (fl_grant_next); "" for a hold taken, re-taken or handed over. Such a holder's
--      release may still hand the lock to a task of its own process, once, while the next
--      waiter has waited less than twice the limit (hold_release.lua): so a queue that is
--      always past the limit does not turn the barging mutex into a strictly fair one (a
--      wake-up in another process for every acquisition)
--   q  the wait queue, one line per waiter: "<waiter id> <inbox tag> <owner id> <lease ms>
--      <grant ms> <since ms>\n" (ids never contain spaces or newlines: owner ids are printable
--      ASCII without space, waiter ids hex, inbox tags alphanumeric). Grant ms 0 marks a waiter
--      that is only woken, never granted the lock (a Redlock round: it takes the lock on every
--      instance itself); since ms is the server clock when the waiter queued, which bounds how
--      long a barging mutex may pass it over (hold_release.lua); a fair lock's waiter that
--      queued by an attempt has 0 (a take-over's line has the time: a fair lock reads
--      neither, its queue is always due)
-- Every write sets the hash's ttl to the holder's lease; a lock freed with nobody queued stays
-- a tombstone {o = "", f, r, x} for the retry window, so that a retried release (same op id,
-- re-sent by the client after a broken connection) is answered "released", and a take within
-- the window continues the token. The queue lives in the hold: it expires with it (a holder
-- that died takes the queue with it; its waiters look again when its lease ends, which is the
-- bound every busy reply gives them, and queue again in the order they come back).
--
-- Tokens: a take of a lock with no hash takes max(last + 1, server clock in us) from the
-- shard's fence key (lib/fence.lua); every take, grant or hand-over while the hash exists
-- takes max(f + 1, server clock in us) without reading the fence. Each token is above the
-- lock's previous one; none runs ahead of the clock (a take lasts far more than 1 us), so the
-- next draw from the fence is above it too; and after a failover to a replica whose copy of
-- the hash is older, the clock still puts the next token above every token the old primary
-- issued (docs/design.md, fencing).
--
-- fl_hold_read(hold)                -> the fields {o, c, f, l, r, x, q, g, t}, with o = false when
--                                      free (HMGET: a typed read, so a foreign value under the
--                                      hold key fails with WRONGTYPE before any write)
-- fl_freed_chain(op, older, limit)  -> op followed by the ids of older, within limit bytes
--                                      (default 64)
-- fl_find_word(text, word, before, after) -> start and end of the first occurrence of word
--                                      that starts the text or follows byte `before`, and
--                                      ends it or precedes byte `after`; nil when none
-- fl_chain_has(x, op)              -> whether op is one of the ids of the freed chain x
-- fl_now_us()                      -> the server clock in us (TIME)
-- fl_token_after(last, now_us)     -> max(last + 1, now_us), as a decimal string and as a
--                                      number
-- fl_clock_after(last)             -> fl_token_after(last, fl_now_us())
-- fl_hold_token(fields, fence, fence_arg) -> the next token (a decimal string), or nil and the
--                                      fence's refusal (a take of a lock with no hash)
-- fl_hold_write(hold, fields, owner, token, lease, r, x, q, g) writes a new hold over the
--                                      one read as fields (q nil: the queue stays as it is;
--                                      lease in ms, best as the ARGV text); returns token
-- fl_reenter(hold, fields, owner, op, lease) -> {1, token, count}
-- fl_queue_find(q, waiter)          -> start and end of the waiter's line in q, or nil
-- fl_queue_without(q, waiter)       -> q without the waiter's line, and whether it was there
-- fl_queued_count(q)                -> how many waiters q holds, estimated from the length of
--                                      its first line (0 when empty, else at least 1)
-- fl_queue_line(waiter, inbox, owner, lease, grant_ms, now_us) -> a queue line, stamped with
--                                      the clock (now_us, or read now when nil)
-- fl_queue_head_wait(q, now_us, except) -> how many ms the first waiter of q has waited by
--                                      now_us; -1 when q is empty or its first waiter is
--                                      `except`
-- fl_grant_next(hold, fields, q, x, events, mode, lock_id, now_us, tail) -> true, the queue
--   left, the token and the grant ms when granted; false when nobody was left. now_us: the
--   server clock if the caller read it already (else nil); tail: a line to queue behind the
--   granted waiter in the same write (else nil)
--   Grants the lock to the first waiter of q whose client is there to hear it, dropping the
--   others (and waking, on the way, the waiters that are only woken: event
--   "0|name|<waiter>|<lock id>"): writes the hold in the waiter's name (the next token, for
--   its grant ms) before it sends anything (a write refused for want of memory then
--   fails the whole script, before any event), and sends the event
--   "0|grant|<waiter>,<token>,<grant ms>,<queued>|<lock id>" (queued: how many waiters
--   stay queued behind it, fl_queued_count) to its client's inbox (fl_emit_to in
--   lib/notify.lua, which also tells whether the client is there to hear it). False when
--   nobody was left.
-- fl_free(hold, op, x, window, token) leaves the tombstone of a freed lock (window in ms,
--                                      best as the ARGV text; token: the lock's last token as
--                                      a decimal string when it moved past f, else nil)
local function fl_hold_read(hold)
  local v = redis.call('HMGET', hold, 'o', 'c', 'f', 'l', 'r', 'x', 'q', 'g', 't')
  if v[1] == '' then
    v[1] = false
  end
  return v
end

local function fl_freed_chain(op, older, limit)
  limit = limit or 64
  if not older or older == '' then
    return op
  end
  local chain = op .. ',' .. older
  if #chain <= limit then
    return chain
  end
  local cut = string.find(chain, ',', 1, true)
  while true do
    local next_cut = string.find(chain, ',', cut + 1, true)
    if not next_cut or next_cut > limit + 1 then
      return string.sub(chain, 1, cut - 1)
    end
    cut = next_cut
  end
end

local function fl_find_word(text, word, before, after)
  if word == '' then
    return nil
  end
  local from = 1
  while true do
    local at, last = string.find(text, word, from, true)
    if not at then
      return nil
    end
    local next_byte = string.byte(text, last + 1)
    if (at == 1 or string.byte(text, at - 1) == before) and
        (next_byte == nil or next_byte == after) then
      return at, last
    end
    from = last + 1
  end
end

local function fl_chain_has(chain, op)
  if not chain or op == '' then
    return false
  end
  return fl_find_word(chain, op, 44, 44) ~= nil
end

local function fl_now_us()
  local clock = redis.call('TIME')
  return clock[1] * 1000000 + clock[2]
end

local function fl_token_after(last, now_us)
  if now_us <= last then
    now_us = last + 1
  end
  return string.format('%.0f', now_us), now_us
end

local function fl_clock_after(last)
  return (fl_token_after(last, fl_now_us()))
end

local function fl_hold_token(fields, fence, fence_arg)
  if fields[3] then
    return fl_clock_after(tonumber(fields[3]))
  end
  local last, refusal = fl_fence_read(fence, fence_arg)
  if not last then
    return nil, refusal
  end
  return fl_fence_next(fence, fence_arg, last)
end

local function fl_hold_write(hold, fields, owner, token, lease, r, x, q, g)
  -- Each field of an HSET costs the server about as much as a small command of its own:
  -- the count, the ttl and the turn mark are left out when they hold their value already.
  -- Numbers go to Redis as strings: Lua turns a number argument into text with sprintf,
  -- which costs the server about half a microsecond each (callers pass lease as the ARGV text).
  local args = {'o', owner, 'f', token, 'r', r, 'x', x or '', 'g', g}
  if fields[2] ~= '1' then
    args[#args + 1], args[#args + 2] = 'c', '1'
  end
  if fields[4] ~= tostring(lease) then
    args[#args + 1], args[#args + 2] = 'l', lease
  end
  if fields[9] ~= '' then
    args[#args + 1], args[#args + 2] = 't', ''
  end
  if q then
    args[#args + 1], args[#args + 2] = 'q', q
  end
  redis.call('HSET', hold, unpack(args))
  redis.call('PEXPIRE', hold, lease)
  return token
end

local function fl_reenter(hold, fields, owner, op, lease)
  local token, count = tonumber(fields[3]), tonumber(fields[2])
  if fields[5] == op then
    return {1, token, count}
  end
  if redis.call('PTTL', hold) < lease then
    redis.call('HSET', hold, 'c', count + 1, 'r', op, 'l', lease)
    redis.call('PEXPIRE', hold, lease)
  else
    redis.call('HSET', hold, 'c', count + 1, 'r', op)
  end
  return {1, token, count + 1}
end

local function fl_queue_find(q, waiter)
  if not q or waiter == '' then
    return nil
  end
  local at, last = fl_find_word(q, waiter, 10, 32)
  if not at then
    return nil
  end
  return at, string.find(q, '\n', last, true)
end

local function fl_queue_without(q, waiter)
  local from, to = fl_queue_find(q, waiter)
  if not from then
    return q or '', false
  end
  return string.sub(q, 1, from - 1) .. string.sub(q, to + 1), true
end

local function fl_queued_count(q)
  if not q or q == '' then
    return 0
  end
  -- Lines differ only in their owner ids' lengths: the first line's length gives the count
  -- closely enough, without a scan of the queue.
  return math.max(1, math.floor(#q / string.find(q, '\n', 1, true)))
end

local function fl_queue_line(waiter, inbox, owner, lease, grant_ms, now_us)
  return string.format('%s %s %s %d %d %.0f\n', waiter, inbox, owner, lease, grant_ms,
    math.floor((now_us or fl_now_us()) / 1000))
end

local function fl_queue_head_wait(q, now_us, except)
  if not q or q == '' then
    return -1
  end
  -- The head line's last column, matched from at most 14 bytes before its end (a space and
  -- 13 digits of ms, enough until the year 2286): one short match, whatever the line holds.
  local stop = string.find(q, '\n', 1, true)
  local since = string.match(q, '(%d+)\n', math.max(stop - 14, 1))
  if not since or (except ~= '' and fl_queue_find(q, except) == 1) then
    return -1
  end
  return now_us / 1000 - since
end

local function fl_grant_next(hold, fields, q, x, events, mode, lock_id, now_us, tail)
  local text
  local at, size = 1, #q
  while at <= size do
    local stop = string.find(q, '\n', at, true)
    local waiter, inbox, owner, lasts =
      string.match(q, '^(%S+) (%S+) (%S+) %d+ (%d+) %d+\n', at)
    at = stop + 1
    if waiter and lasts == '0' then
      fl_emit_to(events .. ':to:' .. inbox, mode, '0|name|' .. waiter .. '|' .. lock_id)
    elseif waiter then
      text = text or fl_token_after(tonumber(fields[3]), now_us or fl_now_us())
      local left = at > size and (tail or '') or
        (tail and string.sub(q, at) .. tail or string.sub(q, at))
      local queued = fl_queued_count(left)
      redis.call('HSET', hold, 'o', owner, 'c', '1', 'f', text, 'l', lasts, 'r', waiter,
        'x', x, 'q', left, 'g', waiter, 't', '1')
      if fl_emit_to(events .. ':to:' .. inbox, mode,
          '0|grant|' .. waiter .. ',' .. text .. ',' .. lasts .. ',' .. queued .. '|' .. lock_id) then
        redis.call('PEXPIRE', hold, lasts)
        return true, left, text, tonumber(lasts)
      end
    end
  end
  return false
end

local function fl_free(hold, op, x, window, token)
  if token then
    redis.call('HSET', hold, 'o', '', 'c', '0', 'r', op, 'x', x, 'q', '', 'g', '', 't', '',
      'f', token)
  else
    redis.call('HSET', hold, 'o', '', 'c', '0', 'r', op, 'x', x, 'q', '', 'g', '', 't', '')
  end
  redis.call('PEXPIRE', hold, window)
end
