-- The columns every read returns. {steps_when} says when the steps are returned: always
-- for get; for claim only while in progress and any are set (an owner needs them, a replay
-- does not).
-- {response} is the response column, or nothing where an operator's listing leaves it out.
-- Times go out as timestamptz, which the client turns into milliseconds (rows.rs): cheaper
-- than computing each here. read_at is the statement's now().
state,
token,
attempt,
fingerprint,
lease_until,
created_at,
expires_at,
{response} AS response,
resumed,
-- The steps as jsonb's text, decoded by the client: a sorted subquery here would be set up
-- on every run of the statement, steps or not.
CASE WHEN {steps_when} THEN steps::text END AS steps,
now() AS read_at
