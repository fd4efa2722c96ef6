-- claim. KEYS[1] record; ARGV fingerprint, attempt, lease (ms), retention (ms), both at most
-- idem's MAX_DURATION, so every time stays an exact Lua integer.
-- Returns the server's time (ms) alone when it made a fresh record (token 1, its lease
-- ending that time plus the lease, no steps), {'claimed', token, lease_until, resumed,
-- created_at, step, value, ...} when it granted any other lease, {'in_flight',
-- retry_after_ms} or {'mismatch'}; claim_replay.lua, run first, answers a completed
-- record with its response alone and a failed one with {'replay_failure', response}.
-- The two common answers are not tables: Redis converts a table reply by looking up each of
-- its special keys (err, ok, double and the rest) before walking it, which cost a replay
-- 0.3-0.6 us of about 4 and a fresh claim 0.5-0.7 of about 7 (redis-benchmark, Redis
-- 7.0). Every other answer must stay a table: the client (store.rs) reads any bare string
-- as a replay and any bare number as a fresh claim.
local key = KEYS[1]
local fingerprint, attempt = ARGV[1], ARGV[2]
local lease, retention = tonumber(ARGV[3]), tonumber(ARGV[4])

-- claim_replay.lua ran first and answered every present finished record; `peek` is its
-- read.
local now = now_ms()
local r = nil
if peek[1] or peek[2] then
  r = load(key, now)
else
  -- No fingerprint and no state: no record, unless the hash holds other fields.
  refuse_fingerprintless(key)
end

if r == nil then
  -- No record, or an absent one (load deleted it): a fresh record, a new lifetime at token
  -- 1. A record that is merely expired while a live lease holds it is not absent.
  local l, e = now + lease, now + retention
  local lease_text, expires_text = num(l), num(e)
  redis.call('HSET', key, 'f', fingerprint, 's', 'in_progress', 't', '1', 'a', attempt,
    'l', lease_text, 'c', num(now), 'e', expires_text)
  if l > e then
    keep_until(key, l, now, lease_text)
  else
    keep_until(key, e, now, expires_text)
  end
  return now
end
if r.f ~= fingerprint then
  return { 'mismatch' }
end
-- A finished record was answered by claim_replay.lua, which runs first: r is in progress.
if now < r.l then
  if r.a == attempt then
    -- The same attempt asking again (its first answer was lost): the same lease.
    return claimed(r.t, r.l, 0, r.c, steps_of(key))
  end
  return { 'in_flight', r.l - now }
end
if r.a == attempt then
  -- The attempt whose lease ended (released, or run out): a late copy of a claim it
  -- already won. Taking over would hold the key a whole lease for an owner that is gone.
  return { 'in_flight', 0 }
end
-- Takeover of an expired lease: next token, new attempt and lease, steps kept, and the
-- record kept one retention past the new lease's end.
if r.t >= MAX_INTEGER then token_at_limit() end
r.t, r.l = r.t + 1, now + lease
r.e = math.max(r.e, math.min(r.l + retention, MAX_INTEGER))
redis.call('HSET', key, 't', num(r.t), 'a', attempt, 'l', num(r.l), 'e', num(r.e))
keep(key, r, now)
return claimed(r.t, r.l, 1, r.c, steps_of(key))
