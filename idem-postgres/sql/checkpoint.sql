-- Set one step, fenced. $1 scope, $2 key, $3 token, $4 attempt, $5 step, $6 value
UPDATE {table}
SET steps = steps || jsonb_build_object($5::text, encode($6::bytea, 'base64'))
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND state = 'in_progress' AND {present}
