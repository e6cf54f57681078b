-- hold.lua: library prelude for every lock whose hold is one owner's reentrant hash, prepended
-- by src/scripts.rs. Not a script of its own.
--
-- A hold is a hash {o = owner id, c = hold count, f = fencing token, r = last op id, and
-- x = the op ids of the latest releases that freed the lock before this hold, newest first,
-- joined by ",", as many as fit in 64 bytes (two of the crate's op ids; more would take the
-- hash out of Redis's compact listpack encoding, which costs every take and release ~2 us)}.
-- After the last release the hash is replaced by a tombstone {r, x} that lives a few seconds,
-- so that a retried release (same op id) is still answered "released"; the next take keeps r
-- and x as its x. So a release re-sent after other owners already took (and freed) the lock
-- meanwhile (the client re-sends the commands of a broken connection, which takes a
-- reconnect: hand-offs are faster) is still answered "released", not "held by another". The
-- token comes from the shard's fence key (lib/fence.lua).
--
-- fl_freed_chain(op, older)  -> op followed by the ids of the list older (or false), as many
--                               as fit in 64 bytes (op at least)
-- fl_tomb_chain(r, x)        -> the x a take keeps from a tombstone {r, x}: false for none
-- fl_take(hold, token, owner, op, lease, freed_by) -> {1, token, 1}
--   Takes a free hold for owner with the fencing token `token` (a decimal string, from
--   fl_fence_next in lib/fence.lua) and a lease in ms. freed_by: the x to
--   keep (the ids of the releases that freed it), false for none (nil: read it from the
--   tombstone, if any). The hash is written over, not deleted first: a free hold is missing or
--   a tombstone with only r and x.
-- fl_reenter(hold, owner, op, lease)              -> {1, token, count}
--   Adds one level of re-entry (owner must hold it); a retried op is answered, not re-applied;
--   the lease is raised to `lease` if it is shorter.
-- fl_release(hold, owner, token, op, all, tomb, hand_over, prepare) -> status, holds left
--   status: 'partial' (holds left > 0), 'freed' (the hold is gone now), 'retried' (this op was
--   already applied), 'absent' (nobody holds it), 'other' (another owner or token holds it).
--   prepare (optional): called only when the release will free the lock, before its first
--   write, so it can read (and type-check) the keys hand_over will write; its result is passed
--   to hand_over.
--   hand_over (optional): called with the x to keep (op first, fl_freed_chain) and prepare's
--   result once the hold is deleted; when it returns true it took the hold over for someone
--   else (keeping that x), and no tombstone is written.
--   Its first access to the hold is HMGET, a typed read before any write: a foreign value under
--   the hold key raises WRONGTYPE with nothing changed.
-- fl_release_reply(status, left)                  -> the reply of a release script:
--   {1, holds left} released, {0, 0} not held, {-1, 0} held by another owner or token.
local function fl_freed_chain(op, older)
  if not older then
    return op
  end
  local chain = op .. ',' .. older
  if #chain <= 64 then
    return chain
  end
  local cut = string.find(chain, ',', 1, true)
  while true do
    local next_cut = string.find(chain, ',', cut + 1, true)
    if not next_cut or next_cut > 65 then
      return string.sub(chain, 1, cut - 1)
    end
    cut = next_cut
  end
end

local function fl_tomb_chain(r, x)
  if r then
    return fl_freed_chain(r, x)
  end
  return x or false
end

local function fl_take(hold, token, owner, op, lease, freed_by)
  if freed_by == nil then
    local tomb = redis.call('HMGET', hold, 'r', 'x')
    freed_by = fl_tomb_chain(tomb[1], tomb[2])
  end
  if freed_by then
    redis.call('HSET', hold, 'o', owner, 'c', 1, 'f', token, 'r', op, 'x', freed_by)
  else
    redis.call('HSET', hold, 'o', owner, 'c', 1, 'f', token, 'r', op)
  end
  redis.call('PEXPIRE', hold, lease)
  return {1, tonumber(token), 1}
end

local function fl_reenter(hold, owner, op, lease)
  local token = tonumber(redis.call('HGET', hold, 'f'))
  if redis.call('HGET', hold, 'r') == op then
    return {1, token, tonumber(redis.call('HGET', hold, 'c'))}
  end
  local count = redis.call('HINCRBY', hold, 'c', 1)
  redis.call('HSET', hold, 'r', op)
  if redis.call('PTTL', hold) < lease then
    redis.call('PEXPIRE', hold, lease)
  end
  return {1, token, count}
end

local function fl_release(hold, owner, token, op, all, tomb, hand_over, prepare)
  local fields = redis.call('HMGET', hold, 'o', 'c', 'f', 'r', 'x')
  local current, count, held_token, last_op = fields[1], tonumber(fields[2]), fields[3], fields[4]
  if last_op == op then
    return 'retried', count or 0
  end
  if fields[5] and string.find(',' .. fields[5] .. ',', ',' .. op .. ',', 1, true) then
    return 'retried', 0
  end
  if not current then
    return 'absent', 0
  end
  if current ~= owner or held_token ~= token then
    return 'other', 0
  end
  if all ~= '1' and count > 1 then
    redis.call('HSET', hold, 'c', count - 1, 'r', op)
    return 'partial', count - 1
  end
  local prepared = prepare and prepare()
  -- DEL first: it is never refused under maxmemory, so a release always frees the lock.
  redis.call('DEL', hold)
  if not (hand_over and hand_over(fl_freed_chain(op, fields[5]), prepared)) then
    if fields[5] then
      redis.call('HSET', hold, 'r', op, 'x', fields[5])
    else
      redis.call('HSET', hold, 'r', op)
    end
    redis.call('PEXPIRE', hold, tomb)
  end
  return 'freed', 0
end

local function fl_release_reply(status, left)
  if status == 'absent' then
    return {0, 0}
  elseif status == 'other' then
    return {-1, 0}
  end
  return {1, left}
end
