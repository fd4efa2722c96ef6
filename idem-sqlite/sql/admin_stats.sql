-- What the store holds at ?1 (ms): totals by state, live leases, ended leases of present
-- records (abandoned work a retry would take over), absent records (expired, no live
-- lease), and the oldest present in-progress record's creation.
SELECT count(*),
       coalesce(sum(state = 'in_progress'), 0),
       coalesce(sum(state = 'completed'), 0),
       coalesce(sum(state = 'failed'), 0),
       coalesce(sum(state = 'in_progress' AND lease_until > ?1), 0),
       coalesce(sum(state = 'in_progress' AND lease_until <= ?1 AND expires_at > ?1), 0),
       coalesce(sum(expires_at <= ?1 AND NOT (state = 'in_progress' AND lease_until > ?1)), 0),
       min(CASE WHEN state = 'in_progress' AND (expires_at > ?1 OR lease_until > ?1)
                THEN created_at END)
FROM idem_records
