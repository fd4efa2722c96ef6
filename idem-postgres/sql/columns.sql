-- The columns every read returns. {steps_when} says when the steps are decoded: always
-- for get; for claim only while in progress and any are set (an owner needs them, a replay
-- does not).
-- {response} is the response column, or nothing where an operator's listing leaves it out.
state,
token,
attempt,
fingerprint,
floor(extract(epoch FROM lease_until) * 1000)::bigint AS lease_until_ms,
floor(extract(epoch FROM created_at) * 1000)::bigint AS created_at_ms,
floor(extract(epoch FROM expires_at) * 1000)::bigint AS expires_at_ms,
{response} AS response,
resumed,
CASE WHEN {steps_when}
     THEN ARRAY(SELECT s.key FROM jsonb_each_text(steps) AS s ORDER BY s.key)
     ELSE '{}'::text[] END AS step_names,
CASE WHEN {steps_when}
     THEN ARRAY(SELECT decode(s.value, 'base64') FROM jsonb_each_text(steps) AS s ORDER BY s.key)
     ELSE '{}'::bytea[] END AS step_values,
floor(extract(epoch FROM now()) * 1000)::bigint AS now_ms
