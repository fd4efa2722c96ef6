-- Helpers shared by every script; each script's file is appended to this one.
--
-- A record is one hash: f fingerprint, s state, t token, a attempt, l lease end (ms),
-- c created (ms), e expires (ms), r response, z 1 when the last claim was a takeover,
-- and one field "step:<name>" per checkpoint. Times are milliseconds on the server's clock.

-- Integers as text without an exponent (tostring(1.7e12) would give "1.7e+12").
local function num(n)
  return string.format('%.0f', n)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A record is absent once it is expired and no live lease holds it (what purge_expired
-- removes elsewhere); Redis deletes it then on its own, through PEXPIREAT. An expired record
-- that a live lease holds is present: in flight for everyone but its owner.
local function absent(r, now)
  return now >= r.e and not (r.s == 'in_progress' and now < r.l)
end

-- The record's fields, or nil when there is none or it is absent (deleting one whose moment
-- to vanish has come but which Redis has not yet deleted: within the same millisecond, say). Steps are
-- read separately (steps_of), only where an answer carries them.
local function load(key, now)
  local v = redis.call('HMGET', key, 'f', 's', 't', 'a', 'l', 'c', 'e', 'r', 'z')
  if not v[1] then
    return nil
  end
  local r = {
    f = v[1], s = v[2], t = tonumber(v[3]), a = v[4], l = tonumber(v[5]),
    c = tonumber(v[6]), e = tonumber(v[7]), r = v[8] or nil, z = v[9],
  }
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

-- Keep the key exactly as long as it may be needed: until it expires, or until its lease
-- ends if that is later.
local function keep(key, r, now)
  local until_ms = r.e
  if r.s == 'in_progress' and r.l > until_ms then
    until_ms = r.l
  end
  if until_ms <= now then
    redis.call('DEL', key)
  else
    redis.call('PEXPIREAT', key, num(until_ms))
  end
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
local function finish(key, token, attempt, response, terminal)
  local now = now_ms()
  local r = owned(key, token, attempt, now)
  if r == nil then
    return 0
  end
  if r.s == terminal then
    return 1
  end
  if r.s ~= 'in_progress' then
    return 0
  end
  redis.call('HSET', key, 's', terminal, 'r', response)
  r.s = terminal
  keep(key, r, now)
  return 1
end
