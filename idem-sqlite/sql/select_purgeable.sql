-- Expired records, except an in-progress one whose lease is still live.
SELECT scope, key
FROM idem_records
WHERE expires_at <= ?1
  AND NOT (state = 'in_progress' AND lease_until > ?1)
LIMIT ?2
