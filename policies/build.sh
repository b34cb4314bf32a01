#!/usr/bin/env bash
# Compiles every policy (src/, safe/, unsafe/) and the map-declaration fixtures the loader's tests
# parse (maps/) to target/policies/<dir>/<name>.o.
# Installs clang (14) and clang-19 if they are missing.
#
# Default outputs, target/policies/<dir>/<name>.o: clang 14, -mcpu=v3 (the cpu version is pinned:
# clang >= 20 defaults to v3 anyway; the verifier and both engines take v1 to v4, and v3 is what
# policies are shipped as).
#
# Programs that only build at v4 (sign-extending loads and moves, sdiv/smod, bswap, gotol) carry
# the header line `// requires: v4`: their default output is built with clang-19 -mcpu=v4
# instead, and the v1, v2 and v3-clang19 builds below skip them.
#
# Other builds of src/ and safe/, named target/policies/<build>/<dir>-<name>.o:
#   cpu-v1, cpu-v2      clang 14: what older cpu versions emit (no ALU32/JMP32 in v1, no ALU32
#                       in v2); programs that need v3 (32-bit atomics) fail to build and are
#                       skipped there
#   cpu-v3-clang19      clang-19 -mcpu=v3: the same instruction set from a newer compiler
#   cpu-v4              clang-19 -mcpu=v4: every program, v4 idioms wherever clang picks them
set -euo pipefail
cd "$(dirname "$0")"
# NCCLBPF_NO_INSTALL=1 (set by the build script of the `ncclbpf-policies` crate, i.e. by
# `cargo test`): install nothing; without clang fail, without clang-19 skip what needs it.
no_install=${NCCLBPF_NO_INSTALL:-0}
if ! command -v clang >/dev/null; then
  if [ "$no_install" = 1 ]; then
    echo "clang not found: install it (apt-get install -y clang clang-19) or run policies/build.sh, which does" >&2
    exit 3
  fi
  echo "clang not found: installing it (apt-get install -y clang)" >&2
  apt-get update -qq && apt-get install -y -qq clang >/dev/null
fi
have19=1
if ! command -v clang-19 >/dev/null; then
  if [ "$no_install" = 1 ]; then
    echo "clang-19 not found: v4 programs and the clang-19 builds are skipped (apt-get install -y clang-19)" >&2
    have19=0
  else
    echo "clang-19 not found: installing it (apt-get install -y clang-19)" >&2
    apt-get update -qq && apt-get install -y -qq clang-19 >/dev/null
  fi
fi
flags=(-O2 -g -target bpf -Wall -Wno-unused-function -I include)
needs_v4() { grep -q '^// requires: v4' "$1"; }
stale() { [ ! -f "$2" ] || [ "$1" -nt "$2" ] || [ include/ncclbpf.h -nt "$2" ] || [ build.sh -nt "$2" ]; }
out=../target/policies
for dir in src safe unsafe maps; do
  mkdir -p "$out/$dir"
  for c in "$dir"/*.c; do
    [ -e "$c" ] || continue
    o="$out/$dir/$(basename "${c%.c}").o"
    if stale "$c" "$o"; then
      if needs_v4 "$c"; then
        [ "$have19" = 1 ] || continue
        clang-19 "${flags[@]}" -mcpu=v4 -c "$c" -o "$o"
      else
        clang "${flags[@]}" -mcpu=v3 -c "$c" -o "$o"
      fi
    fi
  done
done
builds="cpu-v1 cpu-v2"
[ "$have19" = 1 ] && builds="$builds cpu-v3-clang19 cpu-v4"
for build in $builds; do
  mkdir -p "$out/$build"
  for c in src/*.c safe/*.c; do
    o="$out/$build/$(basename "$(dirname "$c")")-$(basename "${c%.c}").o"
    if [ "$build" != cpu-v4 ] && needs_v4 "$c"; then
      rm -f "$o"
      continue
    fi
    stale "$c" "$o" || continue
    case $build in
      cpu-v1 | cpu-v2)
        clang -O2 -g -target bpf -mcpu="${build#cpu-}" -I include -c "$c" -o "$o" 2>/dev/null || rm -f "$o"
        ;;
      cpu-v3-clang19) clang-19 "${flags[@]}" -mcpu=v3 -c "$c" -o "$o" ;;
      cpu-v4) clang-19 "${flags[@]}" -mcpu=v4 -c "$c" -o "$o" ;;
    esac
  done
done
rm -f "$out/MISSING" # a cargo build without clang may have left it
echo "policies built in target/policies"
