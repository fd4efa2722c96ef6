-- After finish.sql wrote nothing: whether the same owner already left the record in the
-- same terminal state, unexpired (a retry after a lost answer). A locking read: a retry
-- that ran while its first try still held the row lock has waited for it in finish.sql,
-- and this statement, with its own snapshot, reads the committed version. It takes the
-- lock finish.sql would have taken.
-- $1 scope, $2 key, $3 token, $4 attempt, $5 terminal state
SELECT state = $5 AND expires_at > now() AS applied
FROM {table}
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
FOR NO KEY UPDATE
