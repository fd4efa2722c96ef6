-- checkpoint. KEYS[1] record; ARGV token, attempt, step, value, the lease's retention (ms).
-- 1 applied, 0 fenced. The record is kept one retention past its lease's end.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' then
  return 0
end
redis.call('HSET', key, 'step:' .. ARGV[3], ARGV[4])
local kept = math.min(r.l + tonumber(ARGV[5]), MAX_INTEGER)
if kept > r.e then
  r.e = kept
  redis.call('HSET', key, 'e', num(r.e))
  keep(key, r, now)
end
return 1
