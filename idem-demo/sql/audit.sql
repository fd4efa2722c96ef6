-- The audit: debits, orders, orders debited more than once, money taken.
SELECT coalesce(sum(debits), 0), count(*), coalesce(sum(debits > 1), 0),
       coalesce(sum(total), 0)
FROM (SELECT count(*) AS debits, sum(cents) AS total FROM ledger GROUP BY order_id)
