-- claim. KEYS[1] record; ARGV fingerprint, attempt, lease (ms), retention (ms).
-- Returns {'claimed', token, lease_until, resumed, step, value, ...}, {'replay', response},
-- {'replay_failure', response}, {'in_flight', retry_after_ms} or {'mismatch'}.
local key = KEYS[1]
local fingerprint, attempt = ARGV[1], ARGV[2]
local lease, retention = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local r = load(key, now)

local function claimed(token, lease_until, resumed, steps)
  local reply = { 'claimed', token, lease_until, resumed }
  for _, item in ipairs(steps) do
    table.insert(reply, item)
  end
  return reply
end

if r == nil or now >= r.e then
  -- Absent or expired: a fresh record; the token continues while the key exists.
  local token = 1
  if r ~= nil then
    token = r.t + 1
  end
  redis.call('DEL', key)
  local fresh = { s = 'in_progress', l = now + lease, e = now + retention }
  redis.call('HSET', key, 'f', fingerprint, 's', 'in_progress', 't', num(token), 'a', attempt,
    'l', num(fresh.l), 'c', num(now), 'e', num(fresh.e), 'z', '0')
  keep(key, fresh, now)
  return claimed(token, fresh.l, 0, {})
end
if r.f ~= fingerprint then
  return { 'mismatch' }
end
if r.s == 'completed' then
  return { 'replay', r.r or '' }
end
if r.s == 'failed' then
  return { 'replay_failure', r.r or '' }
end
if now < r.l then
  if r.a == attempt then
    -- The same attempt asking again (its first answer was lost): the same lease.
    return claimed(r.t, r.l, 0, steps_of(key))
  end
  return { 'in_flight', r.l - now }
end
-- Takeover of an expired lease: next token, new attempt and lease, steps kept.
r.t, r.l = r.t + 1, now + lease
redis.call('HSET', key, 't', num(r.t), 'a', attempt, 'l', num(r.l), 'z', '1')
keep(key, r, now)
return claimed(r.t, r.l, 1, steps_of(key))
