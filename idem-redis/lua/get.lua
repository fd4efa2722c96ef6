-- get. KEYS[1] record. {} when there is none or it is absent, else {fingerprint, state,
-- token, attempt, lease_until, created_at, expires_at, has_response, response, step, value,
-- ...}.
local now = now_ms()
local r = load(KEYS[1], now)
if r == nil then
  return {}
end
local has_response = 0
if r.r then
  has_response = 1
end
local reply = { r.f, r.s, r.t, r.a, r.l, r.c, r.e, has_response, r.r or '' }
for _, item in ipairs(steps_of(KEYS[1])) do
  table.insert(reply, item)
end
return reply
