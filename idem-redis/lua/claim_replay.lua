-- claim, the replay path. It runs before the shared helpers are defined, so a replay does
-- not pay for defining them (Redis runs the whole script body on every call).
-- KEYS[1] record; ARGV fingerprint, ... (see claim.lua).
--
-- It reads four fields and not the clock: a finished record's key expires exactly at its
-- expiry (keep), and Redis never shows a script a key past its expiry, so a finished record
-- that is here is unexpired. The fields it answers from are validated as in load; anything
-- else falls through to claim.lua, which reads the whole record.
local peek = redis.call('HMGET', KEYS[1], 'f', 's', 'e', 'r')
if peek[2] == 'completed' or peek[2] == 'failed' then
  if not peek[1] or #peek[1] ~= 32 then
    return error(redis.error_reply('IDEM_CORRUPT fingerprint'))
  end
  local e = tonumber(peek[3])
  if e == nil or e % 1 ~= 0 or e < 0 or e > 9007199254740991 then
    return error(redis.error_reply('IDEM_CORRUPT expires_at'))
  end
  if peek[1] ~= ARGV[1] then
    return { 'mismatch' }
  end
  if peek[2] == 'completed' then
    -- The response alone, not in a table (why: claim.lua's header).
    return peek[4] or ''
  end
  return { 'replay_failure', peek[4] or '' }
end
