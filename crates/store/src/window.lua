-- window.lua: check one request against every sliding window of its (API key, endpoint) counter
-- and count it in all of them or in none, atomically. The Rust twin is limiter::WindowSet (and
-- store::script the other side of this file's arguments and reply); the store behaviour suite keeps
-- them equal.
--
-- A request passes iff every enforced limit has room for its cost (sum + cost <= rl). It is then
-- counted in every enforced window, and in the shadow windows too if all of them have room (else
-- in none of them, and the reply says "shadow limited"). A limit whose rl is below the cost can
-- never pass and is not read at all.
--
-- The 60 s window keeps the DynLimits layout: one hash per (counter, minute); field "<second of the
-- minute>" holds the units counted in that second. The window at second t is the 60 buckets
-- [t-59, t]: this minute's fields up to t, plus the previous minute's fields after t. A few more
-- fields in each minute's hash keep the cost of a request independent of how many seconds hold
-- counts (a naive HGETALL-and-sum costs 2.5x more once a minute is full):
--   c  the second (Unix) at which w and o were last brought up to date
--   w  the window's sum at c
--   o  the oldest second (Unix) in the window at c that holds a count; -1 when the window is empty
--   b  refused until this second (Unix): nothing is counted while refusing, so this stays true for
--   bl the room (rl - cost) it was computed for (a changed limit or cost recomputes it)
-- Counts are only ever added at c, the latest second a hash has seen, so a window moves forward by
-- subtracting the seconds that leave it. Scans read fields in batches, never one command per second.
--
-- Any other window length w has one hash of its own, `<counter>:s<w>`, with n buckets (60 for
-- w >= 60, one per 100 ms below): bucket b holds the milliseconds [ceil(b*1000*w/n),
-- ceil((b+1)*1000*w/n)). Field "<b mod n>" holds bucket b's units, and c, s, o hold the latest
-- bucket, the sum and the oldest bucket with a count, kept up to date the same way; e is the
-- bucket at which the hash's TTL was last set (once per n buckets, not at every bucket). Buckets
-- are deleted as they leave, so the hash never holds more than n + 4 fields.
--
-- What a call costs inside Redis is mostly its commands (about 1 us each) and conversions between
-- numbers and strings (0.1-0.3 us each: Redis 7.0 formats every number argument with "%.17g"), so
-- the common paths use two commands per window, write only the fields that changed, and pass
-- strings where a number would be formatted twice. A hash field that is absent costs a scan of
-- the whole hash (a listpack) on every read, so b and bl are written with the first count.
--
-- A calendar period (a calendar quota's hour, day, week or month: the caller knows the time zones,
-- this script does not) has one hash per counter and period, `<counter>:<period>:<start>`, whose
-- field n holds the units counted in it. Its w argument is "<start_ms>:<end_ms>", the period the
-- caller named the hash for by its estimate of now; when now is outside it, nothing is written and
-- the reply is "-1 now_ms", as for a wrong minute. The hash expires a minute after the period ends.
--
-- KEYS        per limit, in the order of the limits: the minute hashes m-2, m-1, m and m+1 of its
--             counter when it has w = 60, else the hash of its window or period. Limits may count
--             in different counters (a request's endpoint and its pools: one API key's, so one
--             slot); one counter has at most one limit per window length or period.
-- ARGV[1]     m: the caller's estimate of the current minute
-- ARGV[2]     now in Unix milliseconds, or "" to use this server's TIME (one clock for every instance)
-- ARGV[3]     TTL of a minute hash, in seconds
-- ARGV[4]     cost of the request (>= 1)
-- ARGV[5]     k, the number of limits; then rl, w (or a calendar period's bounds, or a
--             concurrency limit's slot: see "A concurrency limit" below), shadow (0 or 1) for each
-- ARGV[6+3k]  (optional, a lease) extra units wanted beyond the cost: "want"
-- ARGV[7+3k]  units of a lease to give back first, and ARGV[8+3k] the time (Unix ms) the lease
--             was counted at; a cost of 0 only gives back (a concurrency limit's slot is freed by a
--             give-back of any size, and renewed by a call of cost 0)
--
-- Returns one string (the client decodes one value instead of many): "allowed shadow_limited
-- now_ms usec grant" (usec: microseconds of TIME, -1 when ARGV[2] gave the time; grant: the extra
-- units counted as a lease), then per limit "fits remaining reset_ms retry_ms" (retry_ms -1 when
-- none; remaining counts the lease as used; for a limit the cost did not fit, the room it has, or
-- -1 when the call did not read it); "-1 now_ms" when now's minute is not among KEYS (the
-- caller then retries with the minute it learned, nothing was written); "2 now_ms" after a give-back
-- alone.
--
-- Leases (docs/stores.md): the request's cost plus up to `want` units, at most half the room each
-- window has left after the cost, are counted at now's bucket, and the caller admits the extra
-- units itself until that bucket ends. It then gives back what it did not use: subtracted from
-- the bucket it was counted in (never below what that bucket holds), and from the window's sum
-- while that bucket is still in the window. No lease is granted when a window's clock is ahead of
-- now (its count would land in a later bucket than the caller expects) or a shadow limit lacks room.
--
-- The file reads top to bottom as its two paths: (1) one enforced 60 s limit, the common cases in
-- one straight line, returning when it decides; (2) every other case, each limit's state read by a
-- check function that returns it, handed to the function that writes it. Nothing at file level
-- changes after the time is read (no function leaves state there for another), and the general
-- path's functions are defined after the straight line, so that a call the straight line decides
-- never pays for making them.

local call, tonumber, fmt = redis.call, tonumber, string.format

local m = tonumber(ARGV[1])
-- Redis' clock unless the caller gave its own (ARGV[2]); set here once, read everywhere below.
local now_ms
local usec = -1
if ARGV[2] == '' then
  local now = call('TIME')
  usec = tonumber(now[2])
  now_ms = tonumber(now[1]) * 1000 + (usec - usec % 1000) / 1000
else
  now_ms = tonumber(ARGV[2])
end

-- Seconds c-59 .. t-60 (c < t; all in the previous minute, whose hash is `prev` and starts at
-- second pbase) leave the 60 s window of sum w and oldest count o. Reads them together with t-59,
-- where the oldest count is looked for first when it left. Returns the new w and o, and the values
-- read when the oldest count is still to be found (o is then stale).
local function leave(prev, pbase, c, t, w, o)
  local from, last = c - 59, math.min(t - 59, pbase + 59)
  local names = {}
  for s = from, last do
    names[s - from + 1] = s - pbase
  end
  local vals = call('HMGET', prev, unpack(names))
  for i = 1, t - 60 - from + 1 do
    w = w - (tonumber(vals[i]) or 0)
  end
  if w <= 0 then
    return 0, -1
  elseif o >= t - 59 then
    return w, o
  elseif t - 59 <= last and (tonumber(vals[t - 59 - from + 1]) or 0) > 0 then
    return w, t - 59
  end
  return w, o, vals
end

-- (1) The common cases in one straight line, for one enforced 60 s limit: a counter with room
-- (counted in this minute already, or its first call of the minute), and a counter refused until a
-- known second. They cost 30-40% less than the general path below (no tables of limits, no
-- closures, fewer conversions). Anything else (over the limit without a known block, the oldest
-- count to be searched, a block that ended) falls through, having written nothing, to the general
-- path, which reads again and gives the same answer (the store behaviour suite and its random walks
-- run both).
if ARGV[5] == '1' and ARGV[7] == '60' and ARGV[8] == '0' and #ARGV == 8 then
  local t = (now_ms - now_ms % 1000) / 1000
  local minute = (t - t % 60) / 60
  local idx = minute - m + 3
  if idx >= 2 and idx <= 4 then
    local cur = KEYS[idx]
    local sec = fmt('%d', t - minute * 60)
    local st = call('HMGET', cur, 'c', 'w', 'o', 'b', 'bl', sec)
    local c, w, o, b = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
    local rl, cost = tonumber(ARGV[6]), tonumber(ARGV[4])
    local o0, found = o, false -- found: w and o are the window's at t
    if c and w and o and c <= t and b == 0 then
      found = true
      if c < t then
        local rest
        w, o, rest = leave(KEYS[idx - 1], minute * 60 - 60, c, t, w, o)
        found = not rest
      end
    elseif c and c <= t and b and t < b and tonumber(st[5]) == rl - cost then
      -- Refused until second b for this room (limit - cost): nothing to read or count.
      local retry = b * 1000 - now_ms
      return fmt('0 0 %d %d 0 0 -1 %d %d', now_ms, usec, retry, retry)
    elseif not c then
      -- The first call of this minute: the window is what the previous minute's hash holds after
      -- second t-60. When that hash was last counted in at second pc, within the last 30 seconds,
      -- the seconds pc-59 .. t-60 have left since (read with t-59, where the oldest count is
      -- looked for first); a key idle for a minute has an empty window.
      local p = call('HMGET', KEYS[idx - 1], 'c', 'w', 'o')
      local pc, pw, po = tonumber(p[1]), tonumber(p[2]), tonumber(p[3])
      w, o, found = 0, -1, true
      if pc and pc > t - 60 then
        found = false
        if pw and po and t - pc <= pc - t + 60 and idx >= 3 then
          local rest
          w, o, rest = leave(KEYS[idx - 1], minute * 60 - 60, pc, t, pw, po)
          found = not rest
        end
      end
    end
    -- Otherwise (over the limit, the oldest count to be searched, a block that ended) the general
    -- path decides.
    if found and w + cost <= rl then
      w = w + cost
      if o < 0 then
        o = t
      end
      local here = (tonumber(st[6]) or 0) + cost
      if not c then
        call('HSET', cur, sec, here, 'w', w, 'c', t, 'o', o, 'b', '0', 'bl', '0')
        call('EXPIRE', cur, ARGV[3])
      elseif c == t and o == o0 then
        call('HSET', cur, sec, here, 'w', w)
      elseif o == o0 then
        call('HSET', cur, sec, here, 'w', w, 'c', t)
      else
        call('HSET', cur, sec, here, 'w', w, 'c', t, 'o', o)
      end
      return fmt('1 0 %d %d 0 1 %d %d -1', now_ms, usec, rl - w, (o + 60) * 1000 - now_ms)
    end
  end
end
-- (2) The general path. ------------------------------------------------------------------------

local ttl = ARGV[3] -- handed to EXPIRE as it came
local cost = tonumber(ARGV[4])
local k = tonumber(ARGV[5])

local limits = {}
local has60 = false
local nk = 0 -- KEYS taken so far
for i = 1, k do
  local rl = tonumber(ARGV[3 + 3 * i])
  local w = tonumber(ARGV[4 + 3 * i])
  -- Every field a limit will get, at once: a table that grows is rebuilt.
  local l = {rl = rl, w = w or 0, shadow = ARGV[5 + 3 * i] == '1', never = rl < cost,
    fits = false, remaining = -1, reset = 0, retry = -1, from = nil, to = nil, base = 0, key = nil,
    con = false, hold = 0, who = nil, renew = false}
  if not w then
    -- A calendar period, "<start_ms>:<end_ms>"; or a concurrency limit, "c<hold_ms>:<slot>" (take
    -- or give slot <slot>) or "r<hold_ms>:<slot>,<slot>..." (renew those slots).
    local arg = ARGV[4 + 3 * i]
    local mode, hold, who = string.match(arg, '^([cr])(%d+):(.+)$')
    if mode then
      l.con, l.hold, l.who, l.renew = true, tonumber(hold), who, mode == 'r'
      l.never = rl < 1 -- a request takes one slot whatever its cost
    else
      local a, b = string.match(arg, '^(%d+):(%d+)$')
      l.from, l.to = tonumber(a), tonumber(b)
      if not l.from or now_ms < l.from or now_ms >= l.to then
        return fmt('%d %d', -1, now_ms) -- the caller named another period: nothing written
      end
    end
  end
  if l.w == 60 then
    has60 = true
    l.base = nk -- its minute hashes are KEYS[base + 1 .. base + 4]
    nk = nk + 4
  else
    l.key = KEYS[nk + 1]
    nk = nk + 1
  end
  limits[i] = l
end
local want = tonumber(ARGV[6 + 3 * k]) or 0
local give, given_at = tonumber(ARGV[7 + 3 * k]) or 0, tonumber(ARGV[8 + 3 * k]) or 0

-- Integer division of non-negative integers, exact in doubles below 2^53.
local function div(a, b)
  return (a - a % b) / b
end

-- The 60 s window (DynLimits layout). ------------------------------------------------------------

-- Reads the state of the 60 s window at now and checks limit l against it (l.fits, l.remaining,
-- l.reset, l.retry). Returns what dyn_count needs to count the request there, or false when now's
-- minute is not among KEYS.
local function dyn_check(l)
  local t = div(now_ms, 1000)
  local minute = div(t, 60)
  local idx = minute - m + 3
  if idx < 2 or idx > 4 then
    return false
  end
  local cur, prev = KEYS[l.base + idx], KEYS[l.base + idx - 1]
  local base = minute * 60
  local room = l.rl - cost

  local sec = fmt('%d', t - base) -- a field name used twice: formatted once
  local st = call('HMGET', cur, 'c', 'w', 'o', 'b', 'bl', sec)
  local c, w, o = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  local b, bl = tonumber(st[4]), tonumber(st[5])
  local here = tonumber(st[6]) or 0 -- the count of second t
  if c and t < c then
    t = c -- a window's clock never runs backwards
    sec = fmt('%d', t - base)
    here = tonumber(call('HGET', cur, sec)) or 0
  end
  local nowx = math.max(now_ms, t * 1000)
  local o0 = o

  if b and bl == room and t < b then
    l.fits, l.remaining, l.retry = false, -1, b * 1000 - nowx
    l.reset = l.retry
    return {} -- refused until b: nothing will be counted
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
    local vals = call('HMGET', key, unpack(names))
    for i = n + 1, #names do
      known[from + i - n - 1] = tonumber(vals[i]) or 0
    end
    return vals
  end

  -- The counts of absolute seconds from..to (at most 60 of them, within minutes minute-2 ..
  -- minute), as a list, reading what is not known yet with one HMGET per minute hash.
  local function counts(from, to)
    local out = {}
    local s = from
    while s <= to do
      local hm = div(s, 60)
      local last = math.min(to, hm * 60 + 59)
      if known[s] == nil or known[last] == nil then
        read(KEYS[l.base + idx - (minute - hm)], hm, s, last, {})
      end
      for q = s, last do
        out[#out + 1] = known[q]
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
  -- start (a busy key), so this reads 1 second, then 4, then 16... (a small hash is a list that
  -- every field lookup scans: reading fields that are not needed is not free).
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
    -- same read fetches the seconds this needs if that hash was last used a second ago (a busy
    -- key): t-60, which leaves the window, and t-59, where the oldest count is looked for first.
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
    local vals
    w, o, vals = leave(prev, base - 60, c, t, w, o)
    if vals then
      for i, v in ipairs(vals) do
        known[c - 59 + i - 1] = tonumber(v) or 0
      end
      o = first_count(t - 59)
    end
  end
  if w + cost > l.rl then
    -- Walk the oldest seconds out of the window until the cost fits.
    local retry = 60
    local left = w
    local from = o
    if from < 0 then
      from = t
    end
    for i, n in ipairs(counts(from, t)) do
      left = left - n
      if left <= room then
        retry = from + i - 1 + 60 - t
        break
      end
    end
    -- Remembered even if another limit refused too: nothing is counted here until t + retry.
    call('HSET', cur, 'c', t, 'w', w, 'o', o, 'b', t + retry, 'bl', room)
    if not c then
      call('EXPIRE', cur, ttl) -- set once, by the hash's first write; it outlives the next minute
    end
    l.fits, l.remaining, l.retry = false, math.max(l.rl - w, 0), (t + retry) * 1000 - nowx
    l.reset = l.retry
    return {} -- refused: nothing will be counted
  end
  l.fits, l.remaining, l.retry = true, l.rl - w, -1
  l.reset = o >= 0 and (o + 60) * 1000 - nowx or 0
  -- o0: the oldest count as the hash has it, so that only a changed one is written.
  return {cur = cur, sec = sec, here = here, t = t, c = c, b = b, w = w, o = o, o0 = o0,
    nowx = nowx, behind = t * 1000 > now_ms}
end

-- Counts the request's `units` (its cost and any lease) in the 60 s window whose state dyn_check
-- returned (d), with one write: the count of second t (read above) and the state fields that
-- changed.
local function dyn_count(l, d, units)
  local t, o = d.t, d.o
  local w = d.w + units
  if o < 0 then
    o = t
  end
  local args = {d.cur, d.sec, d.here + units, 'w', w}
  if d.c ~= t then
    args[#args + 1] = 'c'
    args[#args + 1] = t
  end
  if o ~= d.o0 then
    args[#args + 1] = 'o'
    args[#args + 1] = o
  end
  if d.b ~= 0 then
    -- Absent (the first count) or a block that ended.
    args[#args + 1] = 'b'
    args[#args + 1] = '0'
    if not d.b then
      args[#args + 1] = 'bl'
      args[#args + 1] = '0'
    end
  end
  call('HSET', unpack(args))
  if not d.c then
    call('EXPIRE', d.cur, ttl)
  end
  l.remaining = l.rl - w
  l.reset = (o + 60) * 1000 - d.nowx
end

-- Any other window length. -----------------------------------------------------------------------

local function gen_check(l, key)
  local w = l.w
  local n = w >= 60 and 60 or 10 * w
  local function start(b)
    return div(b * 1000 * w + n - 1, n)
  end
  local t = div(now_ms * n, 1000 * w)
  local slot = fmt('%d', t % n)
  -- The state and bucket t's slot, in one read.
  local st = call('HMGET', key, 'c', 's', 'o', 'e', slot)
  local c, s, o, e = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
  local here = tonumber(st[5]) or 0
  if c and t < c then
    t = c
    slot = fmt('%d', t % n)
    here = tonumber(call('HGET', key, slot)) or 0
  end
  local o0 = o
  local moved, clear = false, false
  if c and t - c >= n then
    call('DEL', key)
    c = nil
  end
  if not c then
    s, o, e, here = 0, -1, nil, 0
    moved = true
  elseif c < t then
    -- Buckets c-n+1 .. t-n leave the window (their slots are about to be reused). The last of
    -- them, t-n, is in bucket t's slot, read above: it is overwritten by this call's count, or
    -- deleted if nothing is counted.
    s = s - here
    clear = st[5] ~= false
    here = 0
    local names = {}
    for b = c - n + 1, t - n - 1 do
      if b >= 0 then names[#names + 1] = b % n end
    end
    if #names > 0 then
      local vals = call('HMGET', key, unpack(names))
      local gone = {}
      for i, v in ipairs(vals) do
        local x = tonumber(v)
        if x then
          s = s - x
          gone[#gone + 1] = names[i]
        end
      end
      if #gone > 0 then
        call('HDEL', key, unpack(gone))
      end
    end
    moved = true
  end
  -- Counts of buckets from..to (to <= t); bucket t's is `here`, whatever its slot still holds.
  local function counts(from, to)
    local names = {}
    for b = from, to do names[#names + 1] = b % n end
    local vals = call('HMGET', key, unpack(names))
    local out = {}
    for i = 1, #names do out[i] = tonumber(vals[i]) or 0 end
    if to == t then out[#names] = here end
    return out
  end
  if s <= 0 then
    s, o = 0, -1
  elseif o < t - n + 1 then
    -- The oldest count left: look for the next, 1 bucket, then 4, then 16...
    local b, batch = t - n + 1, 1
    o = -1
    while b <= t and o < 0 do
      local last = math.min(t, b + batch - 1)
      for i, x in ipairs(counts(b, last)) do
        if x > 0 then
          o = b + i - 1
          break
        end
      end
      b, batch = last + 1, batch * 4
    end
  end
  local nowx = math.max(now_ms, start(t))
  local g = {key = key, t = t, s = s, o = o, o0 = o0, e = e, n = n, slot = slot, here = here,
    clear = clear, start = start, nowx = nowx, moved = moved, behind = start(t) > now_ms}
  if s + cost > l.rl then
    local left, at, b, batch = s, t, o, 1
    while b <= t do
      local last = math.min(t, b + batch - 1)
      local found = false
      for i, x in ipairs(counts(b, last)) do
        left = left - x
        if left + cost <= l.rl then
          at, found = b + i - 1, true
          break
        end
      end
      if found then break end
      b, batch = last + 1, batch * 4
    end
    l.fits, l.remaining, l.retry = false, math.max(l.rl - s, 0), start(at + n) - nowx
    l.reset = l.retry
  else
    l.fits, l.remaining, l.retry = true, l.rl - s, -1
    l.reset = o >= 0 and start(o + n) - nowx or 0
  end
  return g
end

-- Writes what gen_check found (g) back to the window's hash: the request's `units` when
-- `counted`, and the moved window either way.
local function gen_write(l, g, counted, units)
  -- Anything counted leaves the window within w seconds; the margin covers clocks that differ.
  -- Set once per n buckets (about w seconds): counts written before the next refresh are at most
  -- w old when it comes due, and the TTL left then is still more than w.
  local refresh = not g.e or g.t - g.e >= g.n
  local args = {g.key}
  if counted then
    local o = g.o >= 0 and g.o or g.t
    args[2], args[3], args[4], args[5] = g.slot, g.here + units, 's', g.s + units
    if g.moved then
      args[#args + 1] = 'c'
      args[#args + 1] = g.t
    end
    if o ~= g.o0 then
      args[#args + 1] = 'o'
      args[#args + 1] = o
    end
    l.remaining = l.rl - g.s - units
    l.reset = g.start(o + g.n) - g.nowx
  elseif g.moved then
    args[2], args[3], args[4], args[5], args[6], args[7] = 'c', g.t, 's', g.s, 'o', g.o
    if g.clear then
      call('HDEL', g.key, g.slot)
    end
  else
    return
  end
  if refresh then
    args[#args + 1] = 'e'
    args[#args + 1] = g.t
  end
  call('HSET', unpack(args))
  if refresh then
    call('EXPIRE', g.key, 2 * l.w + 60)
  end
end

-- A calendar period. -----------------------------------------------------------------------------

-- Reads the count of limit l's period (hash `key`) and checks the request against it. A period's
-- reset is its end, whatever it holds.
local function cal_check(l, key)
  local n = tonumber(call('HGET', key, 'n')) or 0
  l.reset = l.to - now_ms
  if n + cost > l.rl then
    l.fits, l.remaining, l.retry = false, math.max(l.rl - n, 0), l.reset
  else
    l.fits, l.remaining, l.retry = true, l.rl - n, -1
  end
  return {key = key, n = n, behind = false}
end

-- Counts `units` in the period whose count cal_check read (c), when `counted`.
local function cal_write(l, c, counted, units)
  if not counted then
    return
  end
  call('HINCRBY', c.key, 'n', units)
  if c.n == 0 then
    -- Relative to now: the caller's clock may not be Redis' (time_source = local).
    call('PEXPIRE', c.key, l.to - now_ms + 60000)
  end
  l.remaining = l.rl - c.n - units
end

-- A concurrency limit. ---------------------------------------------------------------------------

-- The slots of a counter are a sorted set, `<counter>:c`: one member per request in flight
-- (`<instance>.<n>`, so a retried call takes no second slot), scored by the time (Unix ms) its slot
-- is held until. Its instance renews it while the request runs; a member whose time has passed is
-- a request whose instance died, and is dropped before counting.

-- Reads how many slots of limit l are taken now and checks the request (one slot) against it.
local function con_check(l)
  call('ZREMRANGEBYSCORE', l.key, '-inf', now_ms)
  local n = call('ZCARD', l.key)
  l.reset, l.retry = 0, -1 -- nothing says when a slot frees
  l.fits = n + 1 <= l.rl
  l.remaining = math.max(l.rl - n, 0)
  return {n = n, behind = false}
end

-- Takes the request's slot, when `counted`.
local function con_write(l, c, counted)
  if not counted then
    return
  end
  call('ZADD', l.key, now_ms + l.hold, l.who)
  -- Outlives every slot in it (each is held at most `hold` past its last write).
  call('PEXPIRE', l.key, 2 * l.hold)
  l.remaining = l.rl - c.n - 1
end

-- Frees the slot l names.
local function con_give(l)
  call('ZREM', l.key, l.who)
end

-- Holds the slots l names for `hold` more: those still there (a slot freed or dropped stays gone).
local function con_renew(l)
  local args, until_ms = {'ZADD', l.key, 'XX'}, now_ms + l.hold
  for who in string.gmatch(l.who, '[^,]+') do
    args[#args + 1] = until_ms
    args[#args + 1] = who
  end
  call(unpack(args))
  if l.hold > 0 then
    call('PEXPIRE', l.key, 2 * l.hold)
  end
end

-- Giving a lease back. ----------------------------------------------------------------------------

-- The first second in s+1 .. c holding a count in the 60 s window (minute hashes from KEYS[i],
-- s's), or c.
local function dyn_next(s, c, i)
  -- (i is an index into KEYS, the limit's base included.)
  local x, base = s + 1, div(s, 60)
  while x <= c do
    local hm = div(x, 60)
    local last = math.min(c, hm * 60 + 59)
    local names = {}
    for q = x, last do names[#names + 1] = q - hm * 60 end
    for j, v in ipairs(call('HMGET', KEYS[i + hm - base], unpack(names))) do
      if (tonumber(v) or 0) > 0 then return x + j - 1 end
    end
    x = last + 1
  end
  return c
end

-- Takes g units back from second s of limit l's 60 s window, if s is still in it.
local function dyn_give(l, s, g)
  local i = div(s, 60) - m + 3 -- KEYS index of s's minute hash, after the limit's base
  if i < 2 or i > 3 then
    return -- s's minute is more than a minute ago: s has left the window
  end
  i = l.base + i
  local key, field = KEYS[i], fmt('%d', s - div(s, 60) * 60)
  -- The window's state is in the next minute's hash once that one has been counted in.
  local skey = KEYS[i + 1]
  local st = call('HMGET', skey, 'c', 'w', 'o')
  if not tonumber(st[1]) then
    skey = key
    st = call('HMGET', key, 'c', 'w', 'o')
  end
  local c, w, o = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if not c or not w or s > c or s < c - 59 then
    return
  end
  local v = tonumber(call('HGET', key, field)) or 0
  local d = math.min(v, g)
  if d <= 0 then
    return
  end
  call('HSET', key, field, v - d)
  w = w - d
  if w <= 0 then
    w, o = 0, -1
  elseif o == s and v == d then
    o = dyn_next(s, c, i)
  end
  -- A remembered refusal may no longer hold: room came back.
  call('HSET', skey, 'w', w, 'o', o, 'b', '0')
end

-- Takes g units back from limit l's period (hash `key`), if the lease was counted in it (at_ms).
local function cal_give(l, key, at_ms, g)
  if at_ms < l.from or at_ms >= l.to then
    return -- counted in a period that is over
  end
  local d = math.min(tonumber(call('HGET', key, 'n')) or 0, g)
  if d > 0 then
    call('HINCRBY', key, 'n', -d)
  end
end

-- Takes g units back from the bucket of time at_ms of limit l's window (hash `key`), if that
-- bucket is still in it.
local function gen_give(l, key, at_ms, g)
  local n = l.w >= 60 and 60 or 10 * l.w
  local bs = div(at_ms * n, 1000 * l.w)
  local slot = fmt('%d', bs % n)
  local st = call('HMGET', key, 'c', 's', 'o', slot)
  local c, s, o, v = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4]) or 0
  if not c or not s or bs > c or bs <= c - n then
    return
  end
  local d = math.min(v, g)
  if d <= 0 then
    return
  end
  if v == d then
    call('HDEL', key, slot)
  else
    call('HSET', key, slot, v - d)
  end
  s = s - d
  if s <= 0 then
    s, o = 0, -1
  elseif o == bs and v == d then
    o = c
    for b = bs + 1, c do
      if (tonumber(call('HGET', key, fmt('%d', b % n))) or 0) > 0 then
        o = b
        break
      end
    end
  end
  call('HSET', key, 's', s, 'o', o)
end

if give > 0 then
  if has60 then
    local idx = div(div(now_ms, 1000), 60) - m + 3
    if idx < 2 or idx > 4 then
      return fmt('%d %d', -1, now_ms) -- nothing written yet
    end
  end
  -- In every window the lease was counted in: the caller sends the limits it was taken with.
  -- A concurrency limit's slot is given back whole (a request ended).
  for _, l in ipairs(limits) do
    if l.con then
      if not l.renew then con_give(l) end
    elseif l.w == 60 then
      dyn_give(l, div(given_at, 1000), give)
    elseif l.from then
      cal_give(l, l.key, given_at, give)
    else
      gen_give(l, l.key, given_at, give)
    end
  end
end
for _, l in ipairs(limits) do
  if l.renew then
    con_renew(l)
  end
end
if cost == 0 then
  return fmt('2 %d', now_ms)
end

-- Decide, then count. ----------------------------------------------------------------------------

-- What each limit's check read, for its write (none for a limit that can never pass).
local state = {}
-- The 60 s window first: it is the one that may find the minute guessed wrong, and nothing may be
-- written before that is known.
for i, l in ipairs(limits) do
  if l.w == 60 and not l.never then
    state[i] = dyn_check(l)
    if not state[i] then
      return fmt('%d %d', -1, now_ms)
    end
  end
end
local enforced_ok, shadow_ok = true, true
for i, l in ipairs(limits) do
  if l.never then
    l.fits, l.remaining, l.reset, l.retry = false, -1, l.from and l.to - now_ms or l.w * 1000, -1
  elseif l.con then
    state[i] = con_check(l)
  elseif l.from then
    state[i] = cal_check(l, l.key)
  elseif l.w ~= 60 then
    state[i] = gen_check(l, l.key)
  end
  if not l.fits then
    if l.shadow then shadow_ok = false else enforced_ok = false end
  end
end

-- A lease: at most half of the room every window (shadow ones too) has after the cost, so that
-- near a limit leases shrink to none and decisions go back to one call each.
local grant = 0
if want > 0 and enforced_ok and shadow_ok then
  grant = want
  for i, l in ipairs(limits) do
    if l.never or l.con or state[i].behind then
      grant = 0
    else
      grant = math.min(grant, div(l.remaining - cost, 2))
    end
  end
  grant = math.max(grant, 0)
end
for i, l in ipairs(limits) do
  local counted = enforced_ok and (shadow_ok or not l.shadow) and l.fits
  if l.never then
    -- nothing to write
  elseif l.con then
    con_write(l, state[i], counted)
  elseif l.w == 60 then
    if counted then dyn_count(l, state[i], cost + grant) end
  elseif l.from then
    cal_write(l, state[i], counted, cost + grant)
  else
    gen_write(l, state[i], counted, cost + grant)
  end
end
local head = fmt('%d %d %d %d %d', enforced_ok and 1 or 0, (enforced_ok and not shadow_ok) and 1 or 0,
  now_ms, usec, grant)
if k == 1 then
  local l = limits[1]
  return fmt('%s %d %d %d %d', head, l.fits and 1 or 0, l.remaining, l.reset, l.retry)
end
local out = {head}
for i, l in ipairs(limits) do
  out[i + 1] = fmt('%d %d %d %d', l.fits and 1 or 0, l.remaining, l.reset, l.retry)
end
return table.concat(out, ' ')
