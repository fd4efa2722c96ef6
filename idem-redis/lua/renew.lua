-- renew. KEYS[1] record; ARGV token, attempt, extend (ms). The new lease end, or -1 fenced.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' then
  return -1
end
r.l = now + tonumber(ARGV[3])
redis.call('HSET', key, 'l', num(r.l))
keep(key, r, now)
return r.l
