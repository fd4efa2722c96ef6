-- An operator's release. KEYS[1] record; ARGV attempt (one no worker holds).
-- {'released', token}, {'finished', state} or {'not_found'}.
local key = KEYS[1]
local now = now_ms()
local r = load(key, now)
if r == nil then
  return { 'not_found' }
end
if r.s ~= 'in_progress' then
  return { 'finished', r.s }
end
-- At the last token no next token could fence the owner: refused, as a claim's takeover.
if r.t >= MAX_INTEGER then token_at_limit() end
-- A fenced takeover on the operator's behalf: the next token, an attempt no worker holds,
-- the lease ended now; steps kept, so the next claim takes over at once and resumes.
r.t, r.l = r.t + 1, now
redis.call('HSET', key, 't', num(r.t), 'a', ARGV[1], 'l', num(now))
keep(key, r, now)
return { 'released', r.t }
