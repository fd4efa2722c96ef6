-- The scopes holding the most records. $1 how many
SELECT scope, count(*) AS records
FROM {table}
GROUP BY scope
ORDER BY records DESC, scope
LIMIT $1
