-- What the store holds at ?1 (ms): totals by state, live and ended leases, absent records
-- (expired, no live lease), and the oldest in-progress record's creation.
SELECT count(*),
       coalesce(sum(state = 'in_progress'), 0),
       coalesce(sum(state = 'completed'), 0),
       coalesce(sum(state = 'failed'), 0),
       coalesce(sum(state = 'in_progress' AND lease_until > ?1), 0),
       coalesce(sum(state = 'in_progress' AND lease_until <= ?1), 0),
       coalesce(sum(expires_at <= ?1 AND NOT (state = 'in_progress' AND lease_until > ?1)), 0),
       min(CASE WHEN state = 'in_progress' THEN created_at END)
FROM idem_records
