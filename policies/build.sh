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
# The verifier and JIT must also take what older cpu versions emit (no ALU32/JMP32 in v1,
# no ALU32 in v2). Programs that need v3 (32-bit atomics) are skipped for them.
for cpu in v1 v2; do
  mkdir -p "$out/cpu-$cpu"
  for c in src/*.c safe/*.c; do
    o="$out/cpu-$cpu/$(basename "$(dirname "$c")")-$(basename "${c%.c}").o"
    if [ ! -f "$o" ] || [ "$c" -nt "$o" ] || [ include/ncclbpf.h -nt "$o" ]; then
      clang -O2 -g -target bpf -mcpu=$cpu -I include -c "$c" -o "$o" 2>/dev/null || rm -f "$o"
    fi
  done
done
echo "policies built in target/policies"
