#!/usr/bin/env bash
# The guide's `idem proxy` quick start (docs/book/src/proxy.md), run and checked: the Flask payments service on
# port 8000, `idem proxy` in front of it on 8080 with idem-proxy/examples/quickstart.toml
# (SQLite), a payment and its retry with curl, and the service's own count of executions.
#
#   scripts/proxy-quickstart.sh [IDEM_BINARY]
#
# IDEM_BINARY defaults to target/release/idem (cargo build --release -p idem-cli). Python
# with Flask comes from IDEM_TEST_FLASK_PYTHON (scripts/services.sh start flask), or is
# installed as the guide says. Everything runs on 127.0.0.1 and is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

idem=${1:-target/release/idem}
[[ -x $idem ]] || { echo "quickstart: no idem binary at $idem (cargo build --release -p idem-cli)" >&2; exit 1; }
python=${IDEM_TEST_FLASK_PYTHON:-}
if [[ -z $python ]]; then
  python=/tmp/idem-flask/bin/python
  if ! "$python" -c 'import flask' 2>/dev/null; then
    python3 -m venv /tmp/idem-flask && /tmp/idem-flask/bin/pip install --quiet 'flask==3.1.*'
  fi
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_for() { # url
  for _ in $(seq 1 200); do
    if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "quickstart: $1 did not answer within 20 s" >&2
  cat "$work"/*.log >&2 || true
  exit 1
}

# The guide's ports must be free: an old proxy or service answering there would be
# checked instead of these.
for port in 8000 8080 9464; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "quickstart: something already listens on 127.0.0.1:$port; stop it first" >&2
    exit 1
  fi
done

# The guide's commands: the service, then the proxy (its SQLite file is the example's).
"$python" idem-proxy/examples/upstream/app.py --port 8000 --db "$work/payments.db" >"$work/flask.log" 2>&1 &
pids+=($!)
wait_for http://127.0.0.1:8000/health
rm -f /tmp/idem-proxy-quickstart.db /tmp/idem-proxy-quickstart.db-wal /tmp/idem-proxy-quickstart.db-shm
"$idem" proxy --config idem-proxy/examples/quickstart.toml >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_for http://127.0.0.1:9464/readyz

pay() { # body
  curl -sS -i localhost:8080/payments -H 'Idempotency-Key: order-1187' -H 'X-Account-Id: acct_42' \
    -H 'Content-Type: application/json' -d "$1" | tr -d '\r'
}
first=$(pay '{"amount": 500, "currency": "EUR"}')
retry=$(pay '{"currency": "EUR", "amount": 500}')
executions=$(curl -sS localhost:8000/payments/executions)
metrics=$(curl -sS localhost:9464/metrics)
printf '%s\n\n%s\n\n%s\n' "$first" "$retry" "$executions"

fail() { echo "quickstart: $*" >&2; exit 1; }
status() { head -1 | cut -d' ' -f2; }
[[ $(status <<<"$first") == 201 ]] || fail "the payment was not created"
[[ $(status <<<"$retry") == 201 ]] || fail "the retry did not get the first answer"
grep -qi '^idempotent-replayed: true' <<<"$retry" || fail "the retry was not a replay"
[[ $(tail -1 <<<"$first") == "$(tail -1 <<<"$retry")" ]] || fail "the retry's body differs from the first"
[[ $executions == *'"order-1187":1'* ]] || fail "the service ran the payment other than once: $executions"
grep -q '^idem_proxy_requests_total{' <<<"$metrics" || fail "/metrics has no idem_proxy_requests_total"
echo "quickstart: the payment ran once; its retry got the first answer"
