#!/usr/bin/env bash
# idem's fresh execution (claim.sql's first form, then finish.sql, rendered for pgbench)
# on four copies of its table, and the benchmark's raw loop on its own (traw); prints
# each statement's mean engine time from pg_stat_statements (created by tables.sql; the
# server must preload it, as the one scripts/services.sh starts does). The scripts carry
# literals where idem binds parameters, and pgbench's own client stands in for sqlx.
# CLIENTS (default 1) and SECONDS_EACH (default 8) set pgbench's -c and -T.
#   bash benchmarks/pgbench-claim/run.sh postgres://postgres@127.0.0.1:55432/postgres
set -euo pipefail
url=${1:?the server URL}
here=$(dirname "$0")
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | sort -V | tail -1)
psql -q -v ON_ERROR_STOP=1 "$url" -f "$here/tables.sql"
for table in ta tb tc td traw; do
    psql -qAt -v ON_ERROR_STOP=1 "$url" -c "SELECT pg_stat_statements_reset()" > /dev/null
    "$pgbench" -n -M prepared -c "${CLIENTS:-1}" -j "${CLIENTS:-1}" -T "${SECONDS_EACH:-8}" -f "$here/fresh_$table.pgb" "$url" \
        | grep "latency average"
    echo "[$table] calls | mean µs | statement"
    psql -qAt "$url" -c "SELECT calls, round(mean_exec_time::numeric * 1000, 1), \
        left(regexp_replace(query, '\s+', ' ', 'g'), 40) FROM pg_stat_statements \
        WHERE calls > 500 ORDER BY query"
done
