#!/usr/bin/env python3
"""Which algorithm, protocol and channel count wins at each size, for each transport, in one job.

NCCL reads NCCL_ALGO / NCCL_PROTO / NCCL_MAX_NCHANNELS once per process, so a sweep of them
costs one job (several seconds of start-up) per combination. The tuner's rules policy decides
per call instead, by size: this script gives each combination its own size, a few bytes above
the size it stands for (size + 4 k for combination k; k = 0 has no rule, NCCL's own choice), and
writes one rules file that pins each tagged size to its combination. One job of bench/gpu/e2e.sh
with an arm ending in -r<name> then measures every combination at every size.

  tuner_sweep.py conf NAME [--sizes 8,1024,...] [--decode 16384,...] [--channels 1,2,-1]
      writes build/NAME.conf and prints SIZES=... DECODE=... for e2e.sh (all_reduce only:
      its size is exactly what NCCL passes the tuner)
  tuner_sweep.py report RESULTS.TXT...
      a markdown table per rank count and size: one row per combination, one column per arm,
      the best of each column in bold; then per arm its best combination at each size and the
      ratio to the best Socket (sock*) arm's best combination
  tuner_sweep.py rules RESULTS.TXT... --arm ARM [--gain 0.9]
      a rules file for that arm's transport: per rank count and size band (each measured size
      stands for the sizes nearer to it than to the next one, geometrically), the combination
      whose time over NCCL's choice, averaged over the all_reduce and decode figures of that
      size, is lowest, where that is at most --gain; elsewhere no rule (NCCL decides)

Combinations: algorithm tree or ring x protocol ll or simple x channels (1, 2, and -1: the
communicator's count); LL is left out from 4 MiB (it halves bandwidth and only wastes time
there). LL128 is not offered: NCCL cannot use it over NET on these machines (its cost entry is
disabled, and a rule naming it leaves the call to NCCL).
"""
import argparse
import collections
import os
import re
import statistics
import sys

ALGOS = ("tree", "ring")
PROTOS = ("ll", "simple")
STEP = 4  # float32 for the collectives; bf16 decode sizes stay even


def combos(base, channels):
    out = [("nccl", "", None)]
    for a in ALGOS:
        for p in PROTOS:
            if p == "ll" and base >= 4 << 20:
                continue
            for c in channels:
                out.append((a, p, c))
    return out


def label(c):
    a, p, ch = c
    if a == "nccl":
        return "NCCL's choice"
    return f"{a}/{p}/{'all' if ch == -1 else ch}ch"


def ints(s):
    return [int(x) for x in s.replace(",", " ").split()]


def cmd_conf(args):
    channels = ints(args.channels)
    lines = [f"# written by bench/gpu/tuner_sweep.py conf {args.name}: size base + {STEP} k pins combination k"]
    sizes, decode, pinned = [], [], set()
    # Warm-up first: NCCL connects an algorithm's channels on its first use (runtime connect),
    # which slowed the first figure of each algorithm 20-30x in a first sweep. One call per
    # algorithm and protocol at the smallest size, measured again later; the report keeps the
    # last figure of a size.
    first = min(ints(args.sizes) + ints(args.decode))
    warm = [first + STEP * k for k, c in enumerate(combos(first, channels)) if c[2] == -1]
    for kind, bases, out in (("coll", ints(args.sizes), sizes), ("decode", ints(args.decode), decode)):
        for base in bases:
            for k, c in enumerate(combos(base, channels)):
                s = base + STEP * k
                out.append(s)
                if c[0] != "nccl" and s not in pinned:
                    pinned.add(s)
                    lines.append(f"allreduce,{s},{s},{c[0]},{c[1]},{c[2]},-1,-1")
    # A decode size and a collective size may share a tag: both are all_reduces of that many
    # bytes, pinned to the same combination.
    if len(lines) - 1 > 512:
        sys.exit(f"tuner_sweep.py: {len(lines) - 1} rules, the tuner takes at most 512")
    path = os.path.join(args.build, f"{args.name}.conf")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"SIZES='{' '.join(map(str, warm + sizes))}'")
    print(f"DECODE='{' '.join(map(str, decode))}'")
    print(f"# {path}: {len(lines) - 1} rules", file=sys.stderr)


def tag_of(size, bases, channels):
    """(base, combination) for a tagged size: the largest base at or under it."""
    best = None
    for b in bases:
        if b <= size and (best is None or b > best):
            best = b
    if best is None:
        return None
    k, r = divmod(size - best, STEP)
    cs = combos(best, channels)
    if r or k >= len(cs):
        return None
    return best, cs[k]


KV = re.compile(r"(\w+)=(\S+)")


def load(args):
    """(kind, ranks, base) -> combination -> arm -> [figures], and the arms in order."""
    channels = ints(args.channels)
    bases = {"coll": ints(args.sizes), "decode": ints(args.decode)}
    # (kind, ranks, base) -> combination -> arm -> [figures]  (µs per call, or ms per token)
    data = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    arms, figures = [], {}
    for path in args.results:
        with open(path) as f:
            lines = f.readlines()
        for line in lines:
            if not (line.startswith("RESULT ") or line.startswith("DECODE ")):
                continue
            kv = dict(KV.findall(line))
            if line.startswith("RESULT ") and kv.get("coll") != "all_reduce":
                continue
            kind = "coll" if line.startswith("RESULT ") else "decode"
            t = tag_of(int(kv["size"]), bases[kind], channels)
            if t is None:
                continue
            arm = kv["arm"]
            if arm not in arms:
                arms.append(arm)
            # A size measured twice in one job (the warm-up): the last figure counts.
            key = (path, arm, kv["ranks"], kv["round"], kind, kv["size"])
            figures[key] = (kind, int(kv["ranks"]), t, arm, float(kv["us"] if kind == "coll" else kv["ms_median"]))
    for kind, n, t, arm, fig in figures.values():
        data[(kind, n, t[0])][t[1]][arm].append(fig)
    if not data:
        sys.exit("tuner_sweep.py: no tagged all_reduce or decode results in " + " ".join(args.results))
    return data, arms


def med(v):
    """The figure of a point over its rounds: the median from 3 rounds on, else the best (a
    scheduler stall only ever slows a figure: one slow round of two must not count half)."""
    if not v:
        return None
    return statistics.median(v) if len(v) >= 3 else min(v)


def cmd_rules(args):
    data, arms = load(args)
    if args.arm not in arms:
        sys.exit(f"tuner_sweep.py: no results for arm {args.arm!r} (have: {', '.join(arms)})")
    nccl = ("nccl", "", None)
    # ranks -> base -> combination -> [time / NCCL's choice time] over the kinds measured
    ratios = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for (kind, n, base), rows in data.items():
        ref = med(rows[nccl][args.arm])
        if not ref:
            continue
        for c, by_arm in rows.items():
            v = med(by_arm[args.arm])
            if v is not None and c != nccl:
                ratios[n][base][c].append(v / ref)
    print(f"# written by bench/gpu/tuner_sweep.py rules {' '.join(args.results)} --arm {args.arm} --gain {args.gain}")
    print("# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks")
    for n in sorted(ratios):
        bases = sorted(ratios[n])
        for i, base in enumerate(bases):
            lo = 0 if i == 0 else int((bases[i - 1] * base) ** 0.5) + 1
            hi = -1 if i == len(bases) - 1 else int((base * bases[i + 1]) ** 0.5)
            scored = sorted((statistics.mean(r), c) for c, r in ratios[n][base].items())
            if not scored or scored[0][0] > args.gain:
                print(f"# {n} ranks, {base} B: NCCL's choice (best other {scored[0][0]:.2f})" if scored else f"# {n} ranks, {base} B: nothing measured")
                continue
            score, (a, p, ch) = scored[0]
            print(f"# {n} ranks, {base} B: {label((a, p, ch))} at {score:.2f} of NCCL's choice")
            print(f"allreduce,{lo},{hi},{a},{p},{ch},-1,{n}")


def cmd_report(args):
    data, arms = load(args)
    channels = ints(args.channels)

    summary = []
    for key in sorted(data, key=lambda k: (k[1], k[0], k[2])):
        kind, n, base = key
        unit = "µs per all_reduce" if kind == "coll" else "ms per token (160 all_reduces)"
        what = "all_reduce" if kind == "coll" else "decode"
        print(f"\n### {what}, {n} ranks, {base} B ({unit}; best of 2 rounds, median of 3 or more)\n")
        print("| combination | " + " | ".join(arms) + " |")
        print("|---|" + "---:|" * len(arms))
        rows = data[key]
        best = {}
        for a in arms:
            vals = [(med(rows[c][a]), c) for c in rows if rows[c][a]]
            best[a] = min(vals) if vals else (None, None)
        for c in combos(base, channels):
            if c not in rows:
                continue
            cells = []
            for a in arms:
                v = med(rows[c][a])
                s = "" if v is None else f"{v:.4g}"
                if v is not None and best[a][1] == c:
                    s = f"**{s}**"
                cells.append(s)
            print(f"| {label(c)} | " + " | ".join(cells) + " |")
        socks = [best[a] for a in arms if a.startswith("sock") and best[a][0] is not None]
        ref = min(socks) if socks else (None, None)
        nccl = {a: med(rows[("nccl", "", None)][a]) for a in arms}
        nsock = [nccl[a] for a in arms if a.startswith("sock") and nccl[a] is not None]
        for a in arms:
            if best[a][0] is None:
                continue
            summary.append((what, n, base, a, best[a], ref, nccl[a], min(nsock) if nsock else None))
    print("\n### Each arm's best combination, against the best Socket arm's best\n")
    print("| | ranks | size | arm | best combination | figure | / best Socket's best | NCCL's choice | / best Socket with NCCL's choice |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|")
    for what, n, base, a, (v, c), (rv, rc), nv, nsv in summary:
        r = f"{v / rv:.2f}" if rv else ""
        r2 = f"{nv / nsv:.2f}" if nv and nsv else ""
        nvs = f"{nv:.4g}" if nv else ""
        print(f"| {what} | {n} | {base} | {a} | {label(c)} | {v:.4g} | {r} | {nvs} | {r2} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("conf", "report", "rules"):
        p = sub.add_parser(name)
        if name == "conf":
            p.add_argument("name")
            p.add_argument("--build", default=os.environ.get("BUILD", "build"))
        else:
            p.add_argument("results", nargs="+", help="results.txt of e2e.sh (several: their rounds pooled)")
        if name == "rules":
            p.add_argument("--arm", required=True)
            p.add_argument("--gain", type=float, default=0.9)
        p.add_argument("--sizes", default="8,1024,65536,262144,1048576,4194304,67108864")
        p.add_argument("--decode", default="16384,262144,1048576")
        p.add_argument("--channels", default="1,2,-1")
    args = ap.parse_args()
    {"conf": cmd_conf, "report": cmd_report, "rules": cmd_rules}[args.cmd](args)


if __name__ == "__main__":
    main()
