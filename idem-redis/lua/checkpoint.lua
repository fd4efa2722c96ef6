-- checkpoint. KEYS[1] record; ARGV token, attempt, step, value. 1 applied, 0 fenced.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' then
  return 0
end
redis.call('HSET', key, 'step:' .. ARGV[3], ARGV[4])
return 1
