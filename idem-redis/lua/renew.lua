-- renew. KEYS[1] record; ARGV token, attempt, extend (ms), the lease's retention (ms). The
-- new lease end, or -1 fenced. Only a live lease is renewed: one that has ended (released,
-- or run out) is over for its owner. The record is kept one retention past the new end.
local key = KEYS[1]
local now = now_ms()
local r = owned(key, tonumber(ARGV[1]), ARGV[2], now)
if r == nil or r.s ~= 'in_progress' or now >= r.l then
  return -1
end
r.l = now + tonumber(ARGV[3])
r.e = math.max(r.e, math.min(r.l + tonumber(ARGV[4]), MAX_INTEGER))
redis.call('HSET', key, 'l', num(r.l), 'e', num(r.e))
keep(key, r, now)
return r.l
