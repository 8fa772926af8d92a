-- divvy.lua: Divvy's fixed window, atomically: the window starts at the first hit and lasts
-- resetSeconds; the key holds the credit left. Same key and value layout as the original Divvy
-- (scripts/pipe.lua), so quotagate and a running Divvy can share counters in one Redis.
--
-- KEYS[1]  divvy:<sorted rule pairs>:<actor>:<creditLimit>:<resetSeconds>
-- ARGV[1]  creditLimit (> 0)
-- ARGV[2]  resetSeconds (> 0)
-- Returns "allowed (1|0) credit-left TTL-in-seconds" (TTL rounded, as Redis' TTL): one string, which
-- the client decodes faster than an array of integers.

local left = redis.call('GET', KEYS[1])
local allowed, credit
if not left then
  credit = tonumber(ARGV[1]) - 1
  redis.call('SET', KEYS[1], credit, 'EX', ARGV[2])
  allowed = 1
elseif tonumber(left) > 0 then
  credit = redis.call('DECR', KEYS[1])
  allowed = 1
else
  credit = 0
  allowed = 0
end
return string.format('%d %d %d', allowed, credit, redis.call('TTL', KEYS[1]))
