-- End the lease now, fenced. $1 scope, $2 key, $3 token, $4 attempt
-- Without a step nothing took effect, so the record's lifetime ends too: absent at once,
-- and the next claim is fresh under any fingerprint. With steps it is kept for a
-- takeover: its expiry stays, unless it has passed already (a live lease held the
-- record), when it is kept one retention more so that its steps do not run again.
UPDATE {table}
SET lease_until = now(),
    expires_at = CASE WHEN steps = '{}'::jsonb THEN now()
                      WHEN expires_at <= now() THEN now() + (expires_at - created_at)
                      ELSE expires_at END
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND state = 'in_progress' AND {present}
