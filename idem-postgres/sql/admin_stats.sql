-- What the table holds at now(): totals by state, live and ended leases, absent records
-- (expired, no live lease), and the oldest in-progress record's creation.
SELECT count(*) AS total,
       count(*) FILTER (WHERE state = 'in_progress') AS in_progress,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'in_progress' AND lease_until > now()) AS live,
       count(*) FILTER (WHERE state = 'in_progress' AND lease_until <= now()) AS lease_ended,
       count(*) FILTER (WHERE NOT {present}) AS absent,
       floor(extract(epoch FROM min(created_at) FILTER (WHERE state = 'in_progress')) * 1000)::bigint
           AS oldest_ms,
       floor(extract(epoch FROM now()) * 1000)::bigint AS now_ms
FROM {table}
