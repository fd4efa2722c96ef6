-- One page of records for an operator, oldest first. A NULL parameter means "no filter".
-- $1 state, $2 stuck for (ms), $3 scope prefix, $4 $5 $6 the cursor (created, in
-- microseconds since the epoch, scope, key), $7 limit, $8 whether to return responses
SELECT scope, key, {columns},
       octet_length(r.response) AS response_len
FROM {table} AS r
WHERE ($1::text IS NULL OR state = $1)
  AND ($2::bigint IS NULL
       OR (state = 'in_progress' AND lease_until <= now() - $2 * interval '1 millisecond'
           AND expires_at > now()))
  AND ($3::text IS NULL OR starts_with(scope, $3))
  AND ($4::bigint IS NULL
       OR (created_at, scope, key) > ('epoch'::timestamptz + $4 * interval '1 microsecond', $5, $6))
ORDER BY created_at, scope, key
LIMIT $7
