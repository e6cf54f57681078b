-- hold.lua: library prelude for the exclusive locks (barging and fair), whose hash it
-- describes, prepended by src/scripts.rs; the read-write lock's scripts use its functions too
-- (lib/rw.lua, whose hash has these fields and more). Not a script of its own.
--
-- One hash per lock (KEYS[1], the hold) holds the hold and its retry records, so that the hot
-- paths read it with one HMGET and write it with one HSET (and one PEXPIRE); its wait queue is
-- a sorted set beside it (KEYS[2], below):
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
--   q  how many waiters the queue (KEYS[2], below) holds; "" or absent: none. A path that
--      finds nobody queued makes no call on the queue
--   k  when the queue expires (server ms) as its last PEXPIRE set it: a write of the hold
--      extends the queue only when the hold would outlast it
--   i  the inbox tag of the holder's client when it asked to hear of the hold's first waiter
--      (hold_acquire.lua, ARGV[10]), else "": the join that queues the hold's first waiter
--      sends that client "0|held|<token>|<lock id>" (the hold's token) and clears it. Every
--      write of a new hold sets it (a take as asked, a hand-over to the successor's client, a
--      grant that leaves waiters queued to "": the grant's event tells their count; a grant
--      that leaves nobody queued to the grantee's client, so that it hears of a waiter that
--      comes later); a free lock keeps the last one, which no join reads (a join needs a hold)
--
-- The wait queue is a sorted set of its own (KEYS[2], "queue", same hash tag), not a field of
-- the hash: Redis's Lua hashes every byte of every string a script reads or builds (about 12
-- instructions a byte), so a queue of 64 waiters read from the hash as text and rebuilt cost
-- the server more than the rest of a grant. In a sorted set the hot paths touch only single
-- members: a join is one ZADD, a grant reads the head (ZRANGE) and removes it (ZREM) or pops
-- it (ZPOPMIN), and the hand-over bound reads the first two members with their scores (ZRANGE
-- WITHSCORES): whether the head is due, and if not, when it will be.
-- Each member is "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>" (ids never
-- contain spaces: owner ids are printable ASCII without space, waiter ids hex, inbox tags
-- alphanumeric), and its score the server clock (us) when it queued: the queue's order, and
-- how long its head has waited. A member holds nothing that changes between the attempts of
-- one acquisition, so a repeated join (a later attempt of a queued waiter, or a call fred
-- re-sent after a broken connection) finds it queued (ZADD NX) and keeps its place. Grant ms
-- 0 marks a waiter that is only woken, never granted the lock (a Redlock round: it takes the
-- lock on every instance itself). Scores are distinct: each join is a script of its own,
-- longer than a microsecond.
-- The queue's ttl is never below the hold's: a join that creates it gives it twice the hold's
-- l (which no remaining ttl of the hold exceeds), and a later write of the hold that sets its
-- ttl beyond the queue's (k) sets the queue's to twice the hold's, so a queue under steady
-- contention is extended about once per lease, not on every write. A lock freed with nobody
-- left to grant has an empty queue (Redis deletes an empty set); a take of a lock whose hash
-- is gone deletes a queue that outlived it (its waiters look again when their bound, the
-- holder's lease, ends: they queue again in the order they come back, as they would have
-- behind a holder that died).
-- Every write sets the hash's ttl to the holder's lease; a lock freed with nobody queued stays
-- a tombstone {o = "", f, r, x} for the retry window, so that a retried release (same op id,
-- re-sent by the client after a broken connection) is answered "released", and a take within
-- the window continues the token.
--
-- Tokens: a take of a lock with no hash takes max(last + 1, server clock in us) from the
-- shard's fence key (lib/fence.lua); every take, grant or hand-over while the hash exists
-- takes max(f + 1, server clock in us) without reading the fence. Each token is above the
-- lock's previous one; none runs ahead of the clock (a take lasts far more than 1 us), so the
-- next draw from the fence is above it too; and after a failover to a replica whose copy of
-- the hash is older, the clock still puts the next token above every token the old primary
-- issued (docs/design.md, fencing).
--
-- fl_hold_read(hold)                -> the fields {o, c, f, l, r, x, q, g, t, k}, with o = false
--                                      when free (HMGET: a typed read, so a foreign value
--                                      under the hold key fails with WRONGTYPE before any write)
-- fl_freed_chain(op, older, limit)  -> op followed by the ids of older, within limit bytes
--                                      (default 64)
-- fl_find_word(text, word, before, after) -> start and end of the first occurrence of word
--                                      that starts the text or follows byte `before`, and
--                                      ends it or precedes byte `after`; nil when none
-- fl_chain_has(x, op)              -> whether op is one of the ids of the freed chain x
-- fl_hold_token(fields, fence, fence_arg) -> the next token (a decimal string), or nil and the
--                                      fence's refusal (a take of a lock with no hash)
-- fl_hold_write(hold, queue, fields, owner, token, lease, r, x, q, g, i) writes a new hold over
--                                      the one read as fields, and sets the hold's ttl (and the
--                                      queue's, while anybody is queued) to lease (q: the new
--                                      count of the queue, nil when it stays as read; lease in
--                                      ms, best as the ARGV text); returns token
-- fl_reenter(hold, queue, fields, owner, op, lease) -> {1, token, count} (lease: ms, as text;
--                                      the token as text)
-- fl_queue_call(queue, command, ...) -> redis.call(command, queue, ...), but a foreign value
--                                      there fails with a WRONGTYPE error that names the key
-- fl_queue_count(fields)            -> how many waiters are queued (field q)
-- fl_queue_member(waiter, inbox, owner, lease, grant_ms) -> the waiter's queue member
-- fl_queue_parse(member)            -> its waiter id, inbox tag, owner id and grant ms (text)
-- fl_queue_join(queue, fields, member) -> the count after adding member, scored by the
--                                      clock, unless it is queued already (ZADD NX); for a
--                                      queue it creates, which gets twice the hold's l as its
--                                      ttl, also the new k
-- fl_queue_outlast(k, count, ttl)   -> when a queue of count members that expires at k (field k)
--                                      must be extended to outlast a hold written now for ttl
--                                      ms: the new k and the queue's new ttl (ms), as text;
--                                      else nil
-- fl_queue_find(queue, count, waiter) -> the member of the waiter id in the queue, or nil
--                                      (reads the whole queue: for the paths that know the
--                                      waiter id alone)
-- fl_queue_remove(queue, count, member) -> the count after removing member, and whether it
--                                      was queued
-- fl_queue_due_head(queue, count, wait_ms, except, next_wait_ms) -> the first member when it
--                                      has waited wait_ms or more by now and is not the waiter
--                                      `except`; else nil and, when waiters are queued, the ms
--                                      until the first of them other than `except` has waited
--                                      next_wait_ms (0 when it has; next_wait_ms when only
--                                      `except` is queued): nobody queued later is due sooner
-- fl_grant_next(hold, queue, fields, x, events, mode, lock_id, tail, head) -> true, the count
--   left, the token (text) and the grant ms when granted; false when nobody was left (the
--   queue is then empty). tail: a member to queue behind the granted waiter in the same call
--   (else nil); head: the queue's first member if the caller read it already (else nil)
--   Queues tail first (its ZADD, which needs memory, is then the call's first write), then
--   grants the lock to the first waiter whose client is there to hear it, taking the others
--   out of the queue (and waking, on the way, the waiters that are only woken: event
--   "0|name|<waiter>|<lock id>"): writes the hold in the waiter's name (the next token, for
--   its grant ms) before it sends anything (a write refused for want of memory then
--   fails the whole script, before any event), and sends the event
--   "0|grant|<waiter>,<token>,<grant ms>,<queued>|<lock id>" (queued: how many waiters
--   stay queued behind it) to its client's inbox (fl_emit_to in lib/notify.lua, which also
--   tells whether the client is there to hear it).
-- fl_free(hold, op, x, window, token, fields) leaves the tombstone of a freed lock (window in
--                                      ms, best as the ARGV text; token: the lock's last token
--                                      as a decimal string when it moved past f, else nil;
--                                      fields: the hold as read, when nothing wrote it since,
--                                      else nil)
local function fl_hold_read(hold)
  local v = redis.call('HMGET', hold, 'o', 'c', 'f', 'l', 'r', 'x', 'q', 'g', 't', 'k')
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

local function fl_hold_token(fields, fence, fence_arg)
  if fields[3] then
    return fl_next_token(fields[3])
  end
  local last, refusal = fl_fence_read(fence, fence_arg)
  if not last then
    return nil, refusal
  end
  return fl_fence_next(fence, fence_arg, last)
end

local function fl_queue_call(queue, command, ...)
  local reply = redis.pcall(command, queue, ...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      error('WRONGTYPE fredlock key ' .. queue .. ' holds a ' .. redis.call('TYPE', queue).ok ..
        ', expected a zset')
    end
    -- Any other refusal (out of memory): the same call again raises it as Redis raises it,
    -- in every version (error() of the reply table fails before Redis 7).
    return redis.call(command, queue, ...)
  end
  return reply
end

local function fl_queue_count(fields)
  return tonumber(fields[7]) or 0
end

local function fl_queue_outlast(k, count, ttl)
  if count == 0 then
    return nil
  end
  local ms = tonumber(ttl)
  local ends = math.floor(fl_now_us() / 1000) + ms
  if (tonumber(k) or 0) >= ends then
    return nil
  end
  return string.format('%d', ends + ms), string.format('%d', 2 * ms)
end

local function fl_hold_write(hold, queue, fields, owner, token, lease, r, x, q, g, i)
  -- Each field of an HSET costs the server about as much as a small command of its own:
  -- the count, the ttl and the turn mark are left out when they hold their value already.
  -- Numbers go to Redis as strings: Lua turns a number argument into text with sprintf,
  -- which costs the server about half a microsecond each (callers pass lease as the ARGV text).
  -- The arguments' table is built at its largest size at once: growing it rehashes it.
  local args = {'o', owner, 'f', token, 'r', r, 'x', x or '', 'g', g, 'i', i,
    false, false, false, false, false, false, false, false, false, false}
  local n = 12
  if fields[2] ~= '1' then
    args[n + 1], args[n + 2], n = 'c', '1', n + 2
  end
  if fields[4] ~= lease then
    args[n + 1], args[n + 2], n = 'l', lease, n + 2
  end
  if fields[9] ~= '' then
    args[n + 1], args[n + 2], n = 't', '', n + 2
  end
  if q then
    args[n + 1], args[n + 2], n = 'q', q == '' and q or string.format('%d', q), n + 2
  end
  local k, queue_ttl = fl_queue_outlast(fields[10], tonumber(q or fields[7]) or 0, lease)
  if k then
    args[n + 1], args[n + 2], n = 'k', k, n + 2
  end
  redis.call('HSET', hold, unpack(args, 1, n))
  redis.call('PEXPIRE', hold, lease)
  if queue_ttl then
    redis.call('PEXPIRE', queue, queue_ttl)
  end
  return token
end

local function fl_reenter(hold, queue, fields, owner, op, lease)
  local token, count = fields[3], tonumber(fields[2])
  if fields[5] == op then
    return {1, token, count}
  end
  local deeper = string.format('%d', count + 1)
  if redis.call('PTTL', hold) < tonumber(lease) then
    local k, queue_ttl = fl_queue_outlast(fields[10], fl_queue_count(fields), lease)
    redis.call('HSET', hold, 'c', deeper, 'r', op, 'l', lease, 'k', k or fields[10] or '')
    redis.call('PEXPIRE', hold, lease)
    if queue_ttl then
      redis.call('PEXPIRE', queue, queue_ttl)
    end
  else
    redis.call('HSET', hold, 'c', deeper, 'r', op)
  end
  return {1, token, count + 1}
end

local function fl_queue_member(waiter, inbox, owner, lease, grant_ms)
  return waiter .. ' ' .. inbox .. ' ' .. owner .. ' ' .. lease .. ' ' .. grant_ms
end

local function fl_queue_parse(member)
  return string.match(member, '^(%S+) (%S+) (%S+) %d+ (%d+)$')
end

local function fl_queue_join(queue, fields, member)
  local count = fl_queue_count(fields)
  if fl_queue_call(queue, 'ZADD', 'NX', fl_now_text(), member) == 0 then
    return count
  end
  if count == 0 then
    -- A new queue: it outlasts the hold, whose remaining ttl l bounds.
    local ms = tonumber(fields[4])
    redis.call('PEXPIRE', queue, string.format('%d', 2 * ms))
    return 1, string.format('%d', math.floor(fl_now_us() / 1000) + 2 * ms)
  end
  return count + 1
end

local function fl_queue_find(queue, count, waiter)
  if count == 0 or waiter == '' then
    return nil
  end
  -- The members without their scores (ZSCAN would format every score as text), searched
  -- here: for the paths that know the waiter id alone, none of them hot.
  local prefix = waiter .. ' '
  for _, member in ipairs(fl_queue_call(queue, 'ZRANGE', '0', '-1')) do
    if string.sub(member, 1, #prefix) == prefix then
      return member
    end
  end
  return nil
end

local function fl_queue_remove(queue, count, member)
  if count == 0 or not member or fl_queue_call(queue, 'ZREM', member) == 0 then
    return count, false
  end
  return count - 1, true
end

local function fl_queue_due_head(queue, count, wait_ms, except, next_wait_ms)
  if count == 0 then
    return nil
  end
  -- The first two members and their scores (µs since the epoch, exact in a Lua number): the
  -- head decides, the second one matters only when the head is `except`.
  local first = fl_queue_call(queue, 'ZRANGE', '0', '1', 'WITHSCORES')
  local head, since = first[1], tonumber(first[2])
  if not head then
    return nil
  end
  local now = fl_now_us()
  local is_except = except ~= '' and fl_queue_parse(head) == except
  if not is_except and since and since <= now - wait_ms * 1000 then
    return head
  end
  if is_except then
    since = tonumber(first[4])
    if not first[3] then
      return nil, next_wait_ms
    end
  end
  if not since then
    return nil
  end
  return nil, math.max(math.ceil((since + next_wait_ms * 1000 - now) / 1000), 0)
end

local function fl_grant_next(hold, queue, fields, x, events, mode, lock_id, tail, head)
  local count = fl_queue_count(fields)
  if count == 0 then
    return false
  end
  -- The script's first write needs memory: the ZADD of a tail, else the HSET of the hold
  -- (the head is read first and removed after it). So a server out of memory refuses it and
  -- nothing has changed; after a write, Redis refuses none, and a pop may come first.
  local joined = tail and fl_queue_call(queue, 'ZADD', 'NX', fl_now_text(), tail) == 1
  local text
  while count > 0 do
    local popped = false
    if not head and joined then
      head, popped = fl_queue_call(queue, 'ZPOPMIN')[1], true
    elseif not head then
      head = fl_queue_call(queue, 'ZRANGE', '0', '0')[1]
    end
    if not head then
      break
    end
    count = count - 1
    local waiter, inbox, owner, lasts = fl_queue_parse(head)
    if waiter and lasts ~= '0' then
      text = text or fl_next_token(fields[3])
      local left = joined and count + 1 or count
      local k, queue_ttl = fl_queue_outlast(fields[10], left, lasts)
      -- Field i: with nobody left queued, the grantee's client hears of the next waiter.
      local args = {'o', owner, 'c', '1', 'f', text, 'l', lasts, 'r', waiter, 'x', x,
        'q', string.format('%d', left), 'g', waiter, 't', '1', 'i', left == 0 and inbox or '',
        'k', k or ''}
      redis.call('HSET', hold, unpack(args, 1, k and 22 or 20))
      if not popped then
        fl_queue_call(queue, 'ZREM', head)
      end
      if queue_ttl then
        redis.call('PEXPIRE', queue, queue_ttl)
        fields[10] = k
      end
      if fl_emit_to(events .. ':to:' .. inbox, mode,
          '0|grant|' .. waiter .. ',' .. text .. ',' .. lasts .. ',' .. string.format('%d', left) ..
          '|' .. lock_id) then
        redis.call('PEXPIRE', hold, lasts)
        return true, left, text, tonumber(lasts)
      end
    else
      if waiter then
        fl_emit_to(events .. ':to:' .. inbox, mode, '0|name|' .. waiter .. '|' .. lock_id)
      end
      if not popped then
        fl_queue_call(queue, 'ZREM', head)
      end
    end
    head = nil
  end
  if joined then
    -- Nobody to grant: the successor takes the lock instead of queueing.
    fl_queue_call(queue, 'ZREM', tail)
  end
  return false
end

local function fl_free(hold, op, x, window, token, fields)
  local args = {'o', '', 'c', '0', 'r', op, 'x', x,
    false, false, false, false, false, false, false, false}
  local n = 8
  if token then
    args[9], args[10], n = 'f', token, 10
  end
  -- q, g and t are cleared, unless the hold as read (nothing wrote it since) has them cleared.
  if not fields or (fields[7] or '') ~= '' then
    args[n + 1], args[n + 2], n = 'q', '', n + 2
  end
  if not fields or (fields[8] or '') ~= '' then
    args[n + 1], args[n + 2], n = 'g', '', n + 2
  end
  if not fields or (fields[9] or '') ~= '' then
    args[n + 1], args[n + 2], n = 't', '', n + 2
  end
  redis.call('HSET', hold, unpack(args, 1, n))
  redis.call('PEXPIRE', hold, window)
end
