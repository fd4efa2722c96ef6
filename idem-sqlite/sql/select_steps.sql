SELECT step, value FROM idem_steps WHERE scope = ?1 AND key = ?2
