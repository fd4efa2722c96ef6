-- One page of keys for an operator, oldest first. A NULL parameter means "no filter".
-- Stuck work (?3) has a statement of its own, admin_list_stuck.sql, which the lease
-- index answers; this one is never run with it.
-- ?1 now (ms), ?2 state, ?3 stuck for (ms, unused here), ?4 scope prefix,
-- ?5 ?6 ?7 the cursor (created ms, scope, key), ?8 limit
SELECT scope, key
FROM idem_records
WHERE (?2 IS NULL OR state = ?2)
  AND (?4 IS NULL OR substr(scope, 1, length(?4)) = ?4)
  AND (?5 IS NULL OR (created_at, scope, key) > (?5, ?6, ?7))
ORDER BY created_at, scope, key
LIMIT ?8
