-- What the table holds at now(), in one statement so that every figure comes from one
-- snapshot, and in one pass over the table (grouped by scope, then summed): totals by
-- state, live leases, ended leases of present records (abandoned work a retry would take
-- over), absent records (expired, no live lease, and idem's: what the purge deletes), the
-- oldest present in-progress record's creation, and the $1 largest scopes. One row per
-- top scope (the totals repeated on each), or one row with a NULL scope when there is
-- none to show.
WITH per_scope AS MATERIALIZED (
    SELECT scope,
           count(*) AS total,
           count(*) FILTER (WHERE state = 'in_progress') AS in_progress,
           count(*) FILTER (WHERE state = 'completed') AS completed,
           count(*) FILTER (WHERE state = 'failed') AS failed,
           count(*) FILTER (WHERE state = 'in_progress' AND lease_until > now()) AS live,
           count(*) FILTER (WHERE state = 'in_progress' AND lease_until <= now()
                                  AND expires_at > now()) AS lease_ended,
           count(*) FILTER (WHERE NOT {present} AND {valid}) AS absent,
           min(created_at) FILTER (WHERE state = 'in_progress' AND {present}) AS oldest
    FROM {table}
    GROUP BY scope
),
totals AS (
    SELECT coalesce(sum(total), 0)::bigint AS total,
           coalesce(sum(in_progress), 0)::bigint AS in_progress,
           coalesce(sum(completed), 0)::bigint AS completed,
           coalesce(sum(failed), 0)::bigint AS failed,
           coalesce(sum(live), 0)::bigint AS live,
           coalesce(sum(lease_ended), 0)::bigint AS lease_ended,
           coalesce(sum(absent), 0)::bigint AS absent,
           min(oldest) AS oldest,
           now() AS read_at
    FROM per_scope
),
top AS (
    SELECT scope, total AS records
    FROM per_scope
    ORDER BY total DESC, scope
    LIMIT $1
)
SELECT totals.*, top.scope, top.records
FROM totals LEFT JOIN top ON true
ORDER BY top.records DESC NULLS LAST, top.scope
