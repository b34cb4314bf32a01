"""The NVLink case study's tables, rules files and plot (bench/gpu/nvlink.sh), from its work folder.

  nvlink_report.py rle LOG
      NCCL's TUNING lines of LOG ("AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE
      channel{Lo..Hi}={0..15}", one per collective, rank 0 only), run-length coded in order:
      "FUNC BYTES ALGO PROTO LO HI COUNT" per run of identical lines. nvlink.sh keeps these in
      tuning/LABEL.txt and drops the lines from the log (the logs must fit what comes back).
  nvlink_report.py rules WORK --channels C --out FILE
      The channel sweep's rules file: per collective and size, the best algorithm/protocol of the
      first sweep stage (NCCL's own choice in the `default` job included) with C channels.
  nvlink_report.py rules WORK --margin M --nnodes N --nranks R --out FILE
      The rules file for the `rules` arm, in NCCL's example-tuner CSV format: per collective and
      size, the fastest sweep point NCCL really applied, where it beat NCCL's default (the
      `default` job) by the fraction M or more; elsewhere no rule, so NCCL decides. Sizes between
      two measured ones go to the nearer (geometric middle); neighbours with the same choice
      merge into one range. The evidence is in comments above each rule.
  nvlink_report.py report WORK --md FILE [--png FILE]
      The summary (markdown) and the plot (matplotlib; without it the summary says so).

What NCCL applied. Each job's communicators see only measured calls (nvlink.py), so the TUNING
lines of a collective and size are its warm-up, estimate, settle and timed calls in that order;
the timed ones are the last ITERS (the RESULT line's iters). NCCL prints BYTES as count x element
size: all_reduce's buffer, but the per-rank count for all_gather and reduce_scatter, so their BYTES
times the rank count is the size used here (and the nBytes a tuner sees). A sweep point whose
applied algorithm/protocol is not the forced one (NCCL cannot use it here: its cost-table entry
is off, and the tuner never revives one) is "n/a" and never counts as a measurement of it.

Figures: per arm and point the median over the rounds that measured it (min-max beside with
several rounds); ratios are times, arm / baseline (above 1: slower), flagged above 1.01.
"""
import argparse
import collections
import math
import os
import re
import statistics
import sys

from report_common import fmt_bytes, kv

COLL_ORDER = ["all_reduce", "all_gather", "reduce_scatter"]
FUNC_COLL = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter"}
RULES_COLL = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}
COLL_OF_RULES = {v: k for k, v in RULES_COLL.items()}
ALGO_NAME = {"ring": "Ring", "tree": "Tree", "pat": "PAT", "nvls": "NVLS", "nvls_tree": "NVLSTree",
             "nvlstree": "NVLSTree", "collnet_direct": "CollNetDirect", "collnet_chain": "CollNetChain"}
PROTO_NAME = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
FLAG = 1.01
TUNING_RE = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
COMPARE_ARMS = ["nolib", "lib", "rules", "autotune", "size_aware"]


def fnum(x, nd=2):
    if x is None:
        return "–"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.{nd}f}"


def ratio_cell(r):
    if r is None:
        return "–"
    s = f"{r:.3f}"
    return f"**{s}** ⚠" if r > FLAG else s


def choice_str(c):
    """(algo, proto, nch) with lower-case names -> 'Ring/LL 16ch'; nch None or -1: NCCL's count."""
    if c is None:
        return "–"
    a, p, n = c
    s = f"{ALGO_NAME.get(a, a)}/{PROTO_NAME.get(p, p)}"
    if n is not None and n > 0:
        s += f" {n}ch"
    return s


# ----------------------------------------------------------------------------------------- input
def rle(path):
    runs = []
    with open(path, errors="replace") as f:
        for line in f:
            m = TUNING_RE.search(line)
            if not m:
                continue
            key = (m.group(1), int(m.group(2)), m.group(3).lower(), m.group(4).lower(), int(m.group(5)), int(m.group(6)))
            if runs and runs[-1][0] == key:
                runs[-1][1] += 1
            else:
                runs.append([key, 1])
    return runs


class Work:
    def __init__(self, w):
        self.w = w
        self.meta, self.meta_lines, self.arm_env, self.net_arm_env = {}, [], {}, {}
        p = os.path.join(w, "meta.txt")
        for line in open(p).read().splitlines() if os.path.exists(p) else []:
            self.meta_lines.append(line)
            if line.startswith("arm ") or line.startswith("net_arm "):
                kind, a, *env = line.split()
                (self.arm_env if kind == "arm" else self.net_arm_env)[a] = " ".join(env)
            elif "=" in line and " " not in line.split("=", 1)[0]:
                k, v = line.split("=", 1)
                self.meta[k] = v
        self.jobs, self.skipped_jobs = [], []
        p = os.path.join(w, "jobs.txt")
        for line in open(p).read().splitlines() if os.path.exists(p) else []:
            if line.startswith("JOB "):
                self.jobs.append(kv(line))
            elif line.startswith("SKIPPED "):
                self.skipped_jobs.append(kv(line))
        self.job_by_label = {j["label"]: j for j in self.jobs}
        # results[(phase, arm)][(coll, bytes)] -> list of dicts (one per round)
        self.results = collections.defaultdict(lambda: collections.defaultdict(list))
        self.skips = []
        p = os.path.join(w, "results.txt")
        for line in open(p) if os.path.exists(p) else []:
            if line.startswith("RESULT "):
                d = kv(line)
                for k in ("size", "bytes", "iters", "settle", "checks", "bad", "ranks"):
                    d[k] = int(d.get(k, 0))
                for k in ("us", "algbw", "busbw"):
                    d[k] = float(d[k])
                self.results[(d["phase"], d["arm"])][(d["coll"], d["bytes"])].append(d)
            elif line.startswith("SKIP "):
                self.skips.append(kv(line))
        self._tuning = {}

    def mode(self):
        return self.meta.get("MODE", "?")

    def tuning(self, label):
        """label -> {(coll, bytes): [(choice, count), ...] in order}, or None without a file."""
        if label in self._tuning:
            return self._tuning[label]
        p = os.path.join(self.w, "tuning", f"{label}.txt")
        out = None
        if os.path.exists(p):
            n = int(self.job_by_label.get(label, {}).get("ranks", self.meta.get("RANKS", "1")))
            out = collections.defaultdict(list)
            for line in open(p):
                f = line.split()
                if len(f) != 7 or f[0] not in FUNC_COLL:
                    continue
                coll = FUNC_COLL[f[0]]
                b = int(f[1]) * (n if coll != "all_reduce" else 1)
                ch = int(f[5]) - int(f[4]) + 1
                out[(coll, b)].append(((f[2], f[3], ch), int(f[6])))
        self._tuning[label] = out
        return out

    def timed_choice(self, label, coll, nbytes, iters):
        """Counter of the choices NCCL applied to the last `iters` calls of coll/nbytes in the
        job, or None when its TUNING lines are missing."""
        t = self.tuning(label)
        if t is None or (coll, nbytes) not in t:
            return None
        left, c = iters, collections.Counter()
        for choice, count in reversed(t[(coll, nbytes)]):
            take = min(left, count)
            c[choice] += take
            left -= take
            if left <= 0:
                break
        return c


def label_of(d):
    """The job label of a RESULT line (as nvlink.sh names its jobs)."""
    if d["phase"] == "sweep":
        return "sw-default" if d["arm"] == "default" else d["arm"]
    if d["phase"] == "net":
        return f"net-{d['arm']}-r{d['round']}"
    return f"{d['arm']}-r{d['round']}"


def top(counter):
    if not counter:
        return None
    return counter.most_common(1)[0][0]


def median_us(ds):
    return statistics.median(d["us"] for d in ds) if ds else None


# --------------------------------------------------------------------------------- rules files
def parse_rules(path):
    rules = []
    if not os.path.exists(path):
        return rules
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        rules.append({"coll": COLL_OF_RULES.get(f[0], f[0]), "min": int(f[1]), "max": int(f[2]),
                      "algo": f[3].lower(), "proto": f[4].lower(), "channels": int(f[5])})
    return rules


def requested(rules, coll, nbytes):
    """(algo, proto, channels) the first matching rule asks for, else None (NCCL's choice)."""
    for r in rules:
        if r["coll"] == coll and r["min"] <= nbytes and (r["max"] == -1 or nbytes <= r["max"]):
            return (r["algo"], r["proto"], r["channels"])
    return None


def sweep_points(work):
    """Every sweep measurement: {(coll, bytes): [point]} where a point is a dict: label, stage
    (1: default and forced algorithm/protocol, 2: channels), rule (algo, proto, channels: what a
    rule would say), applied (the timed calls' choice, or None unknown), ok (applied as asked or
    unknown), us, d."""
    pts = collections.defaultdict(list)
    for (phase, arm), by in work.results.items():
        if phase != "sweep":
            continue
        label = label_of({"phase": phase, "arm": arm})
        rules = parse_rules(os.path.join(work.w, "rules", f"{label}.conf"))
        stage = 2 if re.match(r"sw-c\d+$", label) else 1
        for (coll, b), ds in by.items():
            d = ds[0]
            applied_c = work.timed_choice(label, coll, b, d["iters"])
            applied = top(applied_c)
            if arm == "default":
                if applied is None:
                    continue  # NCCL's choice unknown: it cannot become a rule
                rule = (applied[0], applied[1], -1)
                ok = True
            else:
                rule = requested(rules, coll, b)
                if rule is None:
                    continue  # no rule matched: NCCL's choice again, measured by `default`
                ok = applied is None or (applied[0], applied[1]) == (rule[0], rule[1])
            pts[(coll, b)].append({"label": label, "arm": arm, "stage": stage, "rule": rule, "applied": applied,
                                   "mixed": applied_c is not None and len(applied_c) > 1, "ok": ok, "us": d["us"], "d": d})
    return pts


def best_point(points, stages=(1, 2)):
    cands = [p for p in points if p["ok"] and p["stage"] in stages]
    return min(cands, key=lambda p: p["us"]) if cands else None


def ranges(sizes):
    """Per sorted size, its [lo, hi] in a rules file (hi -1: no limit): the geometric middle
    between neighbours is the boundary."""
    out = []
    for i, b in enumerate(sizes):
        lo = 0 if i == 0 else math.isqrt(sizes[i - 1] * b) + 1
        hi = -1 if i == len(sizes) - 1 else math.isqrt(b * sizes[i + 1])
        out.append((lo, hi))
    return out


def write_rules(path, header, per_coll, nnodes=-1, nranks=-1):
    """per_coll: coll -> [(bytes, rule or None, evidence)] sorted by bytes."""
    lines = list(header)
    n = 0
    for coll in COLL_ORDER:
        if coll not in per_coll:
            continue
        entries = per_coll[coll]
        rg = ranges([b for b, _, _ in entries])
        i = 0
        while i < len(entries):
            b, rule, ev = entries[i]
            j = i
            evs = [ev]
            while j + 1 < len(entries) and rule is not None and entries[j + 1][1] == rule:
                j += 1
                evs.append(entries[j][2])
            if rule is not None:
                lo, hi = rg[i][0], rg[j][1]
                for e in evs:
                    lines.append(f"# {e}")
                lines.append(f"{RULES_COLL[coll]},{lo},{hi},{rule[0]},{rule[1]},{rule[2]},{nnodes},{nranks}")
                n += 1
            i = j + 1
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return n


def cmd_rules(a):
    work = Work(a.work)
    pts = sweep_points(work)
    default = work.results.get(("sweep", "default"), {})
    if not pts:
        print("no sweep measurements with NCCL's choices known (TUNING lines) in", a.work, file=sys.stderr)
        return 1
    per_coll = collections.defaultdict(list)
    if a.channels is not None:
        for (coll, b) in sorted(pts, key=lambda k: (COLL_ORDER.index(k[0]), k[1])):
            bp = best_point(pts[(coll, b)], stages=(1,))
            rule = (bp["rule"][0], bp["rule"][1], a.channels) if bp else None
            ev = f"{coll} {fmt_bytes(b)}: best of stage 1 {choice_str(bp['applied'] or bp['rule'])} {bp['us']:.2f} us ({bp['label']})" if bp else f"{coll} {fmt_bytes(b)}: nothing"
            per_coll[coll].append((b, rule, ev))
        header = [f"# channel sweep: each size's best algorithm/protocol of the sweep's first stage, with {a.channels} channels",
                  f"# (bench/gpu/nvlink_report.py rules {a.work} --channels {a.channels})"]
        n = write_rules(a.out, header, per_coll)
        print(f"{n} rules written to {a.out}")
        return 0 if n else 1
    margin = a.margin
    for (coll, b) in sorted(pts, key=lambda k: (COLL_ORDER.index(k[0]), k[1])):
        dd = default.get((coll, b))
        d_us = dd[0]["us"] if dd else None
        bp = best_point(pts[(coll, b)])
        dflt = next((p for p in pts[(coll, b)] if p["arm"] == "default"), None)
        rule, ev = None, f"{coll} {fmt_bytes(b)}: no measurement of NCCL's default"
        if bp and d_us:
            r = bp["us"] / d_us
            what = f"{choice_str(bp['applied'] or bp['rule'])} {bp['us']:.2f} us ({bp['label']}) vs NCCL's {choice_str(dflt['applied']) if dflt else '?'} {d_us:.2f} us: {r:.3f}x"
            if bp["arm"] == "default" or (dflt and bp["rule"] == dflt["rule"]):
                ev = f"{coll} {fmt_bytes(b)}: NCCL's own choice is the fastest ({what})"
            elif r <= 1 - margin:
                rule, ev = bp["rule"], f"{coll} {fmt_bytes(b)}: {what}"
            else:
                ev = f"{coll} {fmt_bytes(b)}: best {what}, within the margin {margin}: NCCL decides"
        per_coll[coll].append((b, rule, ev))
        print(ev)
    header = [f"# NCCL tuner rules (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks),",
              f"# derived by bench/gpu/nvlink_report.py from the sweep in {a.work}: per collective and size the",
              f"# fastest point NCCL really applied, where it beat NCCL's default by {margin:.0%} or more; elsewhere no rule.",
              f"# mode {work.mode()}, {a.nranks} ranks on {a.nnodes} node(s)."]
    n = write_rules(a.out, header, per_coll, a.nnodes, a.nranks)
    print(f"{n} rules written to {a.out}")
    return 0


# ----------------------------------------------------------------------------------------- report
def med_spread(ds):
    if not ds:
        return None, ""
    us = [d["us"] for d in ds]
    m = statistics.median(us)
    return m, (f" ({fnum(min(us))}–{fnum(max(us))})" if len(us) > 1 else "")


def compare_tables(work, out, flagged, gains):
    by = {arm: work.results.get(("compare", arm), {}) for arm in COMPARE_ARMS}
    arms = [a for a in COMPARE_ARMS if by[a]]
    if not arms:
        out.append("No compare results.\n")
        return
    final_rules = parse_rules(os.path.join(work.w, "rules", "final.conf"))
    keys = sorted({k for a in arms for k in by[a]}, key=lambda k: (COLL_ORDER.index(k[0]), k[1]))
    pol = [a for a in ("rules", "autotune", "size_aware") if a in arms]
    for coll in COLL_ORDER:
        ks = [k for k in keys if k[0] == coll]
        if not ks:
            continue
        out.append(f"### {coll}\n")
        head = ["bytes"] + [f"{a} (µs)" for a in arms]
        if "nolib" in arms and "lib" in arms:
            head.append("lib / nolib")
        for a in pol:
            if "lib" in arms:
                head.append(f"{a} / lib")
            if "nolib" in arms:
                head.append(f"{a} / nolib")
        head += ["lib rounds max/min", "busbw lib (GB/s)", "choice (lib: NCCL's)"] + [f"choice ({a})" for a in pol]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---:|" * (len(head) - 1 - len(pol)) + "---|" * (1 + len(pol)))
        for k in ks:
            b = k[1]
            med = {a: med_spread(by[a].get(k, []))[0] for a in arms}
            row = [fmt_bytes(b)]
            for a in arms:
                m, sp = med_spread(by[a].get(k, []))
                row.append(fnum(m) + sp)

            def rat(x, y, what):
                if med.get(x) is None or med.get(y) is None or med[y] == 0:
                    return "–"
                r = med[x] / med[y]
                if r > FLAG:
                    flagged.append((what, coll, b, r))
                if r < 1 / FLAG:
                    gains.append((what, coll, b, r))
                return ratio_cell(r)
            if "nolib" in arms and "lib" in arms:
                row.append(rat("lib", "nolib", "lib / nolib"))
            for a in pol:
                if "lib" in arms:
                    row.append(rat(a, "lib", f"{a} / lib"))
                if "nolib" in arms:
                    row.append(rat(a, "nolib", f"{a} / nolib"))
            lib_us = [d["us"] for d in by.get("lib", {}).get(k, [])]
            row.append(f"{max(lib_us) / min(lib_us):.3f}" if len(lib_us) > 1 else "–")
            lb = by.get("lib", {}).get(k, [])
            row.append(fnum(statistics.median(d["busbw"] for d in lb)) if lb else "–")
            choices = []
            for a in ["lib"] + pol:
                ds = by.get(a, {}).get(k, [])
                if a == "lib" and a not in arms:
                    choices.append("–")
                    continue
                cs = collections.Counter()
                known = False
                for d in ds:
                    c = work.timed_choice(label_of(d), coll, b, d["iters"])
                    if c is not None:
                        known = True
                        cs.update(c)
                if not known:
                    choices.append("?")
                    continue
                s = " + ".join(f"{choice_str(c)}" + (f" ×{n}" if len(cs) > 1 else "") for c, n in cs.most_common())
                if a == "rules":
                    want = requested(final_rules, coll, b)
                    if want is None:
                        s += " (no rule)"
                    else:
                        ok = all((c[0], c[1]) == (want[0], want[1]) for c in cs)
                        s += " (rule applied)" if ok else f" (rule {choice_str(want)} NOT applied)"
                if a == "autotune" and ds:
                    st = [d["settle"] for d in ds]
                    s += f"; settle {min(st)}{'' if min(st) == max(st) else '–' + str(max(st))} calls"
                choices.append(s)
            row += choices
            out.append("| " + " | ".join(row) + " |")
        out.append("")


def sweep_tables(work, out):
    pts = sweep_points(work)
    default = work.results.get(("sweep", "default"), {})
    labels = sorted({arm for (ph, arm) in work.results if ph == "sweep" and arm != "default"},
                    key=lambda s: (s.startswith("sw-c"), int(s[4:]) if re.match(r"sw-c\d+$", s) else 0, s))
    if not default and not labels:
        out.append("No sweep results.\n")
        return
    for coll in COLL_ORDER:
        ks = sorted({k for (ph, arm), by in work.results.items() if ph == "sweep" for k in by if k[0] == coll}, key=lambda k: k[1])
        if not ks:
            continue
        cols = [lb for lb in labels if any(k in work.results[("sweep", lb)] for k in ks)]
        out.append(f"### {coll}\n")
        head = ["bytes", "NCCL's choice", "default (µs)"] + [f"{lb[3:]} (µs)" for lb in cols] + ["fastest applied", "fastest / default"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---:|---|" + "---:|" * (1 + len(cols)) + "---|---:|")
        notes = []
        for k in ks:
            b = k[1]
            dd = default.get(k)
            dflt = next((p for p in pts.get(k, []) if p["arm"] == "default"), None)
            row = [fmt_bytes(b), choice_str(dflt["applied"]) if dflt else ("?" if dd else "–"), fnum(dd[0]["us"]) if dd else "–"]
            for lb in cols:
                p = next((p for p in pts.get(k, []) if p["label"] == lb), None)
                if p is None:
                    row.append("–")
                elif not p["ok"]:
                    row.append("n/a")
                    notes.append(f"{coll} {fmt_bytes(b)} {lb}: asked {choice_str(p['rule'])}, NCCL applied {choice_str(p['applied'])}")
                else:
                    ap = p["applied"]
                    extra = f" [{ap[2]}ch]" if ap and p["stage"] == 2 else ""
                    row.append(fnum(p["us"]) + extra + (" (mixed)" if p["mixed"] else ""))
            bp = best_point(pts.get(k, []))
            if bp and dd:
                row += [f"{choice_str(bp['applied'] or bp['rule'])} ({bp['label'][3:]})", f"{bp['us'] / dd[0]['us']:.3f}"]
            else:
                row += ["–", "–"]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        if notes:
            out.append("Not applicable (NCCL kept another choice; not a measurement of the forced one): " + "; ".join(notes) + ".\n")


def net_tables(work, out, net_summary):
    arms = [a for (ph, a) in work.results if ph == "net"]
    order = [a for a in work.meta.get("NET_ARMS", "").split() if a in arms] + sorted(set(arms) - set(work.meta.get("NET_ARMS", "").split()))
    if not order:
        out.append("No net-phase results.\n")
        return
    socks = [a for a in order if a.startswith("sock")]
    plugs = [a for a in order if not a.startswith("sock")]
    by = {a: work.results[("net", a)] for a in order}
    keys = sorted({k for a in order for k in by[a]}, key=lambda k: (COLL_ORDER.index(k[0]), k[1]))
    for coll in COLL_ORDER:
        ks = [k for k in keys if k[0] == coll]
        if not ks:
            continue
        out.append(f"### {coll}\n")
        head = ["bytes"] + [f"{a} (µs)" for a in order] + ["best Socket"] + [f"{a} / best Socket (time)" for a in plugs] + [f"busbw {a} (GB/s)" for a in ["best Socket"] + plugs]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---:|" * len(order) + "---:|---|" + "---:|" * (len(plugs) * 2 + 1))
        for k in ks:
            b = k[1]
            row = [fmt_bytes(b)]
            med = {}
            for a in order:
                m, sp = med_spread(by[a].get(k, []))
                med[a] = m
                row.append(fnum(m) + sp)
            sm = {a: med[a] for a in socks if med[a] is not None}
            best = min(sm, key=sm.get) if sm else None
            row.append(f"{best} {fnum(sm[best])}" if best else "–")
            for a in plugs:
                if best and med[a] is not None:
                    r = med[a] / sm[best]
                    net_summary.append((a, coll, b, r))
                    row.append(f"{r:.3f}")
                else:
                    row.append("–")
            for a in ([best] if best else []) + plugs:
                ds = by[a].get(k, []) if a else []
                row.append(fnum(statistics.median(d["busbw"] for d in ds)) if ds else "–")
            if not best:
                row.append("–")
            out.append("| " + " | ".join(row) + " |")
        out.append("")


def transports(work, out):
    out.append("| phase | jobs | via P2P | via NET | via SHM | network | net plugin | tuner plugin | NCCL nodes (ranks n, nodes, local ranks) | coll channels | graph types |")
    out.append("|---|---:|---:|---:|---:|---|---|---|---|---|---|")
    groups = collections.OrderedDict()
    for j in work.jobs:
        key = (j["phase"], j["arm"] if j["phase"] != "sweep" else ("default" if j["arm"] == "default" else "forced"))
        groups.setdefault(key, []).append(j)
    for (ph, arm), js in groups.items():
        def u(k):
            return ", ".join(sorted({j.get(k, "?") for j in js}))
        out.append(f"| {ph} {arm} | {len(js)} | {sum(int(j.get('via_p2p', 0)) for j in js)} | {sum(int(j.get('via_net', 0)) for j in js)} | "
                   f"{sum(int(j.get('via_shm', 0)) for j in js)} | {u('network')} | {u('netplugin')} | {u('tuner')} | {u('nodes')} | {u('coll_channels')} | {u('graph')} |")
    out.append("")


def plot(work, path, notes):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        notes.append(f"Plot skipped: matplotlib is not importable here ({e.__class__.__name__}: {e}).")
        return False
    colls = [c for c in COLL_ORDER if any(k[0] == c for (ph, _), by in work.results.items() for k in by)]
    if not colls:
        notes.append("Plot skipped: no results.")
        return False
    has_net = any(ph == "net" for (ph, _) in work.results)
    nrows = 3 if has_net else 2
    fig, axes = plt.subplots(nrows, len(colls), figsize=(5.2 * len(colls), 3.8 * nrows), squeeze=False)
    pts = sweep_points(work)
    for ci, coll in enumerate(colls):
        ax, axr = axes[0][ci], axes[1][ci]
        lib = work.results.get(("compare", "lib"), {})
        for ai, arm in enumerate(COMPARE_ARMS):
            by = work.results.get(("compare", arm), {})
            ks = sorted(k for k in by if k[0] == coll)
            if not ks:
                continue
            xs = [k[1] for k in ks]
            color = f"C{ai}"
            ax.plot(xs, [statistics.median(d["busbw"] for d in by[k]) for k in ks], marker="o", ms=3, color=color, label=arm)
            if arm == "nolib" and lib:  # what the library costs: lib / nolib
                kk = [k for k in ks if k in lib]
                axr.plot([k[1] for k in kk], [median_us(lib[k]) / median_us(by[k]) for k in kk], marker="o", ms=3,
                         color="C1", ls="--", label="lib / nolib")
            elif arm != "lib" and lib:
                kk = [k for k in ks if k in lib]
                axr.plot([k[1] for k in kk], [median_us(by[k]) / median_us(lib[k]) for k in kk], marker="o", ms=3,
                         color=color, label=f"{arm} / lib")
        sk = sorted(k for k in pts if k[0] == coll)
        bests = [(k[1], best_point(pts[k])) for k in sk]
        bests = [(b, p) for b, p in bests if p]
        if bests:
            n = bests[0][1]["d"]["ranks"]
            fac = 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n
            ax.plot([b for b, _ in bests], [b / p["us"] / 1e3 * fac for b, p in bests], ls="--", color="gray", label="sweep best")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{coll}: bus bandwidth")
        ax.set_xlabel("bytes")
        ax.set_ylabel("GB/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        axr.axhline(1.0, color="black", lw=0.8)
        axr.axhline(FLAG, color="red", lw=0.8, ls="--", label="1.01")
        axr.set_xscale("log", base=2)
        axr.set_title(f"{coll}: time ratios (above 1: slower)")
        axr.set_xlabel("bytes")
        axr.grid(True, which="both", alpha=0.3)
        axr.legend(fontsize=7)
        if has_net:
            axn = axes[2][ci]
            for (ph, arm), by in work.results.items():
                if ph != "net":
                    continue
                ks = sorted(k for k in by if k[0] == coll)
                if ks:
                    axn.plot([k[1] for k in ks], [statistics.median(d["busbw"] for d in by[k]) for k in ks], marker="o", ms=3,
                             ls="-" if not arm.startswith("sock") else ":", label=arm)
            axn.set_xscale("log", base=2)
            axn.set_yscale("log")
            axn.set_title(f"{coll}: net path ({work.meta.get('NET_RANKS', '?')} ranks), bus bandwidth")
            axn.set_xlabel("bytes")
            axn.set_ylabel("GB/s")
            axn.grid(True, which="both", alpha=0.3)
            axn.legend(fontsize=7)
    title = f"{work.meta.get('NAME', 'nvlink')}: {work.meta.get('RANKS', '?')} ranks"
    if work.mode() == "plumbing":
        title += " — PLUMBING TEST (MPS on one GPU, NET), NOT NVLINK"
    fig.suptitle(title, color="red" if work.mode() == "plumbing" else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def cmd_report(a):
    work = Work(a.work)
    m = work.meta
    name = m.get("NAME", "nvlink")
    plumbing = work.mode() == "plumbing"
    out, notes = [], []
    banner = (f"> **PLUMBING TEST — NOT NVLINK.** {m.get('NGPUS', '?')} GPU(s) for {m.get('RANKS', '?')} ranks: every rank ran on "
              f"GPU r mod {max(1, int(m.get('NGPUS', '1') or 1))} under MPS as its own NCCL host (NCCL_HOSTID), so NCCL moved every byte "
              "through NET (Socket for nolib, the plugin for the others), not over NVLink. These figures test the script "
              "end to end; they say nothing about NVLink, NCCL's NVLink choices or the policies there.")
    out.append(f"# NVLink case study: {name}\n")
    if plumbing:
        out.append(banner + "\n")
    gpus = [l[4:] for l in work.meta_lines if l.startswith("gpu ")]
    nccl = next((l for l in work.meta_lines if l.startswith("torch ")), "torch ? nccl ?")
    out.append(f"Machine: {m.get('NGPUS', '?')} × {gpus[0] if gpus else '?'}; {nccl}; "
               f"{next((l for l in work.meta_lines if l.startswith('commit ')), 'commit ?')}; "
               f"{next((l for l in work.meta_lines if l.startswith('lib ')), 'lib ?')}; "
               f"{next((l for l in work.meta_lines if l.startswith('date ')), '')}; "
               f"{next((l for l in work.meta_lines if l.startswith('total ')), 'total ? (stopped early?)')}.")
    out.append(f"Mode **{work.mode()}**: {m.get('RANKS', '?')} ranks, {m.get('NNODES', '?')} NCCL node(s), {m.get('RPG', '?')} rank(s) per GPU; "
               f"net phase {m.get('NET_RANKS', '?')} ranks, {m.get('NET_RPG', '?')} per GPU. Phases: {m.get('PHASES', '?')}. "
               f"Rounds {m.get('ROUNDS', '?')} (net {m.get('NET_ROUNDS', '?')}), TIME_PER_SIZE {m.get('TIME_PER_SIZE', '?')} s, "
               f"MAX_ITERS {m.get('MAX_ITERS', '?')}. NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 in every process.\n")
    topo = [l[5:] for l in work.meta_lines if l.startswith("topo ")]
    if topo:
        out.append("GPU links (`nvidia-smi topo -m`, first rows):\n\n```\n" + "\n".join(topo[:min(len(topo), 10)]) + "\n```\n")

    # --- checks and transports first: without them nothing below counts
    res_all = [d for by in work.results.values() for ds in by.values() for d in ds]
    checks = sum(d["checks"] for d in res_all)
    bad = sum(d["bad"] for d in res_all)
    failed = [j for j in work.jobs if j.get("rc") != "0"]
    out.append("## Verdicts\n")
    if plumbing:
        out.append("**Plumbing test: none of these verdicts is about NVLink.**\n")
    out.append(f"- Checks: {checks:,} results compared with the exact expected values on every rank, **{bad} wrong**"
               f"{'' if bad == 0 else ' — RESULTS ARE WRONG'}; {len(work.jobs)} jobs ran, {len(failed)} failed"
               f"{' (' + ', '.join(j['label'] + ' rc=' + j['rc'] for j in failed) + ')' if failed else ''}, "
               f"{len(work.skipped_jobs)} skipped.")
    nv = [j for j in work.jobs if j["phase"] in ("sweep", "compare")]
    if nv:
        net_used = sum(int(j.get("via_net", 0)) for j in nv)
        p2p_used = sum(int(j.get("via_p2p", 0)) for j in nv)
        if work.mode() == "nvlink":
            ok = net_used == 0 and p2p_used > 0
            out.append(f"- Transport (sweep, compare): {p2p_used} channel connections via P2P, {net_used} via NET"
                       f"{'' if ok else ' — NOT THE NVLINK SETTING'}; graph types seen: "
                       f"{', '.join(sorted({j.get('graph', '?') for j in nv}))} (NVL = NVLink).")
        else:
            out.append(f"- Transport (sweep, compare): {net_used} channel connections via NET, {p2p_used} via P2P (plumbing: NET expected).")
        libj = [j for j in nv if j["arm"] != "nolib"]
        out.append(f"- The library in the lib arms: net plugin {', '.join(sorted({j.get('netplugin', '?') for j in libj})) or '–'}, "
                   f"network {', '.join(sorted({j.get('network', '?') for j in libj})) or '–'}, tuner "
                   f"{', '.join(sorted({j.get('tuner', '?') for j in libj})) or '–'}; "
                   f"policy not loaded in {sum(1 for j in libj if j.get('policy_not_loaded', '0') != '0')} job(s).")
    flagged, gains, net_summary = [], [], []
    body = []
    body.append("## Compare: the arms against the default\n")
    body.append("Median time per call over the rounds (min–max of the rounds beside it); ratios of medians, "
                f"flagged (**bold** ⚠) above {FLAG}. `lib` (the library, no policy) is the default the policies must not fall "
                "behind; `lib / nolib` is what loading the library costs. Choices are what NCCL applied to the timed calls "
                "(its TUNING lines; `×n`: calls, when they differed). Times are nccl-tests' (calls back to back, one synchronize "
                "per pass, the slowest rank's); every arm runs with NCCL_DEBUG=INFO and TUNING, so rank 0 writes one log line "
                "per collective in every arm alike.\n")
    compare_tables(work, body, flagged, gains)

    def verdict(what, label):
        fl = [x for x in flagged if x[0] == what]
        gn = [x for x in gains if x[0] == what]
        rs = [x for x in flagged + gains if x[0] == what]
        by = work.results.get(("compare", label.split(" / ")[0]), {})
        if not by:
            return None
        s = f"- `{what}`: "
        if not fl:
            s += f"never above {FLAG} at any measured size"
        else:
            s += f"**above {FLAG} at {len(fl)} point(s)**: " + ", ".join(f"{c} {fmt_bytes(b)} {r:.3f}" for _, c, b, r in sorted(fl, key=lambda x: -x[3])[:8])
        if gn:
            s += "; faster by more than 1% at " + ", ".join(f"{c} {fmt_bytes(b)} {r:.3f}" for _, c, b, r in sorted(gn, key=lambda x: x[3])[:8])
        elif rs or by:
            s += "; no gain beyond 1%"
        return s + "."
    for what in ("lib / nolib", "rules / lib", "autotune / lib", "size_aware / lib", "rules / nolib", "autotune / nolib"):
        v = verdict(what, what)
        if v and plumbing and what == "lib / nolib":
            v += " (Plumbing: nolib moved the bytes with NCCL's Socket, lib with the plugin, so this compares transports, not the cost of loading the library.)"
        if v:
            out.append(v)
    lib_by = work.results.get(("compare", "lib"), {})
    spreads = [max(d["us"] for d in ds) / min(d["us"] for d in ds) for ds in lib_by.values() if len(ds) > 1]
    if spreads:
        out.append(f"- Noise: `lib` against itself over the rounds (max/min per point): median {statistics.median(spreads):.3f}, "
                   f"largest {max(spreads):.3f}, above 1.01 at {sum(1 for x in spreads if x > FLAG)} of {len(spreads)} points; "
                   "a ratio within that is not a difference.")
    if "autotune" in {a for (ph, a) in work.results if ph == "compare"}:
        out.append(f"  (net_autotune: K={m.get('AUTO_K', '?')}, D={m.get('AUTO_D', '?')}, settle up to {m.get('AUTO_SETTLE', '?')} calls and "
                   f"{m.get('AUTO_SETTLE_S', '?')} s a size; its size classes (4^k KiB) are per communicator, so sizes of one class share "
                   "one choice, and a size 4x larger in the same class can start a new exploration.)")
    body.append("## Net path between real GPUs\n")
    body.append(f"{m.get('NET_RANKS', '?')} ranks, {m.get('NET_RPG', '?')} per GPU, each its own NCCL host, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: "
                "every byte crosses NET. \"Best Socket\" is the fastest sock* arm at that size; a ratio below 1 is the plugin faster.\n")
    net_tables(work, body, net_summary)
    if net_summary:
        for arm in sorted({x[0] for x in net_summary}):
            xs = [x for x in net_summary if x[0] == arm]
            big = [x for x in xs if x[2] >= 4 << 20]
            lo, hi = min(xs, key=lambda x: x[3]), max(xs, key=lambda x: x[3])
            out.append(f"- Net path, `{arm}` / best Socket (time): {lo[3]:.3f} ({lo[1]} {fmt_bytes(lo[2])}) to {hi[3]:.3f} ({hi[1]} {fmt_bytes(hi[2])})"
                       + (f"; from 4 MiB {min(x[3] for x in big):.3f}–{max(x[3] for x in big):.3f}" if big else "") + ".")
    out.append("")
    out += body
    out.append("## Sweep: NCCL's choice and every alternative\n")
    out.append("One round. `default` is the library without policy (NCCL's own choice, read from its TUNING lines); each other "
               "column forces one choice through the `rules` policy; `n/a`: NCCL did not apply it (not usable here); "
               "`[Nch]`: the channels NCCL ran with a rule's count (capped at the communicator's).\n")
    sweep_tables(work, out)
    out.append("## The rules file of the `rules` arm\n")
    rf = os.path.join(work.w, "rules", "final.conf")
    src = next((l.split(" ", 1)[1] for l in work.meta_lines if l.startswith("rules_from ")), None)
    if os.path.exists(rf):
        if src == "sweep":
            out.append(f"From the sweep above, margin {m.get('RULE_MARGIN', '?')} (a rule only where the sweep's best beat "
                       "NCCL's default by that much; the evidence is in the comments):\n")
        else:
            out.append(f"Given (RULES={src}), not derived from this run's sweep:\n")
        out.append("```\n" + open(rf).read().rstrip() + "\n```\n")
        ck = rf + ".check"
        if os.path.exists(ck):
            out.append("`ncclbpf rules check`:\n\n```\n" + open(ck).read().rstrip()[-3000:] + "\n```\n")
    else:
        out.append("No rules file (no sweep, or the rules arm was not run).\n")
    out.append("## Jobs\n")
    out.append("| label | phase | rc | s | P2P | NET | SHM | network | tuner | nodes | channels | rules | done | init s |")
    out.append("|---|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---|---:|")
    for j in work.jobs:
        out.append(f"| {j['label']} | {j['phase']} | {j['rc']} | {j['seconds']} | {j.get('via_p2p')} | {j.get('via_net')} | {j.get('via_shm')} | "
                   f"{j.get('network')} | {j.get('tuner')} | {j.get('nodes')} | {j.get('coll_channels')} | {j.get('rules')} | {j.get('done')} | {j.get('init')} |")
    for j in work.skipped_jobs:
        out.append(f"| {j.get('label')} | {j.get('phase')} | skipped: {j.get('reason')} {j.get('left', '')} {j.get('expected', '')} | | | | | | | | | | | |")
    out.append("")
    out.append("Transports and NCCL's view, per kind of job:\n")
    transports(work, out)
    if work.skips:
        out.append("## Sizes skipped\n")
        by = collections.defaultdict(list)
        for s in work.skips:
            by[(s.get("reason"), s.get("coll"))].append(s)
        for (reason, coll), ss in sorted(by.items()):
            sizes = sorted({int(s["size"]) for s in ss})
            out.append(f"- {coll}, {reason}: " + ", ".join(fmt_bytes(x) for x in sizes)
                       + (f" (need/free, one job: {ss[0].get('need')}/{ss[0].get('free')} B, {ss[0].get('ranks_per_gpu')} rank(s) per GPU)" if reason == "memory" else ""))
        out.append("")
    out.append("## Algorithms NCCL offers here (NCCL 2.28.9 source, src/graph/tuning.cc)\n")
    out.append("- all_reduce: Ring and Tree, each with LL, LL128, Simple; NVLS and NVLSTree need NVLink multicast (off by rule); "
               "CollNet needs a CollNet plugin (none). On one node Tree is a chain inside the node.\n"
               "- all_gather, reduce_scatter: Ring (LL, LL128, Simple); PAT (Simple only) only with one rank per node "
               "(`ncclPatEnable`: nNodes == nRanks), so not on 8 GPUs of one node — but in the plumbing test (every rank its own "
               "host) it is on; NVLS and CollNetDirect as above.\n"
               "- LL128 is on by default on Hopper only for paths up to PXN and NVLink inside (`typeInter <= PATH_PXN`, "
               "`typeIntra <= PATH_NVB`): over NVLink yes, over NET (the plumbing test, the net phase) no, and a tuner cannot "
               "turn a disabled entry on, so LL128 points there show `n/a`.\n"
               "- NCCL_PAT_ENABLE=1 would skip PAT's one-rank-per-node check, but NCCL says PAT supports one GPU per node "
               "only; the sweep does not force it (ALGOS=PAT on one node shows `n/a`).\n")
    pngname = os.path.basename(a.png) if a.png else None
    try:
        plotted = bool(a.png) and plot(work, a.png, notes)
    except Exception as e:  # a plot must never cost the report (e.g. no positive data to log-scale)
        plotted = False
        notes.append(f"No plot: {type(e).__name__}: {e}")
    if plotted:
        out.append(f"## Plot\n\n![{name}]({pngname})\n")
    for n_ in notes:
        out.append(f"{n_}\n")
    if plumbing:
        out.append(banner + "\n")
    text = "\n".join(out) + "\n"
    if a.md:
        open(a.md, "w").write(text)
    else:
        sys.stdout.write(text)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rle")
    p.add_argument("log")
    p = sub.add_parser("rules")
    p.add_argument("work")
    p.add_argument("--out", required=True)
    p.add_argument("--channels", type=int)
    p.add_argument("--margin", type=float, default=0.03)
    p.add_argument("--nnodes", type=int, default=-1)
    p.add_argument("--nranks", type=int, default=-1)
    p = sub.add_parser("report")
    p.add_argument("work")
    p.add_argument("--md")
    p.add_argument("--png")
    a = ap.parse_args()
    if a.cmd == "rle":
        for (func, b, algo, proto, lo, hi), n in rle(a.log):
            print(func, b, algo, proto, lo, hi, n)
        return 0
    if a.cmd == "rules":
        return cmd_rules(a)
    return cmd_report(a)


if __name__ == "__main__":
    sys.exit(main())
