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
-- ARGV[4]  (optional, a lease) extra credit wanted beyond the cost
-- ARGV[5]  (optional) credit of an earlier lease to give back first, and ARGV[6] the expiry (Unix
--          ms) its window had then: given back only to that window, never to a later one
-- Returns "allowed (1|0) credit-left TTL-in-seconds" (TTL rounded, as Redis' TTL): one string, which
-- the client decodes faster than an array of integers. With ARGV[4]: then " grant expiry-ms pttl-ms"
-- (grant: the extra credit taken as a lease; expiry: the window's, Unix ms, which names it for the
-- give-back); a give-back alone (cost 0, nothing wanted) returns "2".
--
-- Leases (docs/stores.md): the credit is taken now, so no window ever gives out more than its
-- limit; the caller spends it for at most a second and never past the window's end, then gives
-- back what it did not use. A window's expiry identifies it: one started later expires at least
-- resetSeconds (>= 1 s) later, so a match within half a second is the same window.

local limit, cost = tonumber(ARGV[1]), tonumber(ARGV[3])
local leasing = ARGV[4] ~= nil
local now_ms
if leasing then
  local t = redis.call('TIME')
  now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local give = tonumber(ARGV[5]) or 0
  if give > 0 then
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl > 0 and math.abs(now_ms + pttl - tonumber(ARGV[6])) < 500 then
      -- Never more credit than the limit (the key's limit may have been lowered meanwhile).
      local add = math.min(give, limit - (tonumber(redis.call('GET', KEYS[1])) or 0))
      if add > 0 then
        redis.call('INCRBY', KEYS[1], add)
      end
    end
    if cost == 0 and tonumber(ARGV[4]) == 0 then
      return '2'
    end
  end
end

local left = redis.call('GET', KEYS[1])
local allowed, credit
if not left then
  if cost > limit then
    if leasing then
      return string.format('0 %d %d 0 0 0', limit, ARGV[2])
    end
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
if not leasing then
  return string.format('%d %d %d', allowed, credit, redis.call('TTL', KEYS[1]))
end
-- A lease: at most half of the credit left after the cost, so that near the limit leases shrink
-- to none and every hit is one call again.
local grant = 0
if allowed == 1 and cost > 0 then
  grant = math.min(tonumber(ARGV[4]), math.floor(credit / 2))
  if grant > 0 then
    credit = redis.call('DECRBY', KEYS[1], grant)
  end
end
local pttl = redis.call('PTTL', KEYS[1])
return string.format('%d %d %d %d %d %d', allowed, credit, redis.call('TTL', KEYS[1]), grant,
  now_ms + pttl, pttl)
