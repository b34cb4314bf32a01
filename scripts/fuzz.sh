#!/usr/bin/env bash
# Long fuzzing runs of the loader, the verifier, the JIT/interpreter differential, the locality
# property (ranks that differ only in rank-local data decide the same) and the soundness
# property (the CI runs the same tests with small case counts).
#
#   scripts/fuzz.sh [cases]          # default 200000
#   SOUNDNESS_SEED=n scripts/fuzz.sh # replay a soundness run (the seed base is printed)
#
# The soundness run prints: programs generated, accepted (and the share), run, violations,
# what was generated and accepted per weak spot, why programs were rejected, and one
# minimised program (disassembly and a Rust literal for the regression list) per class of
# violation and feature set. Every stage runs even when an earlier one fails; the exit status
# is that of the first failure.
set -uo pipefail
cd "$(dirname "$0")/.."
cases=${1:-200000}
seed=${SOUNDNESS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
policies/build.sh || exit 1
status=0
run() {
  echo "== $*"
  "$@" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
}
run env PROPTEST_CASES="$cases" cargo test --release -p policy-verifier --test fuzz
run env PROPTEST_CASES="$cases" cargo test --release -p policy-runtime --test properties
run env LOCALITY_CASES="$cases" LOCALITY_SEED="$seed" \
  cargo test --release -p policy-runtime --test locality_fuzz -- --nocapture
run env SOUNDNESS_CASES="$cases" SOUNDNESS_MUTANTS="$cases" SOUNDNESS_SEED="$seed" \
  SOUNDNESS_GROUP=features \
  cargo test --release -p policy-runtime --test soundness -- --nocapture --test-threads 1
exit $status
