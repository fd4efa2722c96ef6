-- complete or fail, fenced. Applied when this call wrote, or when an earlier call by the
-- same owner already left the record in the same terminal state (a retry after a lost
-- answer). $1 scope, $2 key, $3 token, $4 attempt, $5 response, $6 terminal state
WITH finished AS (
    UPDATE {table}
    SET state = $6, response = $5
    WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
      AND state = 'in_progress' AND {present}
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM finished)
    OR EXISTS (
        SELECT 1 FROM {table}
        WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
          AND state = $6 AND expires_at > now()
    ) AS applied
