-- Admin::raw: one record's columns as stored, as JSON text (bytea as "\x.." hex), without
-- scope and key, and the response as its length. $1 scope, $2 key
SELECT (to_jsonb(r) - 'response' - 'scope' - 'key')::text AS fields,
       octet_length(r.response) AS response_len
FROM {table} r
WHERE scope = $1 AND key = $2
