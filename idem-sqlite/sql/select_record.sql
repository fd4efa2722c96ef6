SELECT fingerprint, state, token, attempt, lease_until, created_at, expires_at, response
FROM idem_records
WHERE scope = ?1 AND key = ?2
