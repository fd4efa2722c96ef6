-- Helpers shared by every script; each script's file is appended to this one.
--
-- A record is one hash: f fingerprint, s state, t token, a attempt, l lease end (ms),
-- c created (ms), e expires (ms), r response, and one field "step:<name>" per checkpoint.
-- Times are milliseconds on the server's clock.

local function now_ms()
  local t = redis.call('TIME')
  local micros = tonumber(t[2])
  return tonumber(t[1]) * 1000 + (micros - micros % 1000) / 1000
end

-- A record is absent once it is expired and no live lease holds it (what purge_expired
-- removes elsewhere); Redis deletes it then on its own, through PEXPIREAT. An expired record
-- that a live lease holds is present: in flight for everyone but its owner.
local function absent_at(s, l, e, now)
  return now >= e and not (s == 'in_progress' and now < l)
end

local function absent(r, now)
  return absent_at(r.s, r.l, r.e, now)
end

-- A record this library did not write (a hand edit, another program) stops the script with
-- an IDEM_CORRUPT error naming the field, before anything reads or changes it: it is never
-- taken for absent (which would run the work again) nor fenced on garbage.
local STATES = { in_progress = true, completed = true, failed = true }
-- 2^53 - 1: the largest integer a Lua number holds exactly (idem's MAX_TOKEN).
local MAX_INTEGER = 9007199254740991

-- Integers as text without an exponent (tostring(1.7e12) would give "1.7e+12"). '%d' is
-- the cheapest exact form, but Lua formats it through a C long, 32 bits wide on some
-- platforms: whether it holds every integer idem writes is checked on the first call.
local long_holds_integers = nil
local function num(n)
  if long_holds_integers == nil then
    long_holds_integers = string.format('%d', MAX_INTEGER) == '9007199254740991'
  end
  if long_holds_integers then
    return string.format('%d', n)
  end
  return string.format('%.0f', n)
end

local function corrupt(what)
  return error(redis.error_reply('IDEM_CORRUPT ' .. what))
end

-- A takeover or an operator's release of a record at the last token: no next token could
-- fence its owner (idem's machine::TokenAtLimit).
local function token_at_limit()
  return error(redis.error_reply('IDEM_TOKEN_LIMIT the token is at its limit'))
end

local function integer(value, what)
  local n = tonumber(value)
  if n == nil or n % 1 ~= 0 or n < 0 or n > MAX_INTEGER then
    corrupt(what)
  end
  return n
end

-- The fields every transition's fence and expiry read (state, token, attempt, lease end,
-- expiry), validated; v holds them in that order. As values: the completion, on every
-- fresh execution's path, builds no table.
local function fenced_values(v)
  if not STATES[v[1]] then corrupt('state') end
  if not v[3] or #v[3] ~= 16 then corrupt('attempt') end
  local t, l, e = integer(v[2], 'token'), integer(v[4], 'lease_until'),
    integer(v[5], 'expires_at')
  if t < 1 then corrupt('token') end
  return v[1], t, v[3], l, e
end

-- The same as a record table.
local function fenced_fields(v)
  local s, t, a, l, e = fenced_values(v)
  return { s = s, t = t, a = a, l = l, e = e }
end

-- Every hash idem writes has its fingerprint, from the first claim on. A hash without one
-- that still holds fields is not "no record": it may be a damaged record whose step fields
-- say work already ran. Starting afresh over it would either keep those steps (a later
-- takeover then skips steps that never ran) or, deleting it first, run the work again.
-- Refusing it as corrupt runs nothing and leaves it for an operator to read and delete.
local function refuse_fingerprintless(key)
  if redis.call('EXISTS', key) == 1 then
    corrupt('fingerprint')
  end
end

-- The record's fields, or nil when there is none or it is absent (deleting one whose moment
-- to vanish has come but which Redis has not yet deleted: within the same millisecond, say). Steps are
-- read separately (steps_of), only where an answer carries them.
local function load(key, now)
  local v = redis.call('HMGET', key, 's', 't', 'a', 'l', 'e', 'f', 'c', 'r')
  if not v[6] then
    refuse_fingerprintless(key)
    return nil
  end
  if #v[6] ~= 32 then corrupt('fingerprint') end
  local r = fenced_fields(v)
  r.f, r.c, r.r = v[6], integer(v[7], 'created_at'), v[8] or nil
  if absent(r, now) then
    redis.call('DEL', key)
    return nil
  end
  return r
end

-- The checkpoints as a flat list: name, value, name, value ...
local function steps_of(key)
  local raw = redis.call('HGETALL', key)
  local steps = {}
  for i = 1, #raw, 2 do
    if string.sub(raw[i], 1, 5) == 'step:' then
      table.insert(steps, string.sub(raw[i], 6))
      table.insert(steps, raw[i + 1])
    end
  end
  return steps
end

-- The key lives until until_ms: deleted now if that has come. text, when given, is
-- num(until_ms), already made for the record's own field.
local function keep_until(key, until_ms, now, text)
  if until_ms <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIREAT', key, text or num(until_ms))
  end
end

-- Keep the key exactly as long as it may be needed: until it expires, or until its lease
-- ends if that is later.
local function keep(key, r, now)
  local until_ms = r.e
  if r.s == 'in_progress' and r.l > until_ms then
    until_ms = r.l
  end
  keep_until(key, until_ms, now)
end

-- The record when it is present and owned by this lease.
local function owned(key, token, attempt, now)
  local r = load(key, now)
  if r == nil or r.t ~= token or r.a ~= attempt then
    return nil
  end
  return r
end

-- complete and fail: 1 when applied (or already applied by this owner), 0 when fenced.
-- Reads only what the fence and the expiry need (state, token, attempt, lease end,
-- expiry), each validated before use.
local function finish(key, token, attempt, response, terminal, retention)
  local v = redis.call('HMGET', key, 's', 't', 'a', 'l', 'e')
  if not v[1] then
    return 0
  end
  local s, t, a, l, e = fenced_values(v)
  local now = now_ms()
  if absent_at(s, l, e, now) then
    redis.call('DEL', key)
    return 0
  end
  if t ~= token or a ~= attempt then
    return 0
  end
  if s == terminal then
    -- Already stored by this owner: nothing is written again, not even the expiry.
    return 1
  end
  if s ~= 'in_progress' then
    return 0
  end
  -- A result stored late (heartbeats or a takeover kept the work past the retention) is
  -- kept one whole retention (the lease's) after now, never less than before.
  e = math.max(e, math.min(now + retention, MAX_INTEGER))
  local expires = num(e)
  redis.call('HSET', key, 's', terminal, 'r', response, 'e', expires)
  -- A finished record's key lives until its expiry: the lease no longer holds it.
  keep_until(key, e, now, expires)
  return 1
end

-- The claim's answer when it granted a lease other than a fresh record's (which answers
-- the time alone: claim.lua): token, lease end, whether it resumed, creation time, then
-- the steps as name, value pairs.
local function claimed(token, lease_until, resumed, created, steps)
  local reply = { 'claimed', token, lease_until, resumed, created }
  for _, item in ipairs(steps) do
    table.insert(reply, item)
  end
  return reply
end
