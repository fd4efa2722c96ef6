#!/usr/bin/env bash
# idem's fresh execution (claim.sql's first form, then finish.sql, rendered for pgbench)
# on four copies of its table, one client; prints each statement's mean engine time from
# pg_stat_statements. Needs the extension, as scripts/services.sh starts PostgreSQL.
#   bash benchmarks/pgbench-claim/run.sh postgres://postgres@127.0.0.1:55432/postgres
set -euo pipefail
url=${1:?the server URL}
here=$(dirname "$0")
pgbench=$(ls /usr/lib/postgresql/*/bin/pgbench | tail -1)
psql -q "$url" -f "$here/tables.sql"
for table in ta tb tc td; do
    psql -qAt "$url" -c "SELECT pg_stat_statements_reset()" > /dev/null
    "$pgbench" -n -M prepared -c 1 -T "${SECONDS_EACH:-8}" -f "$here/fresh_$table.pgb" "$url" \
        | grep "latency average"
    echo "[$table] calls | mean µs | statement"
    psql -qAt "$url" -c "SELECT calls, round(mean_exec_time::numeric * 1000, 1), \
        left(regexp_replace(query, '\s+', ' ', 'g'), 40) FROM pg_stat_statements \
        WHERE calls > 500 ORDER BY query"
done
