#!/usr/bin/env bash
# Redis's own time per call of each system's Lua, alone: idem's claim of a new key, its
# completion, its replay, and the same three for `idempotent`'s scripts, measured with
# `redis-benchmark` (8 clients, 8 commands in flight each) and read from `INFO
# commandstats` (usec_per_call). Alternates idem and the peer RUNS times (default 5) and
# prints each run; BENCHMARKS.md reports the medians. CLAIMS (default 200 000) new keys are
# claimed per run, and RECORDS (default 1 000 000) records are written for the completions
# and for the replays. A tenth of the records in progress are completed, on keys drawn at
# random, so about one completion in twenty finds its record already completed (a cheaper
# path); the run fails if fewer than nine in ten wrote. Every record has an expiry, as
# both systems' claims and completions give it (a key with one costs a lookup more on each
# access). CI runs it small so that it cannot rot.
#
#   eval "$(scripts/services.sh start redis)"
#   cargo build --release --ignore-rust-version --manifest-path idem-bench-peers/Cargo.toml
#   bash idem-bench-peers/scripts/lua-costs.sh            # FLUSHALLs the server it is given
#
# The server must be one of its own on 127.0.0.1: IDEM_TEST_REDIS_URL's port (its host is
# not read), or 56379.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
address=${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:56379}
address=${address#*://}
address=${address%%/*}
PORT=${address##*:}
case "$PORT" in
  ''|*[!0-9]*) echo "lua-costs: no port in IDEM_TEST_REDIS_URL ($IDEM_TEST_REDIS_URL)" >&2; exit 1 ;;
esac
RUNS=${RUNS:-5}
# -e: an error reply (a seeding that failed, a full server) fails the run.
R="redis-cli -e -h 127.0.0.1 -p $PORT"
BENCH="redis-benchmark -h 127.0.0.1 -p $PORT -q -c 8 -P 8"
# The peer's scripts, as Cargo unpacked its crate for idem-bench-peers's build.
PEER=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/idempotent-2.0.0/valkey 2>/dev/null | head -1 || true)
if [ -z "$PEER" ]; then
  echo "lua-costs: idempotent 2.0's scripts are not unpacked; build idem-bench-peers first" >&2
  exit 1
fi
FP=0123456789abcdef0123456789abcdef
ATTEMPT=aaaaaaaaaaaaaaaa
RECEIPT='{"charge":"ch_3PqX9","status":"ok"}'
RECORDS=${RECORDS:-1000000}
CLAIMS=${CLAIMS:-200000}

# idem's library as idem-redis builds it (src/scripts.rs), under a name of its own.
library=$(python3 - "$ROOT/idem-redis/lua" <<'PY'
import os, sys
lua = sys.argv[1]
read = lambda name: open(os.path.join(lua, name)).read()
def function(name, *files):
    return ("redis.register_function('lua_costs_%s', function(KEYS, ARGV)\n" % name
            + "".join(read(f) + "\n" for f in files) + "end)\n")
print("#!lua name=lua_costs\n" + read("common.lua") + "\n"
      + function("claim", "claim_replay.lua", "claim.lua") + function("complete", "complete.lua"))
PY
)

# Redis's time per call of the command $1 since the last reset; fails when no call was
# counted or any failed (a script that did not load, an error reply).
per_call() {
  local stats
  stats=$($R info commandstats | grep "^cmdstat_$1:" || true)
  case "$stats" in
    *:calls=0,*|"") echo "lua-costs: Redis counted no $1 call" >&2; exit 1 ;;
  esac
  case "$stats" in
    *rejected_calls=0,failed_calls=0*) ;;
    *) echo "lua-costs: some $1 calls failed: $stats" >&2; exit 1 ;;
  esac
  echo "$stats" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/'
}

# How many calls of the command $1 Redis counted since the last reset.
calls_of() {
  $R info commandstats | grep "^cmdstat_$1:" | sed 's/^[^:]*:calls=\([0-9]*\),.*/\1/' || true
}

# Fails unless nine in ten of the completions just measured wrote their result.
completions_wrote() {
  local wrote
  wrote=$(calls_of hset)
  if [ "${wrote:-0}" -lt $((RECORDS / 10 * 9 / 10)) ]; then
    echo "lua-costs: $1: only ${wrote:-0} of $((RECORDS / 10)) completions wrote" >&2
    exit 1
  fi
}

idem() {
  $R flushall >/dev/null
  printf '%s' "$library" | $R -x FUNCTION LOAD REPLACE >/dev/null
  $R config resetstat >/dev/null
  $BENCH -r 1000000000 -n $CLAIMS FCALL lua_costs_claim 1 n:__rand_int__ $FP $ATTEMPT 30000 600000 >/dev/null
  local claim; claim=$(per_call fcall)
  # Records in progress under token 1 and this attempt, as a fresh claim leaves them.
  $R eval "for i = 0, $RECORDS - 1 do local k = 'p:' .. string.format('%012d', i); redis.call('HSET', k, 'f', '$FP', 's', 'in_progress', 't', '1', 'a', '$ATTEMPT', 'l', '9999999999999', 'c', '1700000000000', 'e', '9999999999998'); redis.call('PEXPIREAT', k, '9999999999999') end" 0 >/dev/null
  $R config resetstat >/dev/null
  $BENCH -r $RECORDS -n $((RECORDS / 10)) FCALL lua_costs_complete 1 p:__rand_int__ 1 $ATTEMPT "$RECEIPT" 600000 >/dev/null
  local complete; complete=$(per_call fcall)
  completions_wrote idem
  $R eval "for i = 0, $RECORDS - 1 do local k = 'd:' .. string.format('%012d', i); redis.call('HSET', k, 'f', '$FP', 's', 'completed', 't', '1', 'a', '$ATTEMPT', 'l', '1', 'c', '1700000000000', 'e', '9999999999998', 'r', ARGV[1]); redis.call('PEXPIREAT', k, '9999999999998') end" 0 "$RECEIPT" >/dev/null
  $R config resetstat >/dev/null
  $BENCH -r $RECORDS -n $CLAIMS FCALL lua_costs_claim 1 d:__rand_int__ $FP $ATTEMPT 30000 600000 >/dev/null
  local replay; replay=$(per_call fcall)
  echo "idem        claim of a new key $claim  completion $complete  replay $replay"
}

peer() {
  $R flushall >/dev/null
  local claim_sha complete_sha
  claim_sha=$($R script load "$(cat "$PEER/claim.lua")")
  complete_sha=$($R script load "$(cat "$PEER/complete.lua")")
  $R config resetstat >/dev/null
  $BENCH -r 1000000000 -n $CLAIMS EVALSHA "$claim_sha" 2 n:__rand_int__ counter '{"status":"in_progress"}' 30000 $FP >/dev/null
  local claim; claim=$(per_call evalsha)
  $R eval "for i = 0, $RECORDS - 1 do local k = 'p:' .. string.format('%012d', i); redis.call('HSET', k, 'status', 'in_progress', 'data', '{}', 'run_id', '0123456789abcdef', 'ft', '5', 'fp', '$FP'); redis.call('PEXPIREAT', k, '9999999999999') end" 0 >/dev/null
  $R config resetstat >/dev/null
  $BENCH -r $RECORDS -n $((RECORDS / 10)) EVALSHA "$complete_sha" 1 p:__rand_int__ "$RECEIPT" 0123456789abcdef 5 600000 $FP >/dev/null
  local complete; complete=$(per_call evalsha)
  completions_wrote idempotent
  $R eval "for i = 0, $RECORDS - 1 do local k = 'd:' .. string.format('%012d', i); redis.call('HSET', k, 'status', 'complete', 'data', ARGV[1], 'run_id', '0123456789abcdef', 'ft', '5', 'fp', '$FP'); redis.call('PEXPIREAT', k, '9999999999998') end" 0 "$RECEIPT" >/dev/null
  $R config resetstat >/dev/null
  $BENCH -r $RECORDS -n $CLAIMS EVALSHA "$claim_sha" 2 d:__rand_int__ counter x 30000 $FP >/dev/null
  local replay; replay=$(per_call evalsha)
  echo "idempotent  claim of a new key $claim  completion $complete  replay $replay"
}

for _ in $(seq "$RUNS"); do
  idem
  peer
done
$R flushall >/dev/null
