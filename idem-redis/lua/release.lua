-- release. KEYS[1] record; ARGV token, attempt. 1 applied, 0 fenced.
-- Without a step nothing took effect, so the record's lifetime ends too: keep() deletes
-- it, and the next claim is fresh under any fingerprint. With steps it is kept for a
-- takeover, with its expiry as it is: its checkpoints kept it one retention past the
-- lease's end. A lease that ran out already keeps its end, so a release repeated moves
-- nothing.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' then
  return 0
end
r.l = math.min(r.l, now)
if #steps_of(key) == 0 then
  r.e = now
end
redis.call('HSET', key, 'l', num(r.l), 'e', num(r.e))
keep(key, r, now)
return 1
