-- check.lua: library prelude prepended by src/scripts.rs to every script. Not a script of its
-- own.
--
-- Redis scripts are not transactions: a command that fails halfway leaves the earlier writes
-- in place. So every script first checks that each key it touches is missing or of the type
-- fredlock gives it, and refuses with a WRONGTYPE error before writing anything otherwise. A
-- value someone else planted under one of the lock's keys is never changed or deleted.
--
-- fl_expect(key, kind)                 raises WRONGTYPE unless key is missing or of type kind
local function fl_expect(key, kind)
  local found = redis.call('TYPE', key).ok
  if found ~= 'none' and found ~= kind then
    error('WRONGTYPE fredlock key ' .. key .. ' holds a ' .. found .. ', expected a ' .. kind)
  end
end
