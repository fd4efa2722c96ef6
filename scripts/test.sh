#!/usr/bin/env bash
# Runs every test in the workspace: unit, integration, conformance and doc tests.
# This is the README's test command; .ci/run runs it too.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
