-- fair.lua: library prelude for the fair lock, prepended by src/scripts.rs after lib/hold.lua,
-- lib/queue.lua and lib/notify.lua (it uses their functions). Not a script of its own.
--
-- Direct hand-off. A release does not just wake the head of the queue and leave the lock free
-- for it (which costs the head one more round trip: event, then its own acquire script); it
-- *grants* the lock to the head: the hold is taken in the head's name with the head's op id
-- (its waiter id, field r), and one `grant` event tells the head's client the token. The head
-- returns from its wait without another script call. The event goes to the inbox of the head's
-- client alone (fl_emit_direct in lib/notify.lua; the client's tag is part of the bid), so the
-- readers of the other processes are not woken by it.
--
-- A granted hold lasts min(the head's requested lease, what is left of its waiter lease): a
-- head that died just before the grant stalls the queue no longer than its waiter lease would
-- have. The new owner's client extends it to the full lease a third into the grant (its
-- watchdog, or a one-time top-up for a fixed lease), unless it released the lock before. If the grant event is lost, the head's next attempt (after
-- a reconnect, a gap, or the heartbeat finding it unqueued) finds field r = its waiter id and
-- is answered "acquired" (fair_acquire.lua); if the head gave up meanwhile, queue_leave.lua
-- frees the hold it never took up.
--
-- fl_bid(lease, inbox, owner) -> the bid string a waiter records:
--   "<lease ms>|<inbox tag>|<owner id>"; the tag names the waiter's client (hex, "" for none:
--   its grant then goes to the shard's events key like every other event)
-- fl_peek_head(queue, alive, bids, now) -> {head, expiry, bid} of the queue's first waiter
--   when it is live, {} when the queue is empty, nil when the head is dead (eviction needed).
--   Reads only (LINDEX, ZSCORE, HGET: typed reads, so each key's type is checked by them).
-- fl_grant_head(hold, next_token, queue, alive, bids, now, events, seq, mode, maxlen, lock_id,
--               freed_by, peek)
--   On a free lock: evicts dead heads, grants the lock to the first live waiter and emits one
--   `grant` event, target "<waiter id>,<token>,<server ms of the grant>,<ms the hold lasts>",
--   into the inbox of the head's client (to `events` when the bid names none, or when the
--   inbox key holds a foreign value).
--   next_token: a function that issues the grant's fencing token (fl_fence_next, lib/fence.lua),
--   or nil when the shard's fence key refused (missing, or another layout): the head is then
--   only named and takes the lock with its own script, which makes its client check the layout.
--   freed_by: the x the granted hold keeps (the ids of the releases that freed the lock, see
--   lib/hold.lua; nil: read from the tombstone, if any). A head
--   without a bid is only named (rule `name`; it takes the lock with its own script). peek
--   (optional): fl_peek_head's answer, read earlier in the same script; a live head it names is
--   not read again. Returns true when it granted the lock.
local function fl_bid(lease, inbox, owner)
  return lease .. '|' .. inbox .. '|' .. owner
end

local function fl_peek_head(queue, alive, bids, now)
  local head = redis.call('LINDEX', queue, 0)
  if not head then
    return {}
  end
  local expiry = tonumber(redis.call('ZSCORE', alive, head))
  local bid = redis.call('HGET', bids, head)
  if expiry and expiry > now then
    return {head, expiry, bid}
  end
  return nil
end

local function fl_grant_head(hold, next_token, queue, alive, bids, now, events, seq, mode, maxlen,
                             lock_id, freed_by, peek)
  local head, expiry, bid
  if peek and peek[1] then
    head, expiry, bid = peek[1], peek[2], peek[3]
  elseif peek then
    return false -- the queue was empty
  else
    local _
    head, _, expiry = fl_head(queue, alive, now, bids)
    if not head then
      return false
    end
    bid = redis.call('HGET', bids, head)
  end
  if not bid or not next_token then
    fl_emit(events, seq, mode, maxlen, lock_id, 'name', head)
    return false
  end
  local sep = string.find(bid, '|', 1, true)
  local lease = tonumber(string.sub(bid, 1, sep - 1))
  local tag_end = string.find(bid, '|', sep + 1, true) or sep
  local inbox = string.sub(bid, sep + 1, tag_end - 1)
  local owner = string.sub(bid, tag_end + 1)
  local lasts = expiry - now
  if lease < lasts then
    lasts = lease
  end
  fl_dequeue(queue, alive, head, bids)
  -- The token as decimal text: a Lua number would be written as 1.7955e+15 in the event.
  local token = next_token()
  fl_take(hold, token, owner, head, lasts, freed_by)
  local target = head .. ',' .. token .. ',' .. now .. ',' .. lasts
  local sent = inbox ~= ''
    and fl_emit_direct(events .. ':to:' .. inbox, mode, lock_id, 'grant', target)
  if not sent then
    fl_emit(events, seq, mode, maxlen, lock_id, 'grant', target)
  end
  return true
end
