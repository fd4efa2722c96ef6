-- End the lease now, fenced. $1 scope, $2 key, $3 token, $4 attempt
UPDATE {table}
SET lease_until = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND state = 'in_progress' AND {present}
