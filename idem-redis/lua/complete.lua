-- complete. KEYS[1] record; ARGV token, attempt, response, the lease's retention (ms).
-- 1 applied, 0 fenced.
return finish(KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV[3], 'completed', tonumber(ARGV[4]))
