-- An operator's release: a fenced takeover on the operator's behalf (token + 1, an attempt
-- no worker holds, the lease ended now). $1 scope, $2 key, $3 the operator's attempt.
--
-- One UPDATE of the key's row whatever its state, so that a worker's complete racing this
-- is settled by the row lock: once it holds the lock, PostgreSQL evaluates the CASEs on
-- the newest committed row, never on a stale snapshot (a separate SELECT could report a
-- record "in progress" that a worker had just completed). A row that is not released is
-- written back unchanged, and so is a row that idem did not write (`valid` in queries.rs):
-- the client refuses it as corrupt. `released` tells the two apart (the attempt is fresh
-- random bytes); for a row not released, `present` is as it was before.
-- Released when in progress, present, written by idem (`valid` in queries.rs) and below
-- the last token, whose next no lease could carry.
UPDATE {table}
SET token = CASE WHEN state = 'in_progress' AND {present} AND {valid} AND token < {max_token}
                 THEN token + 1 ELSE token END,
    attempt = CASE WHEN state = 'in_progress' AND {present} AND {valid} AND token < {max_token}
                   THEN $3 ELSE attempt END,
    lease_until = CASE WHEN state = 'in_progress' AND {present} AND {valid}
                            AND token < {max_token}
                       THEN now() ELSE lease_until END
WHERE scope = $1 AND key = $2
RETURNING token, state, attempt = $3 AS released, {present} AS present, {valid} AS valid
