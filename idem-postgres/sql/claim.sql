-- One statement per claim. A present record that this claim will not write is read and
-- answered as it is: no write and no row lock. That is every replay (a finished record),
-- every in-flight answer (a live lease), every mismatch, and a retried claim asking for
-- the lease its first try took. Otherwise the upsert writes when the key is new, absent
-- (expired and held by no live lease), or in progress with an expired lease under the
-- same fingerprint (a takeover). No row when the upsert does not write (the record
-- changed after the read): this statement sees only the record it read, so the client
-- reads it anew and answers with the state machine. A takeover keeps the record one
-- retention past its new lease; the attempt whose lease ended takes nothing over (a late
-- copy of a claim it already won), so it is read and answered in flight. A row that idem
-- did not write (an unknown state, say: `valid` in queries.rs) is never written here,
-- present or not: it is read, and the client refuses it as corrupt. Nor is a present row
-- at the last token: no next token could fence its owner, so it is read, and the client
-- refuses a takeover of it as corrupt (a replay of it is answered), as Redis's script
-- does. An absent one is replaced starting again at token 1, as on Redis: no lease holds
-- it, and every write is fenced by token and attempt, so an old owner's (at the last
-- token) matches none of the new lifetime's until it has counted up again.
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
    ON CONFLICT (scope, key) DO UPDATE SET
        -- An absent record is replaced by a fresh one; a takeover keeps what it had. A row
        -- this sets passed the WHERE below: absent, or in progress with its lease over, and
        -- for both, present means unexpired (no live lease holds it). So the shorter test,
        -- r.expires_at > now(), stands for the presence test here, and PostgreSQL sets up
        -- less for each run of the statement.
        fingerprint = CASE WHEN r.expires_at > now() THEN r.fingerprint ELSE excluded.fingerprint END,
        state       = 'in_progress',
        token       = CASE WHEN r.token < {max_token} THEN r.token + 1 ELSE 1 END,
        attempt     = excluded.attempt,
        lease_until = excluded.lease_until,
        created_at  = CASE WHEN r.expires_at > now() THEN r.created_at ELSE excluded.created_at END,
        expires_at  = CASE WHEN r.expires_at > now()
                           THEN GREATEST(r.expires_at,
                                         excluded.lease_until + $6::bigint * interval '1 millisecond')
                           ELSE excluded.expires_at
                      END,
        response    = CASE WHEN r.expires_at > now() THEN r.response END,
        steps       = CASE WHEN r.expires_at > now() THEN r.steps ELSE '{}'::jsonb END,
        resumed     = r.expires_at > now()
    WHERE {r.valid}
      AND (r.token < {max_token} OR NOT {r.present})
      AND (NOT {r.present}
           OR (r.fingerprint = excluded.fingerprint
               AND r.state = 'in_progress'
               AND r.lease_until <= now()
               AND r.attempt <> excluded.attempt))
    RETURNING {columns}
)
SELECT false AS claimed, * FROM settled
UNION ALL
SELECT true AS claimed, * FROM claimed
