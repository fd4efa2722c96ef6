-- After finish.sql wrote nothing: whether the same owner already left the record in the
-- same terminal state, unexpired (a retry after a lost answer). Under READ COMMITTED this
-- statement has a snapshot of its own: a retry that waited in finish.sql for its first
-- try's row lock reads the committed version. (In a caller's REPEATABLE READ or
-- SERIALIZABLE transaction, complete_in's finish.sql fails with a serialization error
-- there instead: StoreError::Busy.) The lock keeps the row as read until the caller's
-- transaction ends, as finish.sql's own would have.
-- $1 scope, $2 key, $3 token, $4 attempt, $5 terminal state
SELECT state = $5 AND expires_at > now() AS applied
FROM {table}
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
FOR NO KEY UPDATE
