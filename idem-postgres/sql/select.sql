-- The record as it is now, expired or not (the client applies the state machine).
-- $1 scope, $2 key
SELECT {columns} FROM {table} WHERE scope = $1 AND key = $2
