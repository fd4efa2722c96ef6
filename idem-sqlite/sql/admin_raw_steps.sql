-- Admin::raw: one record's checkpoints, the name as an SQL literal, the value as its
-- length. ?1 scope, ?2 key
SELECT quote(step), length(value) FROM idem_steps WHERE scope = ?1 AND key = ?2 ORDER BY step
