-- window.lua: check one request against a 60-second sliding window and count it if allowed, atomically.
--
-- Layout (DynLimits): one hash per (counter, minute); field "<second of the minute>" holds the number
-- of allowed requests in that second. The window at second t is the 60 buckets [t-59, t]: this
-- minute's fields up to t, plus the previous minute's fields after t.
--
-- A few more fields in the current minute's hash keep the cost of a request independent of how many
-- seconds hold counts (a naive HGETALL-and-sum costs 2.5x more once a minute is full):
--   c  the second (Unix) at which w and o were last brought up to date
--   w  the window's sum at c
--   o  the oldest second (Unix) in the window at c that holds a count; -1 when the window is empty
--   b  rejected until this second (Unix): nothing is counted while rejecting, so this stays true for
--   bl the limit it was computed for (a changed limit recomputes it)
-- A request in the same second as the previous one costs one HMGET plus, when allowed, three writes.
--
-- KEYS[1..4]  the hashes of minutes m-2, m-1, m and m+1
-- ARGV[1]     m: the caller's estimate of the current minute
-- ARGV[2]     now in Unix seconds, or "" to use this server's TIME (one clock for every instance)
-- ARGV[3]     the limit: requests per 60 s, at least 1
-- ARGV[4]     TTL of a minute hash, in seconds
--
-- Returns {allowed (1|0), remaining, reset, retry_after (-1 when none), now, microseconds of TIME
-- (-1 when ARGV[2] gave the time)}, or {-1, now} when now's minute is not among KEYS: the caller then
-- retries with the minute it learned.
-- The Rust twin of this arithmetic is limiter::Window; the store behaviour suite keeps them equal.

local m = tonumber(ARGV[1])
local t
local usec = -1
if ARGV[2] == '' then
  local now = redis.call('TIME')
  t = tonumber(now[1])
  usec = tonumber(now[2])
else
  t = tonumber(ARGV[2])
end
local limit = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])

local minute = math.floor(t / 60)
local idx = minute - m + 3
if idx < 2 or idx > 4 then
  return {-1, t}
end
local cur, prev = KEYS[idx], KEYS[idx - 1]
local base = minute * 60

local st = redis.call('HMGET', cur, 'c', 'w', 'o', 'b', 'bl')
local c, w, o = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
local b, bl = tonumber(st[4]), tonumber(st[5])
if c and t < c then
  t = c -- a window's clock never runs backwards
end
local sec = t - base

if b and bl == limit and t < b then
  return {0, 0, b - t, b - t, t, usec}
end

-- The count of absolute second s, for s in [t-59, t].
local function count_at(s)
  local v
  if s >= base then
    v = redis.call('HGET', cur, s - base)
  else
    v = redis.call('HGET', prev, s - base + 60)
  end
  return tonumber(v) or 0
end

-- The counts of fields from..to of a hash, as numbers.
local function fields(key, from, to)
  local out = {}
  if from > to then
    return out
  end
  local names = {}
  for k = from, to do
    names[#names + 1] = k
  end
  local vals = redis.call('HMGET', key, unpack(names))
  for i = 1, #names do
    out[i] = tonumber(vals[i]) or 0
  end
  return out
end

local function find_oldest()
  for s = t - 59, t do
    if count_at(s) > 0 then
      return s
    end
  end
  return -1
end

if not c then
  -- First request of this minute for this counter: build the window from the stored seconds.
  w = 0
  for _, n in ipairs(fields(prev, sec + 1, 59)) do w = w + n end
  for _, n in ipairs(fields(cur, 0, sec)) do w = w + n end
  o = -1
  if w > 0 then
    o = find_oldest()
  end
elseif c < t then
  -- Seconds c-59 .. t-60, all in the previous minute, leave the window.
  for _, n in ipairs(fields(prev, c - base + 1, sec)) do w = w - n end
  if w <= 0 then
    w = 0
    o = -1
  elseif o < t - 59 then
    o = find_oldest()
  end
end

if w + 1 > limit then
  -- Walk the oldest seconds out of the window until one more request fits.
  local retry = 60
  local left = w
  local from = o
  if from < 0 then
    from = t
  end
  for s = from, t do
    left = left - count_at(s)
    if left < limit then
      retry = s + 60 - t
      break
    end
  end
  redis.call('HSET', cur, 'c', t, 'w', w, 'o', o, 'b', t + retry, 'bl', limit)
  redis.call('EXPIRE', cur, ttl)
  return {0, 0, retry, retry, t, usec}
end

redis.call('HINCRBY', cur, sec, 1)
w = w + 1
if o < 0 then
  o = t
end
if b then
  redis.call('HSET', cur, 'c', t, 'w', w, 'o', o, 'b', 0)
else
  redis.call('HSET', cur, 'c', t, 'w', w, 'o', o)
end
redis.call('EXPIRE', cur, ttl)
return {1, limit - w, o + 60 - t, -1, t, usec}
