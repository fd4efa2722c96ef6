DELETE FROM idem_records WHERE scope = ?1 AND key = ?2
