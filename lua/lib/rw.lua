-- rw.lua: library prelude for the read-write lock, prepended by src/scripts.rs after
-- lib/fence.lua, lib/notify.lua and lib/hold.lua, whose functions it uses. Not a script of its
-- own.
--
-- One hash per read-write lock (KEYS[1]) is its whole state, wait queue included, with the
-- fields, tokens and tombstone of the exclusive locks (lib/hold.lua):
--   o c f l r x g  the write hold and the retry records, as in lib/hold.lua (f: the latest
--                  token the lock issued, to a write or a read hold). t is never set: the
--                  write side's hand-overs are bounded by the head's wait alone (rw_release.lua)
--   e  the write hold's lease end, server clock in ms ("" without a writer). The hash's ttl is
--      the latest end of any of its holds, so a writer's own read hold (a downgrade) may keep
--      the hash past the write hold's lease: the write hold counts only while e is ahead
--   s  the read holds, one line per owner: "<owner> <count> <token> <end ms> <op> <waiter>\n":
--      its re-entry depth, its token (drawn when the owner's read hold began, as a write
--      hold's is: max(f + 1, server clock in us), so no two read holds of a lock share one and
--      a stale call of an ended read hold is refused; a downgrade carries its write hold's
--      token), its lease end
--      (server ms), the op id of the last call applied to it, and the waiter id a release
--      granted it under ("-" for a read hold its owner took by an attempt). A line counts only
--      while its end is ahead; the scripts drop lapsed lines as they meet them
--   i  the inbox tag of the write holder's client when it asked to hear of the hold's first
--      waiter, as in lib/hold.lua (rw_acquire.lua, ARGV[12]): a writer's take sets it, a grant
--      to a writer clears it, a write hand-over gives it to the successor's client, and the
--      call that queues the first waiter behind a live write hold sends the notice and clears it
--   n  the permit count of a semaphore (src/lock/semaphore.rs), which is this lock's read side
--      with at most n read holds at once and no writer (every acquisition has an owner of its
--      own, so one read line is one permit): a grant then stops at n live read holds, and
--      waiters queue once n are held. Set by rw_acquire.lua (ARGV[13]); absent on a read-write
--      lock, which has no bound
--   q  the wait queue as text, one line per waiter: "<waiter id> <inbox tag> <owner id>
--      <lease ms> <grant ms> <queued at ms> <alive until ms>\n" (the fields of a member of
--      lib/hold.lua's queue, when it queued (server ms: how long the head has waited, for the
--      write side's hand-over bound, rw_release.lua), then the time below). Unlike the
--      exclusive locks, the read-write lock keeps its queue in the hash, as text its grants
--      walk from the head
-- Waiters of both sides queue in q: a reader's waiter id starts with "r", a writer's with "w"
-- (then the client's inbox tag, ".", an op id: src/lock/rwlock.rs).
-- The last column of a line is the time (server ms) until which the waiter is known to be
-- alive: its queueing call set it a waiter lease ahead, and its client's heartbeat
-- (rw_heartbeat.lua) moves it on. A waiter whose time passed is dropped where the scripts meet
-- it: a writer that died waiting must not keep new readers out while readers hold the lock.
-- A writer at the head of the queue is granted the lock alone, once no read hold is left; the
-- readers at the head, up to the first writer, are granted read holds together (a wave), with
-- one event per client: "0|grants|<queued>,<waiter>:<grant ms>:<token>,...|<lock id>" (queued:
-- about how many waiters stay queued behind the wave, fl_rw_queued; each
-- granted hold draws its own token, so a waiter dates its grant by the token, as for a write
-- hold: src/engine/acquire.rs). A reader
-- whose owner holds a read hold already is not granted a second one: it is woken by name and
-- re-enters by its own call (one line per owner keeps one count, which a retried grant could
-- not tell apart from a re-entry).
-- The hash's ttl is the latest end of its holds, or the retry window once none is left (the
-- tombstone of lib/hold.lua, which keeps f and the freed-by chain x).
--
-- fl_rw_find(q, waiter)              -> start and end of the waiter's line in q, or nil
-- fl_rw_without(q, waiter)           -> q without the waiter's line, and whether it was there
-- fl_rw_queued(q)                    -> how many waiters q holds, estimated from the length of
--                                       its first line (0 when empty, else at least 1)
-- fl_rw_read(hold)                   -> the fields {o, c, f, l, r, x, q, g, e, s, n} (one HMGET:
--                                       a typed read), with o = false when "" or lapsed is not
--                                       known yet (see fl_rw_state)
-- fl_rw_state(fields, now_ms, owner) -> the live state: {writer (owner id or false), ends (the
--                                       write hold's end, 0 without), mine (owner's read line:
--                                       {count, token, ends, op, waiter} or nil), others (the
--                                       live lines of the other owners, as text), last (their
--                                       latest end, 0 if none), first (the earliest end of a
--                                       live read hold, mine included, 0 if none), readers (live
--                                       read holds, mine included), cap (n, or nil), changed (a
--                                       lapsed hold was dropped)}
-- fl_rw_line(owner, count, token, ends, op, waiter) -> one line of s
-- fl_rw_readers(state)              -> s as it is to be written: the others' lines and mine
-- fl_rw_last(state)                 -> the latest end of every hold in state (ms)
-- fl_rw_keep(hold, state, now_ms, window) sets the hash's ttl: to the latest end of its holds,
--                                       or to the retry window when none is left
-- fl_rw_queue_line(waiter, inbox, owner, lease, grant_ms, queued_at, alive_until) -> one line
--                                       of q
-- fl_rw_due(q, now_ms, limit)        -> whether the first waiter of q (not empty) has waited
--                                       limit ms or more (always with limit 0; a line it cannot
--                                       read counts as due)
-- fl_rw_live(q, now_ms)              -> q without the waiters whose time passed, and whether a
--                                       writer is left in it
-- fl_rw_live_by_pattern(q, now_ms)   -> the same, read by a pattern (a queue with a line of
--                                       another shape, or one to drop)
-- fl_rw_settle(hold, f, q, state, now_us, x, events, mode, lock_id, tail, window)
--   -> what fl_rw_grant returns. After a call ended or dropped holds (state is what is left):
--   grants the queue its turn when no write hold is live (fl_rw_grant), and otherwise, or when
--   nothing was granted, writes the lock as it is: the queue left (plus `tail`), the freed-by
--   chain x, the read holds, no write hold unless one is live, state.f when set (a release's
--   floor, or the token of a failed grant), and the ttl (the retry window when no hold is
--   left: the tombstone)
-- fl_rw_grant(hold, f, q, state, now_us, x, events, mode, lock_id, tail, window)
--   -> "w" (a writer was granted the lock), "r" (readers were granted
--   read holds, or woken to re-enter) or false (nothing granted: the queue is empty or held
--   only waiters whose client is gone, or its head is a writer and read holds are left), and
--   the queue left, which it wrote (with x) when it changed. state.f is then the lock's f.
--   Grants from the head of q, dropping waiters whose client is gone on the way (their time
--   passed, or fl_emit_to finds nobody there):
--   the first writer when no read hold is left, or every reader up to the first writer, and
--   on a semaphore (state.cap) no more than leaves cap read holds live (a
--   writer passed over because its client is gone has used up the token it was drawn). Called
--   only when no write hold is live (a lapsed or released one's fields are cleared with the
--   grant). Writes the hash (q left, plus `tail`, a line to queue behind: a take-over's), the
--   freed-by chain x and the ttl before it sends anything (a write refused for want of memory fails the script
--   before any event). A writer's hold lasts its grant ms and each reader's its own.
local function fl_rw_find(q, waiter)
  if not q or waiter == '' then
    return nil
  end
  local at, last = fl_find_word(q, waiter, 10, 32)
  if not at then
    return nil
  end
  return at, string.find(q, '\n', last, true)
end

local function fl_rw_without(q, waiter)
  local from, to = fl_rw_find(q, waiter)
  if not from then
    return q or '', false
  end
  return string.sub(q, 1, from - 1) .. string.sub(q, to + 1), true
end

local function fl_rw_queued(q)
  if not q or q == '' then
    return 0
  end
  -- Lines differ only in their owner ids' lengths: the first line's length gives the count
  -- closely enough, without a scan of the queue.
  return math.max(1, math.floor(#q / string.find(q, '\n', 1, true)))
end

local function fl_rw_read(hold)
  local v = redis.call('HMGET', hold, 'o', 'c', 'f', 'l', 'r', 'x', 'q', 'g', 'e', 's', 'n')
  if v[1] == '' then
    v[1] = false
  end
  return v
end

local function fl_rw_state(fields, now_ms, owner)
  local state = {owner = owner, writer = false, ends = 0, others = '', last = 0, first = 0,
    readers = 0, cap = tonumber(fields[11]), changed = false}
  if fields[1] then
    local ends = tonumber(fields[9]) or 0
    if ends > now_ms then
      state.writer, state.ends = fields[1], ends
    else
      state.changed = true
    end
  end
  local s = fields[10]
  if not s or s == '' then
    return state
  end
  -- One pass that captures each line's end and position but not its text, and the owner's
  -- line found by a plain search (a line starts with its owner id and a space): Redis's Lua
  -- hashes every byte of every string a script builds, so capturing every line and its
  -- fields, and joining the others' lines again, cost the server more than the rest of a
  -- call with a dozen readers. The others' lines are rebuilt only when one is dropped.
  local mine_at = owner ~= '' and fl_find_word(s, owner, 10, 32) or nil
  local lapsed, covered = false, 0
  for at, ends, stop in string.gmatch(s, '()%S+ %d+ %d+ (%d+) %S+ %S+\n()') do
    ends = tonumber(ends)
    covered = covered + stop - at
    if ends <= now_ms then
      lapsed = true
    else
      state.readers = state.readers + 1
      if state.first == 0 or ends < state.first then
        state.first = ends
      end
      if at == mine_at then
        local count, token, op, waiter = string.match(s, '^%S+ (%d+) (%d+) %d+ (%S+) (%S+)\n', at)
        state.mine = {count = tonumber(count), token = token, ends = ends, op = op, waiter = waiter}
      elseif ends > state.last then
        state.last = ends
      end
    end
  end
  if lapsed or covered ~= #s then
    -- Lapsed lines, or text that is no line (which these scripts never write), are dropped.
    state.changed = state.changed or lapsed
    local kept = {}
    for at, ends, stop in string.gmatch(s, '()%S+ %d+ %d+ (%d+) %S+ %S+\n()') do
      if tonumber(ends) > now_ms and at ~= mine_at then
        kept[#kept + 1] = string.sub(s, at, stop - 1)
      end
    end
    state.others = table.concat(kept)
  elseif state.mine then
    local stop = string.find(s, '\n', mine_at, true)
    state.others = string.sub(s, 1, mine_at - 1) .. string.sub(s, stop + 1)
  else
    state.others = s
  end
  return state
end

local function fl_rw_line(owner, count, token, ends, op, waiter)
  return string.format('%s %d %s %d %s %s\n', owner, count, token, ends, op, waiter)
end

local function fl_rw_readers(state)
  local mine = state.mine
  if not mine then
    return state.others
  end
  return state.others .. fl_rw_line(state.owner, mine.count, mine.token, mine.ends, mine.op,
    mine.waiter)
end

local function fl_rw_last(state)
  local last = math.max(state.last, state.ends)
  if state.mine and state.mine.ends > last then
    last = state.mine.ends
  end
  return last
end

local function fl_rw_keep(hold, state, now_ms, window)
  local last = fl_rw_last(state)
  if last > now_ms then
    redis.call('PEXPIRE', hold, string.format('%d', math.ceil(last - now_ms)))
  else
    redis.call('PEXPIRE', hold, window)
  end
end

local function fl_rw_queue_line(waiter, inbox, owner, lease, grant_ms, queued_at, alive_until)
  return string.format('%s %s %s %d %d %d %d\n', waiter, inbox, owner, lease, grant_ms,
    queued_at, alive_until)
end

local function fl_rw_due(q, now_ms, limit)
  if limit <= 0 then
    return true
  end
  local since = string.match(q, '^%S+ %S+ %S+ %d+ %d+ (%d+) %d+\n')
  return not since or tonumber(since) <= now_ms - limit
end

local function fl_rw_live_by_pattern(q, now_ms)
  -- fl_rw_live's reading of a queue with a line its plain searches cannot read.
  local kept, writer, dropped = {}, false, false
  for at, first, alive, stop in string.gmatch(q, '()(%S)[^\n]* (%d+)\n()') do
    if tonumber(alive) > now_ms then
      kept[#kept + 1] = string.sub(q, at, stop - 1)
      writer = writer or first == 'w'
    else
      dropped = true
    end
  end
  if not dropped then
    return q, writer
  end
  return table.concat(kept), writer
end

local function fl_rw_live(q, now_ms)
  if not q or q == '' then
    return '', false
  end
  -- Each line ends with its alive time, server ms: 13 digits (until the year 2286), read at a
  -- fixed offset from the line's end, which a plain search finds. A pattern would try a match
  -- at every byte and build every line as text (see fl_rw_state): with a dozen waiters that
  -- cost the server more than the rest of the call. A line of another shape, or one to drop,
  -- sends the queue to the pattern.
  local find, byte = string.find, string.byte
  local writer, at, size = false, 1, #q
  while at <= size do
    local stop = find(q, '\n', at, true)
    local alive = stop and stop - at > 14 and byte(q, stop - 14) == 32 and
      tonumber(string.sub(q, stop - 13, stop - 1))
    if not alive or alive <= now_ms then
      return fl_rw_live_by_pattern(q, now_ms)
    end
    writer = writer or byte(q, at) == 119
    at = stop + 1
  end
  return q, writer
end

local function fl_rw_grant(hold, f, q, state, now_us, x, events, mode, lock_id, tail, window)
  local now_ms = math.floor(now_us / 1000)
  local at, size = 1, #q
  local wave, woken, held = {}, {}, {}
  local lines, readers = {}, state.readers
  -- Every hold granted here draws its own token above the last: max(last + 1, clock).
  local last = tonumber(f) or 0
  local function next_token()
    last = math.max(last + 1, now_us)
    return string.format('%d', last)
  end
  while at <= size do
    local stop = string.find(q, '\n', at, true)
    local waiter, inbox, owner, lasts, alive =
      string.match(q, '^(%S+) (%S+) (%S+) %d+ (%d+) %d+ (%d+)\n', at)
    if waiter and tonumber(alive) <= now_ms then
      -- Its client stopped vouching for it: dropped.
      at = stop + 1
    elseif waiter and state.cap and readers + #wave >= state.cap then
      -- A semaphore with every permit held: the rest waits for the next release.
      break
    elseif waiter and string.byte(waiter, 1) == 114 then
      -- A reader: granted a read hold with the others of the wave.
      at = stop + 1
      if held[owner] or (state.mine and state.owner == owner) or
          fl_find_word(state.others, owner, 10, 32) then
        woken[#woken + 1] = {inbox, waiter}
      else
        held[owner] = true
        local token = next_token()
        local ends = now_ms + tonumber(lasts)
        lines[#lines + 1] = fl_rw_line(owner, 1, token, ends, waiter, waiter)
        wave[#wave + 1] = {inbox, waiter, lasts, owner, ends, token}
      end
    elseif waiter and #wave == 0 and #woken == 0 and readers == 0 then
      -- A writer, with no read hold left: granted the lock alone.
      at = stop + 1
      local text = next_token()
      local left = string.sub(q, at) .. (tail or '')
      local ends = now_ms + tonumber(lasts)
      redis.call('HSET', hold, 'o', owner, 'c', '1', 'f', text, 'l', lasts, 'r', waiter,
        'x', x, 'q', left, 'g', waiter, 'e', string.format('%d', ends), 's', fl_rw_readers(state),
        'i', '')
      state.f = text
      local queued = fl_rw_queued(left)
      if fl_emit_to(events .. ':to:' .. inbox, mode,
          '0|grant|' .. waiter .. ',' .. text .. ',' .. lasts .. ',' .. queued .. '|' .. lock_id) then
        state.writer, state.ends = owner, ends
        fl_rw_keep(hold, state, now_ms, window)
        return 'w', left
      end
      -- Its client is gone: the next waiter's turn (the hash is written again; f stays
      -- where it went, tokens only grow).
      redis.call('HSET', hold, 'o', '', 'c', '0', 'g', '', 'e', '')
    elseif waiter then
      break
    else
      -- Not a queue line (never written by these scripts): dropped.
      at = (stop or size) + 1
    end
  end
  if #wave == 0 and #woken == 0 then
    local left = string.sub(q, at) .. (tail or '')
    if at > 1 then
      -- Waiters whose client is gone were dropped on the way.
      redis.call('HSET', hold, 'q', left, 'x', x)
    end
    return false, left
  end
  local left = string.sub(q, at) .. (tail or '')
  local queued = fl_rw_queued(left)
  local others_before, last_before = state.others, state.last
  state.others = state.others .. table.concat(lines)
  for _, reader in ipairs(wave) do
    if reader[5] > state.last then
      state.last = reader[5]
    end
  end
  state.readers = state.readers + #wave
  state.f = string.format('%d', last)
  -- No write hold is left (the caller grants only then): its fields go with the same write.
  redis.call('HSET', hold, 's', fl_rw_readers(state), 'q', left, 'x', x, 'f', state.f,
    'o', '', 'c', '0', 'g', '', 'e', '')
  fl_rw_keep(hold, state, now_ms, window)
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
    -- Read holds granted to clients that are gone: taken back (their lines dropped).
    local kept = {}
    state.last = last_before
    for _, reader in ipairs(wave) do
      if not gone[reader[1]] then
        kept[#kept + 1] = fl_rw_line(reader[4], 1, reader[6], reader[5], reader[2], reader[2])
        state.last = math.max(state.last, reader[5])
      end
    end
    state.others = others_before .. table.concat(kept)
    state.readers = state.readers - #wave + #kept
    redis.call('HSET', hold, 's', fl_rw_readers(state))
    fl_rw_keep(hold, state, now_ms, window)
    if (#kept == 0 and state.readers == 0) or (state.cap and state.readers < state.cap) then
      -- Nobody of the wave was there, or a semaphore's permits are left: the next in line.
      local granted, rest = fl_rw_grant(hold, state.f, left, state, now_us, x, events, mode,
        lock_id, nil, window)
      if granted or #kept == 0 then
        return granted, rest
      end
      return 'r', rest
    end
  end
  return 'r', left
end

local function fl_rw_settle(hold, f, q, state, now_us, x, events, mode, lock_id, tail, window)
  local granted, left = false, q .. (tail or '')
  if q ~= '' and not state.writer then
    granted, left = fl_rw_grant(hold, f, q, state, now_us, x, events, mode, lock_id, tail,
      window)
  end
  if not granted then
    -- One HSET: the queue, the chain, the read holds, the write hold's fields cleared unless
    -- it is live, and f when the call moved it (a release's floor; grants to waiters whose
    -- client was gone wrote theirs already, and write it again).
    local args = {'x', x, 'q', left, 's', fl_rw_readers(state),
      false, false, false, false, false, false, false, false, false, false}
    local n = 6
    if not state.writer then
      args[7], args[8], args[9], args[10], args[11], args[12], args[13], args[14], n =
        'o', '', 'c', '0', 'g', '', 'e', '', 14
    end
    if state.f then
      args[n + 1], args[n + 2], n = 'f', state.f, n + 2
    end
    redis.call('HSET', hold, unpack(args, 1, n))
    fl_rw_keep(hold, state, math.floor(now_us / 1000), window)
  end
  return granted, left
end
