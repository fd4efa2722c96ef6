INSERT INTO idem_records
    (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, response)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (scope, key) DO UPDATE SET
    fingerprint = excluded.fingerprint,
    state       = excluded.state,
    token       = excluded.token,
    attempt     = excluded.attempt,
    lease_until = excluded.lease_until,
    created_at  = excluded.created_at,
    expires_at  = excluded.expires_at,
    response    = excluded.response
