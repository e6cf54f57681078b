-- inbox_keep.lua: keep a client's inbox streams (Stream mode) in existence while the client
-- lives. A release grants the lock only to a waiter whose client's inbox exists (lib/hold.lua),
-- so an inbox is the client's sign of life: its reader runs this script when it starts and
-- then every third of the ttl, and the inbox of a client that died is gone a ttl later.
-- A batch script: one key per inbox.
--
-- KEYS[1..n]       the inboxes "<events>:to:<inbox tag>" (one per shard in Redis Cluster)
-- ARGV[1] ttl      the inboxes' ttl in ms
--
-- Returns {n}: the number of inboxes created (they did not exist),
--         a WRONGTYPE error (and no change) when an inbox key holds a foreign value.
local ttl = tonumber(ARGV[1])
for _, inbox in ipairs(KEYS) do
  fl_expect(inbox, 'stream')
end
local created = 0
for _, inbox in ipairs(KEYS) do
  if redis.call('EXISTS', inbox) == 0 then
    local id = redis.call('XADD', inbox, '*', 'e', '')
    redis.call('XDEL', inbox, id)
    created = created + 1
  end
  redis.call('PEXPIRE', inbox, ttl)
end
return {created}
