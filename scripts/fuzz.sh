#!/usr/bin/env bash
# Long fuzzing runs of the loader, the verifier and the JIT/interpreter differential (the CI
# runs the same properties with small case counts). Usage: scripts/fuzz.sh [cases]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-200000}
policies/build.sh
PROPTEST_CASES=$cases cargo test --release -p policy-verifier --test fuzz
PROPTEST_CASES=$cases cargo test --release -p policy-runtime --test properties
