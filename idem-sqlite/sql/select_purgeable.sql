-- Expired records, except an in-progress one whose lease is still live. Oldest expiry
-- first: the expiry index then gives the rows in order, which keeps the plan on it after
-- an ANALYZE too.
SELECT scope, key
FROM idem_records
WHERE expires_at <= ?1
  AND NOT (state = 'in_progress' AND lease_until > ?1)
ORDER BY expires_at
LIMIT ?2
