-- window.lua: check one request against a 60-second sliding window and count it if allowed, atomically.
--
-- Layout (DynLimits): one hash per (counter, minute); field "<second of the minute>" holds the number
-- of allowed requests in that second. The window at second t is the 60 buckets [t-59, t]: this
-- minute's fields up to t, plus the previous minute's fields after t.
--
-- A few more fields in each minute's hash keep the cost of a request independent of how many seconds
-- hold counts (a naive HGETALL-and-sum costs 2.5x more once a minute is full):
--   c  the second (Unix) at which w and o were last brought up to date
--   w  the window's sum at c
--   o  the oldest second (Unix) in the window at c that holds a count; -1 when the window is empty
--   b  rejected until this second (Unix): nothing is counted while rejecting, so this stays true for
--   bl the limit it was computed for (a changed limit recomputes it)
-- Counts are only ever added at c, the latest second a hash has seen, so a window moves forward by
-- subtracting the seconds that leave it. A request in the same second as the previous one costs one
-- HMGET and one HSET; in a new second, one more HMGET (the seconds that left, and the next, where
-- the oldest count is looked for first); in a new minute, the state is carried over from the previous
-- minute's hash the same way, plus an EXPIRE. So a key hit every second costs about the same at a
-- minute boundary as anywhere else. Scans read fields in batches, never one command per second.
--
-- KEYS[1..4]  the hashes of minutes m-2, m-1, m and m+1
-- ARGV[1]     m: the caller's estimate of the current minute
-- ARGV[2]     now in Unix seconds, or "" to use this server's TIME (one clock for every instance)
-- ARGV[3]     the limit: requests per 60 s, at least 1
-- ARGV[4]     TTL of a minute hash, in seconds
--
-- Returns "allowed (1|0) remaining reset retry_after (-1 when none) now microseconds-of-TIME (-1 when
-- ARGV[2] gave the time)", or "-1 now" when now's minute is not among KEYS: the caller then retries
-- with the minute it learned. One string rather than an array of integers: the client decodes one
-- value instead of six, which was a tenth of the gateway's work per request.
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
  return string.format('%d %d', -1, t)
end
local cur, prev = KEYS[idx], KEYS[idx - 1]
local base = minute * 60

local st = redis.call('HMGET', cur, 'c', 'w', 'o', 'b', 'bl', t % 60)
local c, w, o = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
local b, bl = tonumber(st[4]), tonumber(st[5])
local here = tonumber(st[6]) or 0 -- the count of second t
if c and t < c then
  t = c -- a window's clock never runs backwards
  here = tonumber(redis.call('HGET', cur, t % 60)) or 0
end
local sec = t - base

if b and bl == limit and t < b then
  return string.format('0 0 %d %d %d %d', b - t, b - t, t, usec)
end

-- Counts read so far, by absolute second: every field is read at most once per call.
local known = {}

-- Reads the counts of absolute seconds from..to of one minute's hash (`key`, minute `hm`) into
-- `known`, with `extra` field names first; returns the values of the extra fields.
local function read(key, hm, from, to, extra)
  local names = {}
  for _, e in ipairs(extra) do
    names[#names + 1] = e
  end
  local n = #names
  for s = from, to do
    names[#names + 1] = s - hm * 60
  end
  if #names == 0 then
    return {}
  end
  local vals = redis.call('HMGET', key, unpack(names))
  for i = n + 1, #names do
    known[from + i - n - 1] = tonumber(vals[i]) or 0
  end
  return vals
end

-- The counts of absolute seconds from..to (at most 60 of them, within minutes minute-2 .. minute),
-- as a list, reading what is not known yet with one HMGET per minute hash.
local function counts(from, to)
  local out = {}
  local s = from
  while s <= to do
    local hm = math.floor(s / 60)
    local last = math.min(to, hm * 60 + 59)
    if known[s] == nil or known[last] == nil then
      read(KEYS[idx - (minute - hm)], hm, s, last, {})
    end
    for k = s, last do
      out[#out + 1] = known[k]
    end
    s = last + 1
  end
  return out
end

local function sum(from, to)
  local total = 0
  if from <= to then
    for _, n in ipairs(counts(from, to)) do total = total + n end
  end
  return total
end

-- The first second in [from, t] that holds a count, or -1. The oldest count is usually at the
-- start (a busy key), so this reads 1 second, then 4, then 16... (a small hash is a list that every
-- field lookup scans: reading fields that are not needed is not free).
local function first_count(from)
  local s = from
  local batch = 1
  while s <= t do
    local last = math.min(t, s + batch - 1)
    for i, n in ipairs(counts(s, last)) do
      if n > 0 then
        return s + i - 1
      end
    end
    s = last + 1
    batch = batch * 4
  end
  return -1
end

if not c then
  -- First request of this minute for this counter: nothing is counted here yet, so the window is
  -- what the previous minute's hash holds after second t-60. Take it from that hash's state. The
  -- same read fetches the seconds this needs if that hash was last used a second ago (a busy key):
  -- t-60, which leaves the window, and t-59, where the oldest count is looked for first.
  local p = read(prev, minute - 1, t - 60, math.min(t - 59, base - 1), {'c', 'w', 'o'})
  local pc, pw, po = tonumber(p[1]), tonumber(p[2]), tonumber(p[3])
  if not pc or pc <= t - 60 then
    w = 0
  elseif t - pc <= pc - t + 60 and idx >= 3 then
    -- Fewer seconds left the window since pc than are left in it: subtract those.
    w = pw - sum(pc - 59, t - 60)
  else
    w = sum(t - 59, pc)
  end
  if w <= 0 then
    w = 0
    o = -1
  elseif po >= t - 59 then
    o = po
  else
    o = first_count(t - 59)
  end
elseif c < t then
  -- Seconds c-59 .. t-60, all in the previous minute, leave the window; read them together with
  -- t-59, where the oldest count is looked for first when it left.
  read(prev, minute - 1, c - 59, math.min(t - 59, base - 1), {})
  w = w - sum(c - 59, t - 60)
  if w <= 0 then
    w = 0
    o = -1
  elseif o < t - 59 then
    o = first_count(t - 59)
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
  for i, n in ipairs(counts(from, t)) do
    left = left - n
    if left < limit then
      retry = from + i - 1 + 60 - t
      break
    end
  end
  redis.call('HSET', cur, 'c', t, 'w', w, 'o', o, 'b', t + retry, 'bl', limit)
  if not c then
    redis.call('EXPIRE', cur, ttl) -- set once, by the hash's first write; it outlives the next minute
  end
  return string.format('0 0 %d %d %d %d', retry, retry, t, usec)
end

w = w + 1
if o < 0 then
  o = t
end
-- One write: the count of second t (read above) and the state.
if b then
  redis.call('HSET', cur, sec, here + 1, 'c', t, 'w', w, 'o', o, 'b', 0)
else
  redis.call('HSET', cur, sec, here + 1, 'c', t, 'w', w, 'o', o)
end
if not c then
  redis.call('EXPIRE', cur, ttl)
end
return string.format('1 %d %d -1 %d %d', limit - w, o + 60 - t, t, usec)
