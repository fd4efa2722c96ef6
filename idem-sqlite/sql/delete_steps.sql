DELETE FROM idem_steps WHERE scope = ?1 AND key = ?2
