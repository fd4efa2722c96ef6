-- Admin::raw: one record's columns as stored, each as an SQL literal (quote() shows blobs
-- as X'..' and text in quotes, whatever the column's declared type), the response as its
-- length. ?1 scope, ?2 key
SELECT quote(fingerprint), quote(state), quote(token), quote(attempt), quote(lease_until),
       quote(created_at), quote(expires_at), length(response)
FROM idem_records
WHERE scope = ?1 AND key = ?2
