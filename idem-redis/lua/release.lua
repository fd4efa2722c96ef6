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
else
  -- Kept for a takeover, for one retention after now at least (as a late result is).
  r.e = math.max(r.e, now + math.max(r.e - r.c, 0))
end
redis.call('HSET', key, 'l', num(now), 'e', num(r.e))
keep(key, r, now)
return 1
