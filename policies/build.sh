#!/usr/bin/env bash
# Compiles every policy (src/, safe/, unsafe/) to target/policies/<dir>/<name>.o.
# Installs clang if it is missing. The cpu version is pinned: clang >= 20 defaults to v3 anyway,
# and the verifier and JIT are written for v3 (ALU32, JMP32, atomics).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v clang >/dev/null; then
  echo "clang not found: installing it (apt-get install -y clang)" >&2
  apt-get update -qq && apt-get install -y -qq clang >/dev/null
fi
out=../target/policies
for dir in src safe unsafe; do
  mkdir -p "$out/$dir"
  for c in "$dir"/*.c; do
    [ -e "$c" ] || continue
    o="$out/$dir/$(basename "${c%.c}").o"
    if [ ! -f "$o" ] || [ "$c" -nt "$o" ] || [ include/ncclbpf.h -nt "$o" ]; then
      clang -O2 -g -target bpf -mcpu=v3 -Wall -Wno-unused-function -I include -c "$c" -o "$o"
    fi
  done
done
echo "policies built in target/policies"
