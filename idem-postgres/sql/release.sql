-- End the lease now, fenced. $1 scope, $2 key, $3 token, $4 attempt
-- Without a step nothing took effect, so the record's lifetime ends too: absent at once,
-- and the next claim is fresh under any fingerprint. With steps it is kept for a
-- takeover, for one retention after now at least (as a result stored late is).
UPDATE {table}
SET lease_until = now(),
    expires_at = CASE WHEN steps = '{}'::jsonb THEN now()
                      ELSE GREATEST(expires_at, now() + (expires_at - created_at)) END
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND state = 'in_progress' AND {present}
