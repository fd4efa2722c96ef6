-- The conflict clause of claim.sql's second form: over a row that is absent, or in
-- progress with its lease over under the same fingerprint and another attempt. A takeover
-- keeps the record one retention past its new lease; the attempt whose lease ended takes
-- nothing over (a late copy of a claim it already won), so it is read and answered in
-- flight. An absent row at the last token is replaced starting again at token 1, as the
-- state machine does: no lease holds it, and every write is fenced by token and attempt,
-- so an old owner's (at the last token) matches none of the new lifetime's until it has
-- counted up again.
DO UPDATE SET
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
