-- Expired records, except an in-progress one whose lease is still live. Oldest expiry
-- first, which keeps the plan on the expiry index whatever statistics ANALYZE gathered.
SELECT scope, key
FROM idem_records
WHERE expires_at <= ?1
  AND NOT (state = 'in_progress' AND lease_until > ?1)
ORDER BY expires_at
LIMIT ?2
