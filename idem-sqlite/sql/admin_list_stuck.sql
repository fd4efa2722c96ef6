-- One page of stuck work for an operator, oldest first: in-progress records whose lease
-- ended at least ?3 ms before ?1, still within their retention. The same parameters as admin_list.sql; the lease test is
-- written on the column alone, so the partial index of in-progress leases finds the few
-- stuck records instead of the listing reading every record.
-- ?1 now (ms), ?2 state, ?3 stuck for (ms), ?4 scope prefix,
-- ?5 ?6 ?7 the cursor (created ms, scope, key), ?8 limit
SELECT scope, key
FROM idem_records
WHERE state = 'in_progress'
  AND lease_until <= ?1 - ?3
  AND expires_at > ?1
  AND (?2 IS NULL OR state = ?2)
  AND (?4 IS NULL OR substr(scope, 1, length(?4)) = ?4)
  AND (?5 IS NULL OR (created_at, scope, key) > (?5, ?6, ?7))
ORDER BY created_at, scope, key
LIMIT ?8
