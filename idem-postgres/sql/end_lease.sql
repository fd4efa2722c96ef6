-- End the lease now, and nothing else: for a claim that took a record over and found its
-- row undecodable (a record written by something other than idem). Unlike release.sql it
-- never makes the record absent, so the next claim meets the same record. Fenced by the
-- token and attempt the claim just took, which nobody else holds (so no state test).
-- $1 scope, $2 key, $3 token, $4 attempt
UPDATE {table}
SET lease_until = LEAST(lease_until, now())
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
