#!/usr/bin/env bash
# Verification cost before and after: runs the verifier benchmark (bench/src/verifier.rs) on the
# same policy objects with the verifier of another commit (default 39558d6, before the soundness
# rewrite) and with this tree's, one after the other, and prints one table of both.
#   scripts/verifier-compare.sh [commit]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-39558d6}
policies/build.sh >/dev/null
tmp=$(mktemp -d)
wt=$tmp/base
git worktree add -q --detach "$wt" "$base"
trap 'git worktree remove --force "$wt"; rm -rf "$tmp"' EXIT
# The benchmark itself comes from this tree, so both sides measure the same way.
cp bench/src/verifier.rs "$wt/bench/src/"
cp bench/Cargo.toml "$wt/bench/"
mkdir -p "$wt/target"
ln -s "$PWD/target/policies" "$wt/target/policies"
(cd "$wt" && CARGO_TARGET_DIR="$tmp/target" cargo run --release -q -p ncclbpf-bench --bin verifier-bench) >"$tmp/before.md"
cargo run --release -q -p ncclbpf-bench --bin verifier-bench >"$tmp/after.md"
python3 - "$tmp/before.md" "$tmp/after.md" "$base" <<'PY'
import sys
def rows(path):
    out = {}
    for line in open(path):
        c = [x.strip() for x in line.strip().strip('|').split('|')]
        if len(c) == 6 and c[0] not in ('program', '---'):
            out[c[0]] = c
    return out
before, after, base = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
print(f"| program | insns | processed ({base}) | processed (now) | ratio | verify µs ({base}) | verify µs (now) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name, a in after.items():
    b = before.get(name)
    if b is None:
        print(f"| {name} | {a[1]} | (new) | {a[2]} | | | {a[5]} |")
        continue
    bp = b[2] if b[2] else b[1]  # a rejected program shows its verdict
    ratio = ""
    if b[2].isdigit() and a[2].isdigit() and int(a[2]) > 0:
        ratio = f"{int(b[2]) / int(a[2]):.1f}x"
    print(f"| {name} | {a[1]} | {bp} | {a[2]} | {ratio} | {b[5]} | {a[5]} |")
PY
