INSERT INTO idem_steps (scope, key, step, value) VALUES (?1, ?2, ?3, ?4)
