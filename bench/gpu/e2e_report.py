"""Report of bench/gpu/e2e.sh: the markdown summary (stdout) from its work folder.

Reads WORKDIR/meta.txt, jobs.txt, results.txt (RESULT / DECODE lines of every job's rank 0) and
logs/ (the plugin's own lines). Per arm and point the figure is the median over the rounds that
measured it, with the rounds' min-max beside it. "Best Socket" at a collective, rank count and
size is the Socket arm (name sock*) with the highest median bus bandwidth there (lowest median
time per token for decode); every plugin arm's ratio is taken against it: busbw / best Socket's
busbw (higher is better), decode time / best Socket's time (lower is better).

Usage: e2e_report.py WORKDIR
"""
import glob
import os
import re
import statistics
import sys

from report_common import fmt_bytes, kv

COLL_ORDER = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
GOAL_BIG = 4 << 20  # from this size on, busbw >= 2x best Socket
GOAL_BW = 2.0
GOAL_DECODE = 0.6


def f(x, nd=2):
    if x is None:
        return "n/a"
    if abs(x) >= 100:
        return f"{x:.0f}" if nd <= 1 else f"{x:.1f}"
    if abs(x) < 0.01 and x != 0:
        return f"{x:.2g}"
    return f"{x:.{nd}f}"


def spread(vals, nd=2):
    if len(vals) < 2:
        return ""
    return f" ({f(min(vals), nd)}–{f(max(vals), nd)})"


def is_socket(arm):
    return arm.startswith("sock")


def main():
    w = sys.argv[1]
    meta_lines = open(os.path.join(w, "meta.txt")).read().splitlines() if os.path.exists(os.path.join(w, "meta.txt")) else []
    meta = {}
    arms, sweep_arms, arm_env = [], [], {}
    for line in meta_lines:
        if line.startswith("arm ") or line.startswith("sweep_arm "):
            _, a, *env = line.split()
            (arms if line.startswith("arm ") else sweep_arms).append(a)
            arm_env[a] = " ".join(env)
        elif "=" in line and " " not in line.split("=", 1)[0]:
            k, v = line.split("=", 1)
            meta[k] = v
    jobs = [l for l in open(os.path.join(w, "jobs.txt")).read().splitlines()] if os.path.exists(os.path.join(w, "jobs.txt")) else []
    res, dec = {}, {}  # (n, coll, size) -> arm -> [dict]; (n, size) -> arm -> [dict]
    for line in open(os.path.join(w, "results.txt")) if os.path.exists(os.path.join(w, "results.txt")) else []:
        if line.startswith("RESULT "):
            d = kv(line)
            res.setdefault((int(d["ranks"]), d["coll"], int(d["size"])), {}).setdefault(d["arm"], []).append(d)
        elif line.startswith("DECODE "):
            d = kv(line)
            dec.setdefault((int(d["ranks"]), int(d["size"])), {}).setdefault(d["arm"], []).append(d)
    seen = {a for v in list(res.values()) + list(dec.values()) for a in v}
    all_arms = arms + [a for a in sweep_arms if a not in arms] + sorted(seen - set(arms) - set(sweep_arms))
    sock_arms = [a for a in all_arms if is_socket(a)]
    plug_arms = [a for a in all_arms if not is_socket(a)]

    L = []
    P = L.append
    P("# GPU end-to-end: NCCL's Socket at its best per size against the ncclbpf plugin (issue 11)\n")
    P("Made by `bench/gpu/e2e.sh` (rank program `bench/gpu/e2e.py`, this report `bench/gpu/e2e_report.py`). "
      "Every rank a separate process and its own NCCL host on the one GPU (MPS), so every byte between ranks "
      "crosses the NET transport; every result of every call checked on every rank. A figure is the median over "
      "the rounds that measured it, the rounds' min–max in parentheses; arms alternated within each round (order "
      "reversed every other round). Bus bandwidth as nccl-tests computes it (GB/s = 10⁹ B/s). Best Socket: per "
      "collective, rank count and size, the Socket arm with the highest median busbw there (decode: lowest median "
      "time per token); ratios are against it.\n")
    P("```")
    for line in meta_lines:
        P(line)
    P("```\n")

    # Jobs.
    P("## Jobs\n")
    P("| arm | ranks | round | exit | seconds | of them start-up (rank 0: import, init, first all_reduce) | channels via NET (all ranks' logs) | via P2P/SHM | network | NCCL | ranks done |")
    P("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
    bad_jobs = []
    for line in jobs:
        if line.startswith("SKIPPED "):
            d = kv(line)
            P(f"| {d.get('arm')} | {d.get('ranks')} | {d.get('round')} | skipped ({d.get('reason')}: {d.get('left')} left, "
              f"{d.get('expected')} expected) | | | | | | | |")
            bad_jobs.append(line)
            continue
        if not line.startswith("JOB "):
            continue
        d = kv(line)
        ok = d.get("rc") == "0" and d.get("via_other") == "0" and d.get("via_net", "0") != "0"
        if not ok:
            bad_jobs.append(line)
        P(f"| {d.get('arm')} | {d.get('ranks')} | {d.get('round')} | {d.get('rc')} | {d.get('seconds')} | {d.get('init')} | {d.get('via_net')} | "
          f"{d.get('via_other')} | {d.get('network')} | {d.get('nccl')} | {d.get('done')} |")
    P("")

    checks = sum(int(d["checks"]) for v in list(res.values()) + list(dec.values()) for l in v.values() for d in l)
    bad = sum(int(d["bad"]) for v in list(res.values()) + list(dec.values()) for l in v.values() for d in l)

    def med(lst, key):
        vals = [float(d[key]) for d in lst]
        return statistics.median(vals), vals

    # Collective tables, and the ratios for the verdicts.
    ratios = {a: [] for a in plug_arms}  # (n, coll, size, median ratio, worst-case ratio)
    dratios = {a: [] for a in plug_arms}
    ranks = sorted({k[0] for k in res} | {k[0] for k in dec})
    colls = [c for c in COLL_ORDER if any(k[1] == c for k in res)]
    for coll in colls:
        for n in ranks:
            sizes = sorted(s for (nn, c, s) in res if nn == n and c == coll)
            if not sizes:
                continue
            P(f"## {coll}, {n} ranks: bus bandwidth (GB/s)\n")
            head = "| size | best Socket (arm) | its µs | busbw |"
            rule = "|---:|---|---:|---:|"
            for a in plug_arms:
                head += f" {a} | {a} / best |"
                rule += "---:|---:|"
            head += " every Socket arm (median busbw) | checked (wrong) |"
            rule += "---|---|"
            P(head)
            P(rule)
            for s in sizes:
                by = res[(n, coll, s)]
                socks = {a: med(by[a], "busbw") for a in by if is_socket(a)}
                best = max(socks, key=lambda a: socks[a][0]) if socks else None
                bb = socks[best][0] if best else None
                us = f(med(by[best], "us")[0], 1) if best else "n/a"
                row = f"| {fmt_bytes(s)} | {best or 'none'} | {us} | {f(bb) if best else 'n/a'}{spread(socks[best][1]) if best else ''} |"
                for a in plug_arms:
                    if a in by and best and bb > 0:
                        m, vals = med(by[a], "busbw")
                        r = m / bb
                        worst = min(vals) / max(socks[best][1])
                        ratios[a].append((n, coll, s, r, worst))
                        row += f" {f(m)}{spread(vals)} | {f(r)} |"
                    elif a in by:
                        m, vals = med(by[a], "busbw")
                        row += f" {f(m)}{spread(vals)} | n/a |"
                    else:
                        row += " | |"
                allsock = " / ".join(f"{a} {f(socks[a][0])}" for a in sock_arms if a in socks)
                nchk = sum(int(d["checks"]) for l in by.values() for d in l)
                nbad = sum(int(d["bad"]) for l in by.values() for d in l)
                row += f" {allsock} | {nchk} ({nbad}) |"
                P(row)
            P("")

    # Decode.
    for n in ranks:
        sizes = sorted(s for (nn, s) in dec if nn == n)
        if not sizes:
            continue
        per = next(iter(next(iter(dec[(n, sizes[0])].values())))).get("per", "160")
        P(f"## Decode, {n} ranks: time per token (ms; {per} back-to-back bf16 all_reduces of the size per token, median token)\n")
        head = "| size | best Socket (arm) | ms/token |"
        rule = "|---:|---|---:|"
        for a in plug_arms:
            head += f" {a} | {a} / best |"
            rule += "---:|---:|"
        head += " every Socket arm (median ms) | tokens per round | checked (wrong) |"
        rule += "---|---|---|"
        P(head)
        P(rule)
        for s in sizes:
            by = dec[(n, s)]
            socks = {a: med(by[a], "ms_median") for a in by if is_socket(a)}
            best = min(socks, key=lambda a: socks[a][0]) if socks else None
            bt = socks[best][0] if best else None
            row = f"| {fmt_bytes(s)} | {best or 'none'} | {f(bt) if best else 'n/a'}{spread(socks[best][1]) if best else ''} |"
            for a in plug_arms:
                if a in by and best:
                    m, vals = med(by[a], "ms_median")
                    r = m / bt
                    worst = max(vals) / min(socks[best][1])
                    dratios[a].append((n, "decode", s, r, worst))
                    row += f" {f(m)}{spread(vals)} | {f(r)} |"
                else:
                    row += " | |"
            allsock = " / ".join(f"{a} {f(socks[a][0])}" for a in sock_arms if a in socks)
            toks = sorted({int(d["tokens"]) for l in by.values() for d in l})
            nchk = sum(int(d["checks"]) for l in by.values() for d in l)
            nbad = sum(int(d["bad"]) for l in by.values() for d in l)
            row += f" {allsock} | {toks[0]}–{toks[-1]} | {nchk} ({nbad}) |"
            P(row)
        P("")

    # Verdicts.
    V = []
    V.append(f"- every result correct: {'yes' if bad == 0 and checks > 0 else 'NO'} ({checks} calls checked over all ranks, {bad} wrong)")
    V.append(f"- every job ran to the end with all its channels via NET: {'yes' if not bad_jobs else 'NO'}"
             + ("" if not bad_jobs else f" ({len(bad_jobs)} not: see Jobs)"))
    rounds = sorted({int(d["round"]) for v in list(res.values()) + list(dec.values()) for l in v.values() for d in l})
    V.append(f"- rounds measured: {', '.join(map(str, rounds)) or 'none'}")

    def describe(lst, ok, worst_key, what):
        if not lst:
            return f"{what}: no points"
        good = [x for x in lst if ok(x[3])]
        w = worst_key(lst, key=lambda x: x[3])
        good_w = [x for x in lst if ok(x[4])]
        return (f"{what}: {'PASS' if len(good) == len(lst) else 'FAIL'}, {len(good)} of {len(lst)} points "
                f"(worst {f(w[3])}: {w[1]} {w[0]} ranks {fmt_bytes(w[2])}); with the spread (the arm's worst round "
                f"against best Socket's best round) {len(good_w)} of {len(lst)}")

    for a in plug_arms:
        big = [x for x in ratios[a] if x[2] >= GOAL_BIG]
        V.append(f"- **{a}** ({arm_env.get(a, '')}):")
        V.append("  - " + describe(big, lambda r: r >= GOAL_BW, min, f"busbw ≥ {GOAL_BW:g}× best Socket at ≥ {fmt_bytes(GOAL_BIG)}"))
        V.append("  - " + describe(ratios[a], lambda r: r >= 1.0, min, "busbw never below best Socket, any size"))
        V.append("  - " + describe(dratios[a], lambda r: r <= GOAL_DECODE, max, f"decode time ≤ {GOAL_DECODE:g}× best Socket's"))
    P("## Verdicts on the goals\n")
    P("\n".join(V) + "\n")

    # The plugin's own lines, one rank-0 log per plugin arm.
    pat = re.compile(r"NET/Plugin|NET/BPF|TUNER|net policy|data streams served|Using network|tuner", re.I)
    shown = False
    for a in plug_arms:
        logs = sorted(glob.glob(os.path.join(w, "logs", f"{a}-n*-r1-rank0.log")))
        if not logs:
            continue
        if not shown:
            P("## The plugin's log lines (rank 0, round 1, first rank count)\n")
            shown = True
        lines = []
        for line in open(logs[0], errors="replace"):
            if pat.search(line) and "closed " not in line:
                lines.append(line.rstrip()[line.find("NCCL INFO") + 10 if "NCCL INFO" in line else 0:])
        closed = sum(1 for line in open(logs[0], errors="replace") if "NET/BPF closed " in line)
        P(f"{a} (`{os.path.basename(logs[0])}`; {closed} 'closed connection' lines not shown):\n")
        P("```")
        for line in lines[:25]:
            P(line)
        if len(lines) > 25:
            P(f"... {len(lines) - 25} more")
        P("```\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
