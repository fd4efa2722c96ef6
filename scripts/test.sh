#!/usr/bin/env bash
# Runs every test in the workspace: unit, conformance, multi-process, server-backed and doc
# tests. This is the README's test command; .ci/run runs it with IDEM_REQUIRE_SERVICES=1.
#
# It starts the test services the server-backed suites need (scripts/services.sh) and
# stops again only those it started. Where they cannot be started (no root to install
# them, say) the server-backed tests skip with a loud notice, unless
# IDEM_REQUIRE_SERVICES=1, which turns that into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVICES=(postgres redis redis-cluster dynamodb nats rabbitmq sqs flask)

if services_env=$(scripts/services.sh start "${SERVICES[@]}"); then
  eval "$services_env"
  trap 'if [[ -n ${IDEM_SERVICES_STARTED:-} ]]; then scripts/services.sh stop $IDEM_SERVICES_STARTED; fi' EXIT
elif [[ ${IDEM_REQUIRE_SERVICES:-0} == 1 ]]; then
  echo "test: the test services did not start, and IDEM_REQUIRE_SERVICES=1" >&2
  exit 1
else
  echo "test: the test services did not start; server-backed tests will be skipped" >&2
fi

# cargo-nextest runs test processes side by side, so the suites that mostly wait (the
# real-time explorations of each backend, the multi-process runs) overlap instead of
# queueing one binary after another as `cargo test` does; it has no doc tests, which
# `cargo test --doc` runs after it. Without cargo-nextest, `cargo test` runs everything.
# The time limits per test are in .config/nextest.toml. Arguments go to both commands,
# so give ones both take (`-p idem-core`, a test name).
#
# More tests than cores: most of the suite's time is spent waiting on servers, leases and
# other processes, so with one a core (nextest's default) the cores sat half idle. On a
# 2-core machine the nextest run took 786 s with two at a time, its test processes busy
# 0.6 of a core on average, and 493 s with four (1.0), every test passing in both
# (`NEXTEST_TEST_THREADS=N cargo nextest run --workspace`). Up to four more than the
# cores (nproc counts those this process may use), since every test shares the same few
# servers; NEXTEST_TEST_THREADS set beforehand wins (not --test-threads, which
# `cargo test --doc` below would refuse).
if cargo nextest --version >/dev/null 2>&1; then
  cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
  export NEXTEST_TEST_THREADS=${NEXTEST_TEST_THREADS:-$((cores + (cores < 4 ? cores : 4)))}
  cargo nextest run --workspace --locked "$@"
  cargo test --workspace --locked --doc "$@"
else
  echo "test: cargo-nextest is not installed (cargo install --locked cargo-nextest); running cargo test" >&2
  cargo test --workspace --locked "$@"
fi
