#!/usr/bin/env bash
# Mutation testing: cargo-mutants changes the code one small way at a time (a comparison
# flipped, a condition forced, a function's body replaced by a default) and runs the
# tests that guard it; a mutant the tests do not catch is a behaviour nothing checks.
# Figures and every survivor's account are in RELIABILITY.md.
#
#   scripts/mutants.sh --quick        a twelfth of the state machine's mutants (CI; the
#                                     shard turns with the day, IDEM_MUTANTS_SHARD=k/n;
#                                     no unmutated baseline: CI's tests ran just before)
#   scripts/mutants.sh [TARGET...]    the named targets, whole (default: machine)
#   scripts/mutants.sh --long         every target, whole, then the SQL and Lua
#                                     (scripts/query_mutants.py; hours on two cores)
#   scripts/mutants.sh --iterate TARGET...
#                                     the named targets, skipping what an earlier run
#                                     caught or found unviable (a long run made in parts)
#
# Targets: machine (idem-core's state machine, against its unit tests and the conformance
# suite and model-based run on the memory store, which is the machine over a map),
# driver (idem-core's driver, against idem-core's tests and the explorer), sqlite,
# postgres, redis, dynamodb (each backend's Rust, against its own tests; the server ones
# need the services: scripts/services.sh start) and http (idem-http).
#
# Each target's report is in target/mutants/TARGET/mutants.out (caught.txt, missed.txt,
# unviable.txt, timeout.txt; after a second pass or with --iterate, the earlier catches
# are in previously_caught.txt and the earlier report in mutants.out.old). Every target's
# passes run nextest, which runs no doc tests; the mutants they all miss meet the doc
# tests last. The script fails when a mutant is missed or times out, or a baseline fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo mutants --version >/dev/null 2>&1; then
  cargo install --locked cargo-mutants --version 27.1.0
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest --version 0.9.143
fi

# name; what to mutate and how to build it (cargo-mutants arguments); the packages whose
# tests run; a nextest filter ('' for all); a first, faster filter ('' for none); the test
# targets the first passes build ('' for all: cargo arguments, one pass per set, the sets
# separated by `,`). Fields end at `;`: the filters hold `|`.
#
# With a first filter, every mutant meets it first, and only the ones it misses meet the
# whole filter (cargo-mutants --iterate keeps each pass's catches and adds the next
# one's), so a slow test (an explorer's sampled run, about 100 s on PostgreSQL) runs
# for the few mutants the others do not catch rather than for every one. First targets do
# the same for building: most of a mutant's cost in a crate with many test binaries is
# linking them, so the first pass builds the few that catch most mutants, and a next one
# a few more, before the whole suite.
target_args() {
  case $1 in
    machine)
      echo "-p idem-core -f idem-core/src/machine.rs;idem-core idem-testkit;binary(memory_store) | (package(idem-core) & kind(lib));" ;;
    driver)
      echo "-p idem-core -f idem-core/src/driver/**;idem-core idem-testkit;package(idem-core) | binary(memory_store) | binary(explore_memory);package(idem-core) | binary(memory_store)" ;;
    sqlite | postgres | redis)
      echo "-p idem-$1;idem-$1;;not binary(explore)" ;;
    dynamodb)
      # Its `url` feature (a client from a URL) is off by default: without it, that code
      # and its tests are not built, and every mutant there would pass untested.
      echo "-p idem-dynamodb --all-features;idem-dynamodb;;not binary(explore)" ;;
    http)
      # The unit tests and the two integration binaries with the most cases, first; then
      # the binaries of the layer's parts (gRPC, held keys, handlers, composed stacks, metrics).
      echo "-p idem-$1;idem-$1;;all();--lib --test=answers --test=traffic,--test=grpc --test=held --test=handlers --test=composition --test=shadow" ;;
    *)
      echo "mutants: unknown target $1 (machine, driver, sqlite, postgres, redis, dynamodb, http)" >&2
      return 1 ;;
  esac
}

shard=()
baseline=()
targets=()
mode=${1:-}
case $mode in
  --quick)
    # A different twelfth of the machine's mutants each day: every one within 12 days.
    shard=(--shard "${IDEM_MUTANTS_SHARD:-$(( $(date +%j | sed 's/^0*//') % 12 ))/12}")
    baseline=(--baseline skip)
    targets=(machine) ;;
  --long) targets=(machine driver sqlite postgres redis dynamodb http) ;;
  --iterate)
    shift
    targets=("$@") ;;
  '') targets=(machine) ;;
  *) targets=("$@") ;;
esac

status=0
for target in "${targets[@]}"; do
  # A target with no arguments would mutate the whole workspace: stop instead.
  spec=$(target_args "$target") || exit 2
  IFS=';' read -r mutate tests filter first first_targets <<<"$spec"
  test_packages=()
  for package in $tests; do test_packages+=(--test-package "$package"); done
  # Each pass: its filter, the test targets it builds ('' for all) and its limit. Above
  # the longest test nextest lets run in each pass: 90 s in a first pass, the explorers'
  # 5 minutes in a whole one.
  passes=() pass_targets=() pass_timeouts=()
  # The quick run is a shard of the machine, which has no first filter.
  if [[ -n $first && $mode != --quick ]]; then
    IFS=',' read -r -a sets <<<"$first_targets"
    (( ${#sets[@]} )) || sets=('')
    for set_of_targets in "${sets[@]}"; do
      # A stray `,,` would add a pass that builds everything: skip it.
      [[ -z $set_of_targets && ${#sets[@]} -gt 1 ]] && continue
      passes+=("$first") pass_targets+=("$set_of_targets") pass_timeouts+=(150)
    done
  fi
  passes+=("$filter") pass_targets+=('') pass_timeouts+=(400)
  echo "mutants: $target (${shard[*]:-whole})"
  mkdir -p "target/mutants/$target"
  iterate=()
  [[ $mode == --iterate ]] && iterate=(--iterate)
  # $mutate is a list of arguments, split here with globbing off (a file pattern is
  # cargo-mutants' to match). The mutants profile builds without debug information.
  set -f
  result=0
  for i in "${!passes[@]}"; do
    pass=${passes[i]}
    # The first failure ends the run, the tests still running included: a caught
    # mutant costs its first failing test, not the whole suite (the workspace's nextest
    # profile runs every test to the end, for CI). nextest's mutants profile ends a test
    # that loops forever (.config/nextest.toml), so a hang under a mutant is a catch.
    nextest_args=(--max-fail=1:immediate --profile mutants)
    [[ -n $pass ]] && nextest_args+=(-E "$pass")
    # Given to every cargo command (the build's too), so a first pass builds only them.
    cargo_args=()
    for arg in ${pass_targets[i]}; do cargo_args+=("--cargo-arg=$arg"); done
    timeout=${pass_timeouts[i]}
    # Every pass but the quick one first runs its tests unmutated (cargo-mutants'
    # baseline), with its own filter: a test that fails unmutated would otherwise count as
    # a catch of every mutant. --no-shuffle: a shard is the same list each time.
    result=0
    # shellcheck disable=SC2086
    cargo mutants $mutate "${test_packages[@]}" --test-tool nextest --timeout $timeout \
      --profile mutants --no-shuffle "${shard[@]}" "${baseline[@]}" "${iterate[@]}" "${cargo_args[@]}" \
      -o "target/mutants/$target" -- "${nextest_args[@]}" || result=$?
    # 2: mutants missed, 3: timeouts, which the next pass tries again with more tests
    # (keeping this pass's catches). Anything else ends the target: done (0), or a
    # failed baseline, an interrupt, bad arguments.
    (( result == 2 || result == 3 )) || break
    iterate=(--iterate)
  done
  # nextest runs no doc tests, and a doc example that asserts a result is a test too:
  # what every pass missed meets the doc tests last (cargo test --doc, with its own
  # unmutated baseline). Not in the quick run: cargo-mutants shards what --iterate leaves,
  # so the shard would name other mutants than the ones its pass missed.
  if (( result == 2 )) && [[ $mode != --quick ]]; then
    result=0
    # shellcheck disable=SC2086
    cargo mutants $mutate "${test_packages[@]}" --test-tool cargo --timeout 400 \
      --profile mutants --no-shuffle --iterate \
      -o "target/mutants/$target" -- --doc || result=$?
  fi
  if (( result != 0 )); then
    status=1
    echo "mutants: $target: cargo mutants exited with $result" >&2
    for outcome in missed timeout; do
      file="target/mutants/$target/mutants.out/$outcome.txt"
      if [[ -s $file ]]; then
        echo "mutants: $target, $outcome:" >&2
        cat "$file" >&2
      fi
    done
  fi
  set +f
done
# The SQL and Lua, which cargo-mutants does not touch, with a mutator of our own.
if [[ $mode == --long ]] && ! python3 scripts/query_mutants.py sqlite postgres redis; then
  status=1
fi
exit $status
