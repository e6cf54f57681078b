-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs after
-- lib/fence.lua, lib/notify.lua and lib/hold.lua, whose functions it uses. Not a script of its
-- own.
--
-- One hash per read-write lock (KEYS[1]) holds its holds, with the fields, tokens and tombstone
-- of the exclusive locks (lib/hold.lua); the ends of its read holds (KEYS[6]) and its wait queue
-- (KEYS[2]) are sorted sets beside it:
--   o c f l r x g  the write hold and the retry records, as in lib/hold.lua (f: the latest
--                  token the lock issued, to a write or a read hold). t is never set: the
--                  write side's hand-overs are bounded by the head's wait alone (rw_release.lua)
--   e  the write hold's lease end, server clock in ms ("" without a writer). The hash's ttl is
--      the latest end of any of its holds, so a writer's own read hold (a downgrade) may keep
--      the hash past the write hold's lease: the write hold counts only while e is ahead
--   =<owner id>  one field per read hold (one per owner): "<count> <token> <op> <waiter>": its
--      re-entry depth, its token (drawn when the owner's read hold began, as a write hold's
--      is: max(f + 1, server clock in us), so no two read holds of a lock share one and a
--      stale call of an ended read hold is refused; a downgrade carries its write hold's
--      token), the op id of the last call applied to it, and the waiter id a release granted
--      it under ("-" for a read hold its owner took by an attempt). Its end is its score in
--      the read holds' sorted set (KEYS[6], "reads": member the owner id, score the lease end
--      in server ms). A read hold counts only while its end is ahead; the first call that
--      writes the lock after it lapsed drops both (fl_rw_put_reads)
--   i  the inbox tag of the write holder's client when it asked to hear of the hold's first
--      waiter, as in lib/hold.lua (rw_acquire.lua, ARGV[12]): a writer's take sets it, a grant
--      to a writer gives it to the grantee's client when it leaves nobody queued (else clears
--      it), a write hand-over gives it to the successor's client, and the
--      call that queues the first waiter behind a live write hold sends the notice and clears it
--   n  the permit count of a semaphore (src/lock/semaphore.rs), which is this lock's read side
--      with at most n read holds at once and no writer (every acquisition has an owner of its
--      own, so one read hold is one permit): a grant then stops at n live read holds, and
--      waiters queue once n are held. Set by rw_acquire.lua (ARGV[13]); absent on a read-write
--      lock, which has no bound
-- The wait queue (KEYS[2], "queue", same hash tag) is a sorted set, as the exclusive locks'
-- is (lib/hold.lua says why not text in the hash: a call would read and rebuild every waiter's
-- line), with two members per waiter:
--   its place: "<waiter id> <inbox tag> <owner id> <lease ms> <grant ms>" (lib/hold.lua's
--     member), scored by the server clock in us when it queued: the queue's order, and how long
--     its head has waited (for the write side's hand-over bound, rw_release.lua)
--   its sign of life: "<waiter id>", scored by the time (server ms) until which the waiter is
--     known to be alive: its queueing call sets it a waiter lease ahead, and its client's
--     heartbeat (rw_heartbeat.lua) moves it on
-- The two kinds never mix up: a time in us is above 10^15 since 2001, one in ms below 10^14
-- until the year 5138, so the score range above FL_RW_PLACES holds the places alone, and every
-- sign of life sorts before every place. A waiter whose time passed is dropped, both members,
-- by the next call that looks at the queue (fl_rw_queue_head): a writer that died waiting must
-- not keep new readers out while readers hold the lock. Each join and each heartbeat sets the
-- queue's ttl to a waiter lease, which no sign of life in it outlasts. The queue counts only
-- while the hash exists: a call that finds the hash gone deletes a queue left behind, and the
-- heartbeat tells its waiters to queue again (the hash expires once its holds have lapsed and
-- the retry window has passed).
-- Waiters of both sides share the queue: a reader's waiter id starts with "r", a writer's with
-- "w" (then the client's inbox tag, ".", an op id: src/lock/rwlock.rs).
-- The read holds are kept apart from the hash's fixed fields for the reason the queue is: as
-- text in one field, every call read and rebuilt all of them, and matched a pattern over each
-- (a take with 256 read holds live cost the server 0.4 ms). Each call now reads its own
-- owner's field with the hash's one HMGET, and the sorted set answers in O(log n) what it
-- asks of the others: how many are live (ZCARD, less the lapsed ones ZRANGEBYSCORE finds), the
-- latest end (ZREVRANGE, for the hash's ttl and a waiter's bound) and the earliest one (a
-- semaphore's bound). The set's ttl is the hash's (the latest end of any hold). A set left
-- behind by a hash that is gone is deleted by the next call that writes the lock.
-- A writer at the head of the queue is granted the lock alone, once no read hold is left; the
-- readers at the head, up to the first writer, are granted read holds together (a wave), with
-- one event per client: "0|grants|<queued>,<waiter>:<grant ms>:<token>,...|<lock id>" (queued:
-- how many waiters stay queued behind the wave, fl_rw_count; each
-- granted hold draws its own token, so a waiter dates its grant by the token, as for a write
-- hold: src/engine/acquire.rs). A reader
-- whose owner holds a read hold already is not granted a second one: it is woken by name and
-- re-enters by its own call (one line per owner keeps one count, which a retried grant could
-- not tell apart from a re-entry).
-- The hash's ttl is the latest end of its holds, or the retry window once none is left (the
-- tombstone of lib/hold.lua, which keeps f and the freed-by chain x).
--
-- fl_rw_read(hold, owner)            -> the fields {o, c, f, l, r, x, g, e, n, =<owner>} (one
--                                       HMGET: a typed read), with o = false when "" or lapsed is
--                                       not known yet (see fl_rw_state)
-- fl_rw_state(reads, fields, now_ms, owner) -> the live state: {writer (owner id or false), ends
--                                       (the write hold's end, 0 without), mine (owner's read
--                                       hold: {count, token, ends, op, waiter} or nil), last (the
--                                       latest end of the other owners' live read holds, 0 if
--                                       none), readers (live read holds, mine included), cap (n,
--                                       or nil), changed (a lapsed hold is to be dropped)}; the
--                                       read holds' typed read. A call that changes mine sets
--                                       state.mine_changed, and fl_rw_put_reads writes it
-- fl_rw_put_reads(hold, reads, state) drops the lapsed read holds state found, and writes
--                                       mine when it changed (or its removal)
-- fl_rw_add_reads(hold, reads, holds) adds read holds {owner, count, token, ends, op, waiter}
-- fl_rw_drop_reads(hold, reads, owners) removes the read holds of these owners
-- fl_rw_batched(command, key, items) runs ZREM or HDEL of many items, a few hundred per call
-- fl_rw_holds_read(reads, owner, now_ms) -> whether the owner holds a live read hold
-- fl_rw_read_of(hold, reads, waiter, now_ms) -> the owner of the live read hold a release
--                                       granted under this waiter id, or nil (walks the read
--                                       holds: for the paths that know the waiter id alone)
-- fl_rw_first(reads, now_ms)         -> the earliest end of a live read hold (ms), 0 if none
-- fl_rw_last(state)                 -> the latest end of every hold in state (ms)
-- fl_rw_keep(hold, reads, state, now_ms, window) sets the ttl of the hash and of the read
--                                       holds' set: to the latest end of its holds, or the hash's
--                                       to the retry window when none is left
-- fl_rw_head(queue)                  -> the first place of the queue and its score (us), or nil
-- fl_rw_queue_head(queue, fields, now_ms) -> fl_rw_head, after dropping the waiters whose time
--                                       passed, or deleting the queue when the hash is gone
--                                       (fields: the hash as read). The queue's typed read: a
--                                       foreign value there fails with WRONGTYPE, before any write
-- fl_rw_count(queue)                 -> how many waiters are queued
-- fl_rw_queued(queue, waiter)        -> whether the waiter is queued (its sign of life is there)
-- fl_rw_join(queue, member, waiter, alive_until, ttl) queues a place at the tail (scored by the
--                                       clock) and its sign of life; ttl: the waiter lease (ms)
-- fl_rw_leave(queue, waiter, member) -> whether the waiter was queued; takes it out of the queue
--                                       (member: its place if the caller knows it, else nil:
--                                       the queue is then searched for it)
-- fl_rw_due(since, now_us, limit)    -> whether a waiter queued at `since` (us) has waited limit
--                                       ms or more (always with limit 0)
-- fl_rw_settle(hold, queue, reads, head, f, state, now_us, x, events, mode, lock_id, tail, window)
--   -> what fl_rw_grant returns. After a call ended or dropped holds (state is what is left;
--   head: the queue's first place, nil when nobody waits): grants the queue its turn when no
--   write hold is live (fl_rw_grant), and otherwise, or when nothing was granted, writes the
--   lock as it is: the freed-by chain x, the read holds, no write hold unless one is live,
--   state.f when set (a release's floor, or the token of a failed grant), the ttl (the retry
--   window when no hold is left: the tombstone), and `tail` queued
-- fl_rw_grant(hold, queue, reads, f, state, now_us, x, events, mode, lock_id, tail, window)
--   -> "w" (a writer was granted the lock), "r" (readers were granted read holds, or woken to
--   re-enter) or false (nothing granted: the queue is empty or held only waiters whose client
--   is gone, or its head is a writer and read holds are left). state.f is then the lock's f.
--   Grants from the head of the queue, dropping waiters whose client is gone on the way
--   (fl_emit_to finds nobody there; the caller dropped those whose time passed): the first
--   writer when no read hold is left, or every reader up to the first writer, and on a
--   semaphore (state.cap) no more than leaves cap read holds live (a writer passed over because
--   its client is gone has used up the token it was drawn). Called only when no write hold is
--   live (a lapsed or released one's fields are cleared with the grant). Writes the hash, the
--   freed-by chain x, the ttl and `tail` (nil, or {member, waiter, alive, ttl}: a place to
--   queue behind, a take-over's, never granted by this call) before it sends anything. A
--   writer's hold lasts its grant ms and each reader's its own.
local FL_RW_PLACES = '(100000000000000'

local function fl_rw_read(hold, owner)
  local v
  if owner ~= '' then
    v = redis.call('HMGET', hold, 'o', 'c', 'f', 'l', 'r', 'x', 'g', 'e', 'n', '=' .. owner)
  else
    v = redis.call('HMGET', hold, 'o', 'c', 'f', 'l', 'r', 'x', 'g', 'e', 'n')
  end
  if v[1] == '' then
    v[1] = false
  end
  return v
end

local function fl_rw_state(reads, fields, now_ms, owner)
  local state = {owner = owner, writer = false, ends = 0, last = 0, readers = 0,
    cap = tonumber(fields[9]), changed = false}
  if fields[1] then
    local ends = tonumber(fields[8]) or 0
    if ends > now_ms then
      state.writer, state.ends = fields[1], ends
    else
      state.changed = true
    end
  end
  local count = fl_queue_call(reads, 'ZCARD')
  if count == 0 then
    return state
  end
  if not fields[3] then
    -- Left behind by a hash that is gone: none of them counts, and the set goes.
    state.stale = true
    return state
  end
  local now = string.format('%d', now_ms)
  local lapsed = redis.call('ZRANGEBYSCORE', reads, '-inf', now)
  if lapsed[1] then
    state.lapsed, state.changed = lapsed, true
  end
  state.readers = count - #lapsed
  if state.readers == 0 then
    return state
  end
  local top = redis.call('ZREVRANGE', reads, '0', '1', 'WITHSCORES')
  local last = top[1] == owner and tonumber(top[4] or 0) or tonumber(top[2])
  if last > now_ms then
    state.last = last
  end
  local detail = fields[10]
  if detail then
    local ends = tonumber(redis.call('ZSCORE', reads, owner) or 0)
    local count_, token, op, waiter = string.match(detail, '^(%d+) (%d+) (%S+) (%S+)$')
    if ends > now_ms and count_ then
      state.mine = {count = tonumber(count_), token = token, ends = ends, op = op,
        waiter = waiter}
    end
    state.had_mine = true
  end
  return state
end

local function fl_rw_detail(count, token, op, waiter)
  return string.format('%d %s %s %s', count, token, op, waiter)
end

-- Runs `command` on `key` with `items` as its arguments, a few hundred per call (Lua's unpack
-- has a stack limit): ZREM or HDEL of many members or fields.
local function fl_rw_batched(command, key, items)
  for from = 1, #items, 200 do
    redis.call(command, key, unpack(items, from, math.min(from + 199, #items)))
  end
end

local function fl_rw_drop_reads(hold, reads, owners)
  local fields = {}
  for i, owner in ipairs(owners) do
    fields[i] = '=' .. owner
  end
  fl_rw_batched('ZREM', reads, owners)
  fl_rw_batched('HDEL', hold, fields)
end

local function fl_rw_add_reads(hold, reads, holds)
  for from = 1, #holds, 100 do
    local details, ends = {}, {}
    for i = from, math.min(from + 99, #holds) do
      local h = holds[i]
      details[#details + 1] = '=' .. h.owner
      details[#details + 1] = fl_rw_detail(h.count, h.token, h.op, h.waiter)
      ends[#ends + 1] = string.format('%d', h.ends)
      ends[#ends + 1] = h.owner
    end
    redis.call('HSET', hold, unpack(details))
    redis.call('ZADD', reads, unpack(ends))
  end
end

local function fl_rw_put_reads(hold, reads, state)
  if state.stale then
    redis.call('DEL', reads)
    state.stale = nil
  end
  if state.lapsed then
    fl_rw_drop_reads(hold, reads, state.lapsed)
    state.lapsed = nil
  end
  if state.mine_changed then
    local mine = state.mine
    if mine then
      fl_rw_add_reads(hold, reads, {{owner = state.owner, count = mine.count,
        token = mine.token, ends = mine.ends, op = mine.op, waiter = mine.waiter}})
    elseif state.had_mine then
      fl_rw_drop_reads(hold, reads, {state.owner})
    end
    state.had_mine = mine ~= nil
    state.mine_changed = nil
  end
end

local function fl_rw_holds_read(reads, owner, now_ms)
  local ends = redis.call('ZSCORE', reads, owner)
  return ends ~= false and tonumber(ends) > now_ms
end

local function fl_rw_read_of(hold, reads, waiter, now_ms)
  local owners = redis.call('ZRANGEBYSCORE', reads, '(' .. string.format('%d', now_ms), '+inf')
  for _, owner in ipairs(owners) do
    local detail = redis.call('HGET', hold, '=' .. owner)
    if detail and string.match(detail, ' (%S+)$') == waiter then
      return owner
    end
  end
  return nil
end

local function fl_rw_first(reads, now_ms)
  local first = redis.call('ZRANGEBYSCORE', reads, '(' .. string.format('%d', now_ms), '+inf',
    'WITHSCORES', 'LIMIT', '0', '1')
  return tonumber(first[2]) or 0
end

local function fl_rw_last(state)
  local last = math.max(state.last, state.ends)
  if state.mine and state.mine.ends > last then
    last = state.mine.ends
  end
  return last
end

local function fl_rw_keep(hold, reads, state, now_ms, window)
  local last = fl_rw_last(state)
  if last > now_ms then
    local ttl = string.format('%d', math.ceil(last - now_ms))
    redis.call('PEXPIRE', hold, ttl)
    if state.readers > 0 or state.mine then
      redis.call('PEXPIRE', reads, ttl)
    end
  else
    redis.call('PEXPIRE', hold, window)
  end
end

local function fl_rw_head(queue)
  local first = redis.call('ZRANGEBYSCORE', queue, FL_RW_PLACES, '+inf', 'WITHSCORES', 'LIMIT',
    '0', '1')
  if not first[1] then
    return nil
  end
  return first[1], tonumber(first[2])
end

local function fl_rw_queue_head(queue, fields, now_ms)
  -- The lowest score is the earliest sign of life: whether anybody is queued, and whether a
  -- waiter's time passed, in one read.
  local first = fl_queue_call(queue, 'ZRANGE', '0', '0', 'WITHSCORES')
  if not first[1] then
    return nil
  end
  if not fields[3] then
    redis.call('DEL', queue)
    return nil
  end
  if tonumber(first[2]) <= now_ms then
    -- Waiters whose client stopped vouching for them (rare): their places are found by a walk
    -- over the queue.
    local dead, gone = {}, {}
    for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', queue, '-inf', string.format('%d', now_ms))) do
      dead[waiter] = true
      gone[#gone + 1] = waiter
    end
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', queue, FL_RW_PLACES, '+inf')) do
      if dead[string.match(member, '^%S+')] then
        gone[#gone + 1] = member
      end
    end
    fl_rw_batched('ZREM', queue, gone)
  end
  return fl_rw_head(queue)
end

local function fl_rw_count(queue)
  return redis.call('ZCOUNT', queue, FL_RW_PLACES, '+inf')
end

local function fl_rw_queued(queue, waiter)
  return waiter ~= '' and redis.call('ZSCORE', queue, waiter) ~= false
end

local function fl_rw_join(queue, member, waiter, alive_until, ttl)
  redis.call('ZADD', queue, 'NX', fl_now_text(), member)
  redis.call('ZADD', queue, string.format('%d', alive_until), waiter)
  redis.call('PEXPIRE', queue, string.format('%d', ttl))
end

local function fl_rw_leave(queue, waiter, member)
  if not fl_rw_queued(queue, waiter) then
    return false
  end
  if not member or redis.call('ZREM', queue, member, waiter) < 2 then
    -- Its place is not the member the caller built (or it knows none): searched for (a sign
    -- of life has no space, so the search finds places alone).
    local place = fl_queue_find(queue, 1, waiter)
    redis.call('ZREM', queue, place or waiter, waiter)
  end
  return true
end

local function fl_rw_due(since, now_us, limit)
  return limit <= 0 or since <= now_us - limit * 1000
end

local function fl_rw_grant(hold, queue, reads, f, state, now_us, x, events, mode, lock_id, tail,
    window)
  local now_ms = math.floor(now_us / 1000)
  local wave, woken, held = {}, {}, {}
  local readers = state.readers
  -- The lapsed read holds go first: a reader granted now may be of an owner whose hold lapsed.
  fl_rw_put_reads(hold, reads, state)
  -- Every hold granted here draws its own token above the last: max(last + 1, clock).
  local last = tonumber(f) or 0
  local function next_token()
    last = math.max(last + 1, now_us)
    return string.format('%d', last)
  end
  local function join_tail()
    if tail then
      fl_rw_join(queue, tail.member, tail.waiter, tail.alive, tail.ttl)
      tail = nil
    end
  end
  -- The queue is read from its head a page at a time; the places this call is done with (granted,
  -- woken, or not a place) leave it before the next page is read.
  local page, done, stop = 4, {}, false
  while not stop do
    local places = redis.call('ZRANGEBYSCORE', queue, FL_RW_PLACES, '+inf', 'LIMIT', '0', page)
    if not places[1] then
      break
    end
    page = 32
    for _, place in ipairs(places) do
      local waiter, inbox, owner, lasts = fl_queue_parse(place)
      if not waiter then
        -- Not a place (never written by these scripts): dropped.
        done[#done + 1] = place
      elseif state.cap and readers + #wave >= state.cap then
        -- A semaphore with every permit held: the rest waits for the next release.
        stop = true
        break
      elseif string.byte(waiter, 1) == 114 then
        -- A reader: granted a read hold with the others of the wave.
        done[#done + 1], done[#done + 2] = place, waiter
        if held[owner] or (state.mine and state.owner == owner) or
            fl_rw_holds_read(reads, owner, now_ms) then
          woken[#woken + 1] = {inbox, waiter}
        else
          held[owner] = true
          local token = next_token()
          local ends = now_ms + tonumber(lasts)
          wave[#wave + 1] = {inbox, waiter, lasts, owner, ends, token}
        end
      elseif #wave == 0 and #woken == 0 and readers == 0 then
        -- A writer, with no read hold left: granted the lock alone.
        done[#done + 1], done[#done + 2] = place, waiter
        fl_rw_batched('ZREM', queue, done)
        done = {}
        local text = next_token()
        local ends = now_ms + tonumber(lasts)
        redis.call('HSET', hold, 'o', owner, 'c', '1', 'f', text, 'l', lasts, 'r', waiter,
          'x', x, 'g', waiter, 'e', string.format('%d', ends), 'i', '')
        state.f = text
        join_tail()
        local queued = fl_rw_count(queue)
        if fl_emit_to(events .. ':to:' .. inbox, mode,
            '0|grant|' .. waiter .. ',' .. text .. ',' .. lasts .. ',' .. queued .. '|' .. lock_id) then
          state.writer, state.ends = owner, ends
          if queued == 0 then
            -- Nobody left queued: the grantee's client hears of the next waiter (field i,
            -- rw_acquire.lua), as after a take that asked to.
            redis.call('HSET', hold, 'i', inbox)
          end
          fl_rw_keep(hold, reads, state, now_ms, window)
          return 'w'
        end
        -- Its client is gone: the next waiter's turn (the hash is written again; f stays
        -- where it went, tokens only grow). The walk starts again from the new head.
        redis.call('HSET', hold, 'o', '', 'c', '0', 'g', '', 'e', '')
        break
      else
        stop = true
        break
      end
    end
    fl_rw_batched('ZREM', queue, done)
    done = {}
  end
  if #wave == 0 and #woken == 0 then
    join_tail()
    return false
  end
  local last_before, added = state.last, {}
  for _, reader in ipairs(wave) do
    added[#added + 1] = {owner = reader[4], count = 1, token = reader[6], ends = reader[5],
      op = reader[2], waiter = reader[2]}
  end
  for _, reader in ipairs(wave) do
    if reader[5] > state.last then
      state.last = reader[5]
    end
  end
  state.readers = state.readers + #wave
  state.f = string.format('%d', last)
  -- No write hold is left (the caller grants only then): its fields go with the same write.
  fl_rw_add_reads(hold, reads, added)
  redis.call('HSET', hold, 'x', x, 'f', state.f, 'o', '', 'c', '0', 'g', '', 'e', '')
  fl_rw_keep(hold, reads, state, now_ms, window)
  join_tail()
  local queued = fl_rw_count(queue)
  -- One event per client: its granted readers, then its readers woken by name.
  local by_inbox, order = {}, {}
  for _, reader in ipairs(wave) do
    local inbox = reader[1]
    if not by_inbox[inbox] then
      by_inbox[inbox] = {}
      order[#order + 1] = inbox
    end
    local list = by_inbox[inbox]
    list[#list + 1] = reader[2] .. ':' .. reader[3] .. ':' .. reader[6]
  end
  local gone = {}
  for _, inbox in ipairs(order) do
    local payload = '0|grants|' .. queued .. ',' .. table.concat(by_inbox[inbox], ',') ..
      '|' .. lock_id
    if not fl_emit_to(events .. ':to:' .. inbox, mode, payload) then
      gone[inbox] = true
    end
  end
  for _, reader in ipairs(woken) do
    fl_emit_to(events .. ':to:' .. reader[1], mode, '0|name|' .. reader[2] .. '|' .. lock_id)
  end
  if next(gone) then
    -- Read holds granted to clients that are gone: taken back.
    local kept, dropped = {}, {}
    state.last = last_before
    for _, reader in ipairs(wave) do
      if not gone[reader[1]] then
        kept[#kept + 1] = reader
        state.last = math.max(state.last, reader[5])
      else
        dropped[#dropped + 1] = reader[4]
      end
    end
    fl_rw_drop_reads(hold, reads, dropped)
    state.readers = state.readers - #wave + #kept
    fl_rw_keep(hold, reads, state, now_ms, window)
    if (#kept == 0 and state.readers == 0) or (state.cap and state.readers < state.cap) then
      -- Nobody of the wave was there, or a semaphore's permits are left: the next in line.
      local granted = fl_rw_grant(hold, queue, reads, state.f, state, now_us, x, events, mode,
        lock_id, nil, window)
      if granted or #kept == 0 then
        return granted
      end
    end
  end
  return 'r'
end

local function fl_rw_settle(hold, queue, reads, head, f, state, now_us, x, events, mode,
    lock_id, tail, window)
  local granted = false
  if head and not state.writer then
    granted = fl_rw_grant(hold, queue, reads, f, state, now_us, x, events, mode, lock_id, tail,
      window)
    tail = nil
  end
  if not granted then
    -- One HSET: the chain, the read holds, the write hold's fields cleared unless it is live,
    -- and f when the call moved it (a release's floor; grants to waiters whose client was gone
    -- wrote theirs already, and write it again).
    fl_rw_put_reads(hold, reads, state)
    local args = {'x', x, false, false, false, false, false, false, false, false, false, false}
    local n = 2
    if not state.writer then
      args[3], args[4], args[5], args[6], args[7], args[8], args[9], args[10], n =
        'o', '', 'c', '0', 'g', '', 'e', '', 10
    end
    if state.f then
      args[n + 1], args[n + 2], n = 'f', state.f, n + 2
    end
    redis.call('HSET', hold, unpack(args, 1, n))
    fl_rw_keep(hold, reads, state, math.floor(now_us / 1000), window)
    if tail then
      fl_rw_join(queue, tail.member, tail.waiter, tail.alive, tail.ttl)
    end
  end
  return granted
end
