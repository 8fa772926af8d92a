-- divvy.lua: a fixed window, atomically: the window starts at the first hit and lasts
-- resetSeconds; the key holds the credit left. For Divvy (cost 1) the same key and value layout as
-- the original Divvy (scripts/pipe.lua), so quotagate and a running Divvy can share counters in one
-- Redis. The rate-limit service's clock-aligned fixed windows use it too, with the window's start in
-- the key and resetSeconds the time left until its end.
--
-- KEYS[1]  divvy:<sorted rule pairs>:<actor>:<creditLimit>:<resetSeconds>, or an aligned window's
-- ARGV[1]  creditLimit (> 0)
-- ARGV[2]  resetSeconds (> 0)
-- ARGV[3]  cost: credit this hit takes (0: a check); a hit without room takes none
-- Returns "allowed (1|0) credit-left TTL-in-seconds" (TTL rounded, as Redis' TTL): one string, which
-- the client decodes faster than an array of integers.

local left = redis.call('GET', KEYS[1])
local limit, cost = tonumber(ARGV[1]), tonumber(ARGV[3])
local allowed, credit
if not left then
  if cost > limit then
    return string.format('0 %d %d', limit, ARGV[2])
  end
  credit = limit - cost
  redis.call('SET', KEYS[1], credit, 'EX', ARGV[2])
  allowed = 1
elseif tonumber(left) >= cost then
  credit = redis.call('DECRBY', KEYS[1], cost)
  allowed = 1
else
  credit = tonumber(left)
  allowed = 0
end
return string.format('%d %d %d', allowed, credit, redis.call('TTL', KEYS[1]))
