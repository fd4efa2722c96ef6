-- An operator's deletion of one record. $1 scope, $2 key
DELETE FROM {table} WHERE scope = $1 AND key = $2
