-- The columns every read returns. {steps_when} says when the steps are returned: always
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
-- The steps as jsonb's text, decoded by the client: a sorted subquery here would be set up
-- on every run of the statement, steps or not.
CASE WHEN {steps_when} THEN steps::text END AS steps,
floor(extract(epoch FROM now()) * 1000)::bigint AS now_ms
