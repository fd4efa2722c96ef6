-- The claim, rendered twice (queries.rs): first with `DO NOTHING` on a conflict, then,
-- when that neither read nor wrote a row, or read one the state machine says to write,
-- with claim_update.sql's `DO UPDATE`. PostgreSQL sets up a statement's whole plan on
-- every run, its conflict clause included, so the first form costs less for the claims
-- that do not need the second: every fresh key and every answer without a write.
--
-- A present record that this claim will not write is read and answered as it is: no
-- write and no row lock. That is every replay (a finished record), every in-flight answer
-- (a live lease), every mismatch, and a retried claim asking for the lease its first try
-- took. Otherwise the insert writes when the key is new; the first form stops at any row
-- already there, and the second writes over one that is absent (expired and held by no
-- live lease) or in progress with an expired lease under the same fingerprint (a
-- takeover). No row from the second form when it does not write (the record changed
-- after the read): this statement sees only the record it read, so the client reads it
-- anew and answers with the state machine. A row that idem did not write (an unknown
-- state, say: `valid` in queries.rs) is never written here, present or not: it is read,
-- and the client refuses it as corrupt. Nor is a present row at the last token: no next
-- token could fence its owner, so it is read, and the client refuses a takeover of it as
-- corrupt (a replay of it is answered), as the state machine does.
-- $1 scope, $2 key, $3 fingerprint, $4 attempt, $5 lease (ms), $6 retention (ms)
WITH settled AS (
    SELECT {columns}
    FROM {table}
    WHERE scope = $1 AND key = $2
      AND (NOT {valid}
           OR (token >= {max_token} AND {present})
           OR ({present}
               AND NOT (state = 'in_progress' AND lease_until <= now()
                        AND fingerprint = $3::bytea AND attempt <> $4::bytea)))
),
claimed AS (
    INSERT INTO {table} AS r
        (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at,
         response, steps, resumed)
    SELECT $1::text, $2::text, $3::bytea, 'in_progress', 1, $4::bytea,
           now() + $5::bigint * interval '1 millisecond', now(),
           now() + $6::bigint * interval '1 millisecond', NULL, '{}'::jsonb, false
    WHERE NOT EXISTS (SELECT 1 FROM settled)
    ON CONFLICT (scope, key) {on_conflict}
    RETURNING {columns}
)
SELECT false AS claimed, * FROM settled
UNION ALL
SELECT true AS claimed, * FROM claimed
