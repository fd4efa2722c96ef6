-- release. KEYS[1] record; ARGV token, attempt. 1 applied, 0 fenced.
-- Without a step nothing took effect, so the record's lifetime ends too: keep() deletes
-- it, and the next claim is fresh under any fingerprint. With steps it is kept for a
-- takeover.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' then
  return 0
end
r.l = now
if #steps_of(key) == 0 then
  r.e = now
elseif now >= r.e then
  -- Kept for a takeover: past its expiry already (a live lease held it), it is kept one
  -- retention more so that its steps do not run again.
  r.e = math.min(now + math.max(r.e - r.c, 0), MAX_INTEGER)
end
redis.call('HSET', key, 'l', num(now), 'e', num(r.e))
keep(key, r, now)
return 1
