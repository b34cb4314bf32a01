"""Report of bench/gpu/autotune.sh: tables (summary.md) and the convergence plot (convergence.png).

Usage: autotune_report.py WORKDIR OUTDIR          writes OUTDIR/summary.md, OUTDIR/convergence.png
       autotune_report.py --best WORKDIR N BYTES  prints the static candidate with the lowest time
                                                  at BYTES for N ranks (0 if none measured)

WORKDIR holds what autotune.sh left there: meta.txt, runs.txt, per job LABEL-nN.trace (rank 0's
times, see autotune.py), LABEL-nN-rR.log (each rank's output and NCCL log), LABEL-nN-rR.rc and,
for the held jobs, LABEL-nN-cli.txt. NCCL 2.28 logs one TUNING line per collective on rank 0
("AllReduce: B Bytes -> Algo A proto P channel{Lo..Hi}={l..h}"): line k is what was applied to
the k-th all_reduce, which is the trace's seq k (autotune.py issues nothing else).
Uses matplotlib when it is there, else draws the same plot without text with its own PNG writer.
"""
import collections
import glob
import math
import os
import re
import statistics
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autotune_ab  # noqa: E402

CANDS = ["NCCL's choice", "Ring/Simple", "Ring/LL", "Ring/LL128", "Tree/Simple", "Tree/LL", "Tree/LL128", "Ring/Simple 2ch"]
NCAND = len(CANDS)
TUNING = re.compile(r"AllReduce: (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
DIGEST = re.compile(r"decision digest of comm (0x[0-9a-f]+): seq (\d+), digest (0x[0-9a-f]+)(.*)")
# NCCL_BPF_AGREEMENT_LOG=1's line: epoch, every rank's time (µs), changed state words.
# An applied epoch's line (NCCL_BPF_AGREEMENT_LOG=1): 1 the epoch, 2 the ranks' wall times, 3 the
# state words changed; since stop 28 the ranks' net busy times come before the state (BUSY).
EPOCH = re.compile(r"epoch (\d+) applied: rank times \(us\) ([\d. ]+); (?:net busy \(us\) [\d. ]+; )?state (.*)")
BUSY = re.compile(r"; net busy \(us\) ([\d. ]+);")
STATE_WORD = re.compile(r"\[(\d+)\]=0x([0-9a-f]+)")
AGREE = re.compile(r"(agreement of comm 0x[0-9a-f]+: .*)")
DONE = re.compile(r"^DONE rank=(\d+) label=\S+ checks=(\d+) bad=(\d+)")
FLOOD = re.compile(r"^FLOOD pairs=(\d+) seconds=([\d.]+) bytes=(\d+) gibps=([\d.]+)")
TOL = 1.05
# Jobs of net_autotune: (label suffix, what it is). "ll128": NCCL_PROTO=LL,LL128,Simple, so that
# NCCL lets a tuner choose LL128 (off by default here: candidates 3 and 6 are then NCCL's choice).
VARIANTS = [("", "net_autotune"), ("ll128", "net_autotune, LL128 enabled")]
AUTO_LABELS = [p + s for s, _ in VARIANTS for p in ("auto", "autodec")]


def size_class(b):
    """net_autotune's size class of a message of b bytes (policies/src/net_autotune.c)."""
    for k, lim in enumerate((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)):
        if b < lim:
            return k
    return 7


def fmt_bytes(b):
    b = int(b)
    for unit, s in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {s}"
    return f"{b} B"


def median(v):
    return statistics.median(v) if v else float("nan")


def fnum(v, nd=1):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


class Run:
    """One job: LABEL for N ranks."""

    def __init__(self, w, label, n):
        self.label, self.n = label, n
        self.rows = []  # (seq_first, seq_last, phase_index, phase_name, bytes, us, flood)
        path = f"{w}/{label}-n{n}.trace"
        if os.path.exists(path):
            for line in open(path):
                p = line.split()
                if len(p) == 7:
                    self.rows.append((int(p[0]), int(p[1]), int(p[2]), p[3], int(p[4]), float(p[5]), int(p[6])))
        self.logs = {}
        for r in range(n):
            lp = f"{w}/{label}-n{n}-r{r}.log"
            self.logs[r] = open(lp, errors="replace").read().splitlines() if os.path.exists(lp) else []
        self.rc = {}
        for r in range(n):
            rp = f"{w}/{label}-n{n}-r{r}.rc"
            self.rc[r] = open(rp).read().strip() if os.path.exists(rp) else "?"
        self.state = {}  # class -> dict, from `ncclbpf maps PID --map autotune_state --json` (rank 0, holding)
        sp = f"{w}/{label}-n{n}-state.json"
        if os.path.exists(sp):
            try:
                import json
                doc = json.load(open(sp))
                for m in doc.get("maps", []):
                    if m.get("name") != "autotune_state":
                        continue
                    for e in m.get("entries", []):
                        k, v = e["key_words"][0], e["value_words"]
                        ctl = v[1]
                        self.state[k] = dict(apply=v[0], phase=ctl & 0xFF, idx=(ctl >> 8) & 0xFF, seen=(ctl >> 16) & 0xFF,
                                             best=(ctl >> 24) & 0xFF, drift=(ctl >> 32) & 0xFF, rounds=(ctl >> 40) & 0xFF,
                                             time_ns=v[2], net_bytes=v[3])
            except Exception as e:  # keep the rest of the report
                self.state = {"error": str(e)}
        cp = f"{w}/{label}-n{n}-cli.txt"
        self.cli = open(cp, errors="replace").read() if os.path.exists(cp) else ""
        # NCCL's applied choices, by seq (1-based).
        tun = [(int(m.group(1)), m.group(2), m.group(3), int(m.group(5)) - int(m.group(4)) + 1)
               for m in (TUNING.search(l) for l in self.logs.get(0, [])) if m]
        self.tuning_lines = len(tun)
        seq_bytes = []
        for sf, sl, _, _, b, _, _ in self.rows:
            seq_bytes += [b] * (sl - sf + 1)
        self.choice = {}
        self.skipped = 0
        j = 0
        for s, b in enumerate(seq_bytes, 1):
            while j < len(tun) and tun[j][0] != b:
                j += 1
                self.skipped += 1
            if j < len(tun):
                self.choice[s] = f"{tun[j][1]}/{tun[j][2]}/{tun[j][3]}ch"
                j += 1
        # Epochs at whose application a class entered a duel (NCCL_BPF_AGREEMENT_LOG=1, rank 0):
        # the ctl word of class c is state word 4 c + 1, its phase the low byte (4: duel).
        self.duel_starts = []
        # Per applied epoch, every class's ctl word after it: [(epoch, {class: ctl})].
        self.ctl_after = []
        words = {}
        # Applied epochs, and those where every rank had a net busy time (what net_autotune times
        # an epoch by, unless autotune_timing asks for another time).
        self.epochs = self.busy_epochs = 0
        for l in self.logs.get(0, []):
            m = EPOCH.search(l)
            if not m:
                continue
            self.epochs += 1
            b = BUSY.search(l)
            if b and all(float(x) > 0 for x in b.group(1).split()):
                self.busy_epochs += 1
            for w in STATE_WORD.finditer(m.group(3)):
                i, v = int(w.group(1)), int(w.group(2), 16)
                if i % 4 == 1 and v & 0xFF == 4 and words.get(i, 0) & 0xFF != 4:
                    self.duel_starts.append(int(m.group(1)))
                words[i] = v
            self.ctl_after.append((int(m.group(1)), {i // 4: v for i, v in words.items() if i % 4 == 1}))
        self.digests = {}
        self.agreements = {}
        self.done = {}
        self.flood = []
        for r, lines in self.logs.items():
            for l in lines:
                m = DIGEST.search(l)
                if m:
                    self.digests.setdefault(r, []).append((m.group(1), int(m.group(2)), m.group(3), m.group(4).strip()))
                m = AGREE.search(l)
                if m:
                    self.agreements.setdefault(r, []).append(m.group(1))
                m = DONE.search(l)
                if m:
                    self.done[r] = (int(m.group(2)), int(m.group(3)))
                m = FLOOD.search(l)
                if m and r == 0:
                    self.flood.append((int(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))))

    def phases(self):
        """phase index -> (name, bytes, rows)"""
        out = collections.OrderedDict()
        for row in self.rows:
            out.setdefault(row[2], (row[3], row[4], []))[2].append(row)
        return out

    def row_choice(self, row):
        cs = {self.choice.get(s, "?") for s in range(row[0], row[1] + 1)}
        return cs.pop() if len(cs) == 1 else "mixed"

    def ok(self):
        return all(v == "0" for v in self.rc.values()) and len(self.done) == self.n and all(b == 0 for _, b in self.done.values())


def split_label(label):
    """'static3_r2' -> ('static3', 2); a label without a round suffix is round 1."""
    m = re.fullmatch(r"(.+?)_r(\d+)", label)
    return (m.group(1), int(m.group(2))) if m else (label, 1)


def load(w):
    meta = {}
    if os.path.exists(f"{w}/meta.txt"):
        for line in open(f"{w}/meta.txt"):
            for kv in line.split():
                if "=" in kv:
                    k, v = kv.split("=", 1)
                    meta.setdefault(k, v)
    runs = {}
    for path in sorted(glob.glob(f"{w}/*-n*-r0.log")):
        m = re.match(r"(.+)-n(\d+)-r0\.log$", os.path.basename(path))
        if m:
            runs[(m.group(1), int(m.group(2)))] = Run(w, m.group(1), int(m.group(2)))
    return meta, runs


def window(rows, frac=None, last=None):
    if last is not None:
        return rows[-last:] if len(rows) > last else rows[len(rows) // 3:]
    k = max(1, int(math.ceil(len(rows) * frac)))
    return rows[-k:]


def static_table(runs, meta):
    """(n, key) -> {cand: [(round, median us, applied choice, ok), ...]}; key is bytes or 'decode'."""
    frac = float(meta.get("SWEEP_FRACTION", "0.6"))
    t = collections.defaultdict(lambda: collections.defaultdict(list))
    for (label, n), run in runs.items():
        base, rnd = split_label(label)
        m = re.fullmatch(r"static(\d)", base)
        if not m:
            continue
        c = int(m.group(1))
        for _, (name, b, rows) in run.phases().items():
            key = "decode" if name.startswith("decode") else b
            win = window(rows, frac=frac)
            chs = collections.Counter(run.row_choice(r) for r in win)
            t[(n, key)][c].append((rnd, median([r[5] for r in win]), chs.most_common(1)[0][0] if chs else "?", run.ok()))
    return t


def agg(samples):
    """The median over rounds of each round's median."""
    return median([s[1] for s in samples])


def best_of(entry, allowed=None):
    """(candidate, time over rounds, applied choice) of the fastest candidate whose every run was right."""
    good = {c: v for c, v in entry.items() if v and all(s[3] for s in v) and not math.isnan(agg(v))
            and (allowed is None or c in allowed)}
    if not good:
        return None
    c = min(good, key=lambda k: agg(good[k]))
    return c, agg(good[c]), good[c][0][2]


def choice_time(st, n, key, choice, allowed):
    """The best static time (over rounds) among the allowed candidates that NCCL applied as `choice`."""
    ts = [agg(v) for c, v in st.get((n, key), {}).items() if v and c in allowed and v[0][2] == choice and all(s[3] for s in v)]
    return min(ts) if ts else float("nan")


SETTLED_PHASES = (2, 3)  # net_autotune's settled and probing phases


def duel_rule(span, pairs):
    """The duel's rule, as the run's policy had it (meta.txt: DUEL_SPAN since stop 28, DUEL
    pairs before)."""
    if not span:
        return ""
    if pairs:
        return (f"; a candidate within 1/4 of the best so far duels with it, pairs of alternating epochs until one side "
                f"leads by 4 (at most {span // 2} pairs, {span} + D epochs; runs before the sequential duel: exactly {span // 2} pairs)")
    return (f"; a candidate within 1/4 of the best so far duels with it, alternating epochs, every two adjacent ones a "
            f"comparison, until one side leads by 6 (at most {span - 1} comparisons, {span} + D epochs)")


def settled_from(run, rows, k, D, near=None):
    """From net_autotune's own state (the epoch log, rank 0): the first row of the phase
    (1-based; tokens for decode) from which its class stays settled (probes included: they
    alternate the applied choice now and then but keep what is kept) on one kept candidate to
    the phase's end; None when it is not settled at the end or there is no epoch log. An epoch
    e's state applies from collective (e + D) k + 1. near: the applied choices that count as
    converged (any kept candidate NCCL applies as one of them); default: the last kept one's."""
    if not run.ctl_after or not rows:
        return None
    c = size_class(rows[0][4])
    lo, hi = rows[0][0], rows[-1][1]
    eps = [(e, ctl.get(c)) for e, ctl in run.ctl_after if lo <= (e + D) * k + 1 <= hi]
    before = [ctl.get(c) for e, ctl in run.ctl_after if (e + D) * k + 1 < lo]
    if not eps or eps[-1][1] is None or eps[-1][1] & 0xFF not in SETTLED_PHASES:
        return None
    # Two candidates that NCCL applies as the same choice (Ring/Simple on 2 channels where the
    # communicator has 2) are one choice: the kept candidate passing from one to the other (a
    # probe won by a hair) changes nothing that runs. A candidate's applied choice: the most
    # common of NCCL's applied choices at the first collective of its settled epochs.
    # Only collectives of the policy's own phases of this class count (not pinned blocks, not
    # other sizes' phases, during which the class stays settled too).
    own = set()
    for name, b, prs in run.phases().values():
        if re.match(r"(size|fsize|decode)\d", name) and size_class(b) == c:
            for r in prs:
                own.update(range(r[0], r[1] + 1))
    applied = collections.defaultdict(collections.Counter)
    for e, ctl in run.ctl_after:
        s = (e + D) * k + 1
        if ctl.get(c) is not None and ctl[c] & 0xFF == 2 and s in own:
            ch = run.choice.get(s)
            if ch:
                applied[(ctl[c] >> 24) & 0xFF][ch] += 1
    name = lambda cand: applied[cand].most_common(1)[0][0] if applied[cand] else cand
    kept = name((eps[-1][1] >> 24) & 0xFF)
    good = set(near) if near else {kept}
    if kept not in good:
        return None
    ok = lambda ctl: ctl is not None and ctl & 0xFF in SETTLED_PHASES and name((ctl >> 24) & 0xFF) in good
    i = len(eps) - 1
    while i > 0 and ok(eps[i - 1][1]):
        i -= 1
    if i == 0 and before and ok(before[-1]):
        return 1  # settled before the phase began
    seq = (eps[i][0] + D) * k + 1
    for j, r in enumerate(rows, 1):
        if r[1] >= seq:
            return j
    return None


def settle(run, rows, probe=0, last=None):
    """(the kept choice, index in the phase (1-based) from which it is kept): the choice most
    applied over the last `last` rows (at least 4 `probe`; default: the last row's), and the
    first row of its run from which it is kept to the end but for probes: runs of another choice
    at most `probe` rows long (net_autotune: D + 3 epochs) between runs of the kept choice of at
    least 2 `probe` rows (the one after may be shorter where the phase ends). 0: it stays to the
    end."""
    chs = [run.row_choice(r) for r in rows]
    if not chs:
        return "?", None
    tail = chs[-max(last or 1, 4 * probe):]
    kept = collections.Counter(tail).most_common(1)[0][0]
    rs = changes(chs)
    i, start = len(rs) - 1, len(chs)
    while i >= 0:
        c, k = rs[i]
        after_ok = i == len(rs) - 1 or (rs[i + 1][0] == kept and (rs[i + 1][1] >= 2 * probe or i + 1 == len(rs) - 1))
        probe_run = probe and k <= probe and i > 0 and rs[i - 1][0] == kept and rs[i - 1][1] >= 2 * probe and after_ok
        if c != kept and not probe_run:
            break
        start -= k
        i -= 1
    return kept, start + 1


ISWEEP = re.compile(r"isweep\d+_(\d+)_c(\d)$")


def isweep_table(run, frac):
    """The static sweep inside an auto job (autotune.py isweep phases): bytes -> {candidate:
    [(median µs of the last `frac` of one block, applied choice), ...]}, blocks in run order."""
    blocks = collections.OrderedDict()
    for row in run.rows:
        m = ISWEEP.match(row[3])
        if m:
            blocks.setdefault((row[2], int(m.group(1)), int(m.group(2))), []).append(row)
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for (_, b, c), rows in blocks.items():
        win = window(rows, frac=frac)
        chs = collections.Counter(run.row_choice(r) for r in win)
        out[b][c].append((median([r[5] for r in win]), chs.most_common(1)[0][0] if chs else "?"))
    return out


def changes(chs):
    runs = []
    for c in chs:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    return runs


def runs_str(rs, limit=12):
    s = ", ".join(f"{c} ×{k}" for c, k in rs[:limit])
    return s + (f", … ({len(rs) - limit} more)" if len(rs) > limit else "")


def in_process(run, rows, conv, discard, settled_win):
    """What the job itself measured per applied choice while exploring (rows before `conv`, the
    first `discard` rows of every run of one choice left out) and the settled window: the
    fastest choice and its median, and the settled window's median."""
    chs = [run.row_choice(r) for r in rows]
    per = collections.defaultdict(list)
    i = 0
    for c, k in changes(chs[:max(0, (conv or 1) - 1)]):
        per[c] += [r[5] for r in rows[i + discard:i + k]]
        i += k
    meds = {c: median(v) for c, v in per.items() if v}
    if settled_win:
        sc = run.row_choice(settled_win[-1])
        meds[sc + " (settled)"] = median([r[5] for r in settled_win])
    if not meds:
        return None
    best = min(meds, key=meds.get)
    return best, meds[best], meds


def contention(run, rows, measure=256):
    parts = {"before": [], "during": [], "after": []}
    seen = False
    for r in rows:
        if r[6]:
            parts["during"].append(r)
            seen = True
        else:
            parts["after" if seen else "before"].append(r)
    out = {}
    for k, rs in parts.items():
        chs = [run.row_choice(r) for r in rs]
        half = rs[-measure:] if len(rs) >= 2 * measure else rs[len(rs) // 2:]
        out[k] = dict(n=len(rs), med=median([r[5] for r in rs]), settled=median([r[5] for r in half]),
                      runs=changes(chs), last=chs[-1] if chs else "?")
    return out


def rounds_of(runs, base, n):
    return sorted((split_label(l)[1], r) for (l, nn), r in runs.items() if nn == n and split_label(l)[0] == base)


def fl(vals, nd=1):
    return " / ".join(fnum(v, nd) for v in vals)


def report(w, outdir):
    meta, runs = load(w)
    K, D, KDEC = int(meta.get("K", 32)), int(meta.get("D", 2)), int(meta.get("KDEC", 160))
    measure, mtok = int(meta.get("MEASURE", 256)), int(meta.get("MEASURE_TOKENS", 12))
    # net_autotune learns from LEARN epochs per candidate (4 since the median of three: one
    # discarded, three measured; 3 from commit 88a60e5 to it; 2 before). An epoch's figures
    # reach the epoch program D - 1 epochs after it ends (the agreement's delay), and the next
    # candidate is applied from the epoch after that, so each candidate runs D + LEARN - 1
    # epochs (a candidate that runs as NCCL's own choice, skipped, only D). A class new at an
    # epoch boundary settles by collective 8 (D + LEARN - 1) K + 1 of its phase; the first phase
    # of a communicator waits 2 D epochs more (no opinion before the first agreement whose
    # records all name the members, 2 D K + 1); one epoch more when a phase does not start at an
    # epoch boundary. meta.txt of runs before LEARN was written lacks it: those ran the older
    # policy.
    learn = int(meta.get("LEARN", 2))
    cyc = D + learn - 1
    # A duel of at most DUEL_SPAN epochs of comparisons per candidate that explored within 1/4
    # of the best so far: DUEL_SPAN + D epochs more each at most, the choice alternating (runs
    # before stop 28 wrote DUEL, pairs: 2 DUEL epochs). How many a phase had comes from the
    # job's epoch log (NCCL_BPF_AGREEMENT_LOG=1; runs before DUEL was written had none); the
    # stated bound without duels, and the one of a phase with its duels.
    span = int(meta.get("DUEL_SPAN", 2 * int(meta.get("DUEL", 0))))
    pairs = "DUEL_SPAN" not in meta
    duel_ep = span + D if span else 0
    bound = (NCAND * cyc + 2 * D + 1) * K
    bound_tok = NCAND * cyc + 2 * D + 1

    def converged(run, rows, dec, near=None):
        """(the kept choice, the row from which it is kept): the choice from NCCL's applied
        choices (settle), the row from net_autotune's own state where the job logged its epochs
        (its probes then count as settled: since the probes became duels they alternate the
        choice for up to DUEL_SPAN epochs), else from the applied choices too."""
        ch, conv = settle(run, rows, probe=cyc if dec else cyc * K, last=mtok if dec else measure)
        if run.ctl_after:
            conv = settled_from(run, rows, KDEC if dec else K, D, near)
        return ch, conv

    def bound_of(run, rows, dec):
        k = KDEC if dec else K
        lo, hi = rows[0][0], rows[-1][1]
        d = sum(1 for e in run.duel_starts if lo <= (e + D) * k + 1 <= hi)
        return (bound_tok + d * duel_ep) if dec else bound + d * duel_ep * K, d
    st = static_table(runs, meta)
    ranks = sorted({n for _, n in runs})
    nrounds = max([split_label(l)[1] for l, _ in runs] or [1])
    reach = [0, 1, 2, 4, 5, 7]  # what a tuner can apply here by default (LL128 is off)
    L = []
    P = L.append
    P("# net_autotune on real NCCL: convergence, decode pattern, loopback contention\n")
    P("Made by `bench/gpu/autotune.sh` (report: `bench/gpu/autotune_report.py`); "
      f"{nrounds} round(s) of the jobs, alternated.\n")
    if os.path.exists(f"{w}/meta.txt"):
        P("```\n" + open(f"{w}/meta.txt").read().strip() + "\n```\n")
    # What timed the net_autotune jobs' epochs (the script leaves autotune_timing at 0): the
    # slowest rank's net busy time in epochs where every rank had one, wall time in the others.
    prof = [f"{l}-n{nn} net busy time in {r.busy_epochs} of {r.epochs} applied epochs, wall time in the rest"
            for (l, nn), r in sorted(runs.items()) if split_label(l)[0] in AUTO_LABELS]
    if prof:
        P("Epochs timed by: " + "; ".join(prof) + ".\n")
    P("Candidates: " + ", ".join(f"{i} {c}" for i, c in enumerate(CANDS)) + ". Static runs force them with NCCL_ALGO/NCCL_PROTO "
      "(7: also NCCL_MAX_NCHANNELS=2), the plugin as net and tuner plugin, no tuner policy. Times are medians of the "
      "python-side time of one synchronized all_reduce (µs) or of one token (ms); windows: the last "
      f"{meta.get('SWEEP_FRACTION', '0.6')} of each static phase, the last {measure} all_reduces of each net_autotune size phase, the last "
      f"{mtok} tokens of its decode phase; with several rounds, a figure is the median of the rounds' medians (each round listed after it). "
      "Choices are NCCL's TUNING lines of rank 0 (algo/proto/channels applied). "
      "'Best static' is the fastest of the candidates a tuner can apply here (0, 1, 2, 4, 5, 7; LL128 is off in NCCL here unless NCCL_PROTO "
      "names it, so net_autotune's candidates 3 and 6 run NCCL's choice) whose runs were all right; the fastest including LL128 is shown beside it. "
      f"Convergence: the first collective of the phase from which NCCL's applied choice stays the same to the phase's end; stated bound "
      f"({NCAND}·(D + {learn - 1}) + 2·D + 1{f' + d·({span} + D)' if span else ''})·K = {bound}{f' + d·{duel_ep * K}' if span else ''} collectives ({bound_tok}{f' + d·{duel_ep}' if span else ''} tokens for decode){', d the duels the phase had (from the epoch log)' if span else ''}: each candidate runs D + {learn - 1} epochs "
      f"({learn} learnt from: {'one discarded, the median of three measured' if learn == 4 else 'one discarded, the mean of two measured' if learn == 3 else 'one discarded, one measured' if learn == 2 else 'see LEARN'}; "
      f"D - 1 more while the last one's figures are agreed; one that runs as NCCL's own choice is skipped after D); the first phase also waits 2·D epochs for the first opinion"
      f"{duel_rule(span, pairs)}. "
      f"'In-process': what the same job measured per applied choice while exploring (first epoch of each run left out) against its settled window. "
      f"Pass (by choice): in every round, the static time of the choice net_autotune settled on (the best static time among the candidates NCCL "
      f"applied as that choice) ≤ {TOL:.2f} × the best static time, converged within the bound, the choice constant over the window. "
      f"The times measured in the net_autotune jobs are set against the best static time too ('measured time'), but those are separate "
      f"processes: on this machine one setting differs by tens of percent from one process to the next (see the noop + agreement table).\n")
    verdicts = []
    sizes_rows, dec_rows, cont_rows, inproc_rows, isweep_rows = [], [], [], [], []
    sweep_frac = float(meta.get("SWEEP_FRACTION", "0.6"))
    for n, (sfx, who) in [(n, v) for n in ranks for v in VARIANTS]:
        V = lambda text: f"{text}{' [' + who + ']' if sfx else ''}"
        allowed = reach if not sfx else list(range(NCAND))
        autos = rounds_of(runs, "auto" + sfx, n)
        sizes = []
        for _, run in autos:
            for name, b, _ in run.phases().values():
                if name.startswith("size") and b not in sizes:
                    sizes.append(b)
        for b in sizes:
            per = []  # per round: (choice, time, conv, constant over window, in-process)
            for rnd, run in autos:
                for name, bb, rows in run.phases().values():
                    if name.startswith("size") and bb == b:
                        win = window(rows, last=measure)
                        ch, conv = converged(run, rows, False)
                        const = conv is not None and conv <= len(rows) - len(win) + 1
                        ip = in_process(run, rows, conv, K, win)
                        per.append((rnd, ch, median([r[5] for r in win]), conv, const, ip, bound_of(run, rows, False)[0]))
                        # The same job's own static sweep (isweep phases), if it ran one.
                        sw = isweep_table(run, sweep_frac).get(b)
                        if sw:
                            kept_t = median([r[5] for r in win if run.row_choice(r) == ch])
                            cand_t = {c: median([x[0] for x in v]) for c, v in sw.items()}
                            bc = min(cand_t, key=cand_t.get)
                            wt = median([r[5] for r in win])
                            applied = {c: sorted({x[1] for x in v}) for c, v in sw.items()}
                            isweep_rows.append((n, b, who, rnd, ch, kept_t, wt, bc, cand_t, applied, conv))
                            verdicts.append((V(f"{n} ranks, {fmt_bytes(b)}, round {rnd}: net_autotune's last {len(win)} all_reduces {fnum(wt)} µs "
                                               f"(its choice {ch} alone {fnum(kept_t)}) vs the best of the same job's static sweep, "
                                               f"{bc} {CANDS[bc]} {fnum(cand_t[bc])} µs: ratio {fnum(wt / cand_t[bc], 3)}; converged at {conv} (bound {bound})"),
                                             wt <= TOL * cand_t[bc] and const and conv is not None and conv <= bound, sfx))
            if not per:
                continue
            best = best_of(st.get((n, b), {}), allowed)
            best_all = best_of(st.get((n, b), {}))
            dflt = st.get((n, b), {}).get(0)
            t = median([p[2] for p in per])
            ratio = t / best[1] if best else float("nan")
            convs = [p[3] or 10**9 for p in per]
            conv_ok = all(c <= p[6] and p[4] for c, p in zip(convs, per))
            bounds = ", ".join(str(p[6]) for p in per)
            cr = [choice_time(st, n, b, p[1], allowed) / best[1] if best else float("nan") for p in per]
            if st:
                verdicts.append((V(f"{n} ranks, {fmt_bytes(b)}: settled choice {', '.join(sorted({p[1] for p in per}))}, its static time / best static "
                                   f"{fl(cr, 3)}; converged at {', '.join(str(c) for c in convs)} (bound {bounds}) [static jobs: separate processes]"),
                                 conv_ok and all(x <= TOL for x in cr), "xproc" + sfx))
            if st:
                verdicts.append((V(f"{n} ranks, {fmt_bytes(b)}: time measured in the net_autotune job {fnum(t)} µs vs best static {fnum(best[1]) if best else '?'} "
                                   f"(ratio {fnum(ratio, 3)}; separate processes)"), ratio <= TOL, sfx + "time"))
            okk = conv_ok and all(x <= TOL for x in cr)
            same = [agg(v) for c, v in st.get((n, b), {}).items() if v and v[0][2] == per[-1][1] and c in allowed]
            sizes_rows.append(
                f"| {n} | {fmt_bytes(b)} | {who} | {best[0] if best else '?'} {CANDS[best[0]] if best else ''} → {best[2] if best else '?'} | "
                f"{fnum(best[1]) if best else 'n/a'} ({fl([s[1] for s in st[(n, b)][best[0]]]) if best else ''}) | "
                f"{(str(best_all[0]) + ' ' + CANDS[best_all[0]] + ': ' + fnum(best_all[1])) if best_all and (not best or best_all[0] != best[0]) else 'same'} | "
                f"{fnum(agg(dflt)) if dflt else 'n/a'} | {', '.join(sorted({p[1] for p in per}))} | {fnum(t)} ({fl([p[2] for p in per])}) | "
                f"{fnum(min(same)) if same else 'n/a'} | {fl(cr, 3)} | {fnum(ratio, 3)} ({fl([p[2] / best[1] for p in per], 3) if best else ''}) | "
                f"{', '.join(str(p[3]) for p in per)} (bound {bounds}) | {('yes' if okk else 'NO') if st else 'n/a (no static jobs)'} |")
            for rnd, ch, tt, conv, const, ip, _ in per:
                if ip:
                    others = ", ".join(f"{c} {fnum(v)}" for c, v in sorted(ip[2].items(), key=lambda kv: kv[1]))
                    inproc_rows.append(f"| {n} | {fmt_bytes(b)} | {who} | {rnd} | {ip[0]} {fnum(ip[1])} | {ch} {fnum(tt)} | {fnum(tt / ip[1], 3)} | {others} |")
        for rnd, run in autos:
            for name, b, rows in run.phases().values():
                if not name.startswith("contend"):
                    continue
                c = contention(run, rows, measure)
                flood = run.flood[0] if run.flood else None
                rec = c["after"]["settled"] <= TOL * c["before"]["settled"]
                rounds = run.state.get(size_class(b), {}).get("rounds") if "error" not in run.state else None
                # Explored again during the flood: three or more choices ran (a probe adds one).
                # Not from the state map: with the sweep's communicators in the job, the map shows
                # whichever communicator's view was installed last.
                adapted = len({ch for ch, _ in c["during"]["runs"]}) >= 3
                # net_autotune explores again when its choice runs 3/2 of its reference for three
                # epochs: a flood that never slows it that much leaves nothing to adapt to.
                hurt = c["during"]["med"] / c["before"]["settled"]
                verdicts.append((V(f"{n} ranks, round {rnd}, flood at {fmt_bytes(b)}: during / before {fnum(hurt, 3)}, explorations of its class "
                                   f"{rounds if rounds is not None else '?'} by the state map, {'re-explored' if adapted else 'not re-explored'} by the choices that ran (needed when during / before > 1.5), "
                                   f"after / before (settled) {fnum(c['after']['settled'] / c['before']['settled'], 3)} ≤ {TOL:.2f}"),
                                 (adapted or hurt <= 1.5) and rec, sfx))
                cont_rows.append((n, b, who, rnd, c, flood, rounds))
        decs = rounds_of(runs, "autodec" + sfx, n)
        per = []
        for rnd, run in decs:
            for name, b, rows in run.phases().values():
                win = window(rows, last=mtok)
                ch, conv = converged(run, rows, True)
                const = conv is not None and conv <= len(rows) - len(win) + 1
                ip = in_process(run, rows, conv, 1, win)
                per.append((rnd, ch, median([r[5] for r in win]) / 1e3, conv, const, ip, b, bound_of(run, rows, True)[0]))
        if per:
            b = per[0][6]
            best = best_of(st.get((n, "decode"), {}), allowed)
            best_all = best_of(st.get((n, "decode"), {}))
            dflt = st.get((n, "decode"), {}).get(0)
            bt = best[1] / 1e3 if best else float("nan")
            t = median([p[2] for p in per])
            ratio = t / bt
            convs = [p[3] or 10**9 for p in per]
            conv_ok = all(c <= p[7] and p[4] for c, p in zip(convs, per))
            bounds = ", ".join(str(p[7]) for p in per)
            cr = [choice_time(st, n, "decode", p[1], allowed) / best[1] if best else float("nan") for p in per]
            okk = conv_ok and all(x <= TOL for x in cr)
            if st:
                verdicts.append((V(f"{n} ranks, decode {fmt_bytes(b)}: settled choice {', '.join(sorted({p[1] for p in per}))}, its static time / best static "
                                   f"{fl(cr, 3)}; converged at token {', '.join(str(c) for c in convs)} (bound {bounds}) [static jobs: separate processes]"), okk, "xproc" + sfx))
            if st:
                verdicts.append((V(f"{n} ranks, decode {fmt_bytes(b)}: time measured in the net_autotune job {fnum(t, 2)} ms/token vs best static {fnum(bt, 2)} "
                                   f"(ratio {fnum(ratio, 3)}; separate processes)"), ratio <= TOL, sfx + "time"))
            same = [agg(v) / 1e3 for c, v in st.get((n, "decode"), {}).items() if v and v[0][2] == per[-1][1] and c in allowed]
            dec_rows.append(
                f"| {n} | {fmt_bytes(b)} × 160 | {who} | {best[0] if best else '?'} {CANDS[best[0]] if best else ''} → {best[2] if best else '?'} | "
                f"{fnum(bt, 2)} ({fl([s[1] / 1e3 for s in st[(n, 'decode')][best[0]]], 2) if best else ''}) | "
                f"{(str(best_all[0]) + ' ' + CANDS[best_all[0]] + ': ' + fnum(best_all[1] / 1e3, 2)) if best_all and (not best or best_all[0] != best[0]) else 'same'} | "
                f"{fnum(agg(dflt) / 1e3, 2) if dflt else 'n/a'} | {', '.join(sorted({p[1] for p in per}))} | {fnum(t, 2)} ({fl([p[2] for p in per], 2)}) | "
                f"{fnum(min(same), 2) if same else 'n/a'} | {fl(cr, 3)} | {fnum(ratio, 3)} ({fl([p[2] / bt for p in per], 3)}) | "
                f"{', '.join(str(p[3]) for p in per)} (bound {bounds}) | {('yes' if okk else 'NO') if st else 'n/a (no static jobs)'} |")
            for rnd, ch, tt, conv, const, ip, _, _ in per:
                if ip:
                    others = ", ".join(f"{c} {fnum(v / 1e3, 2)}" for c, v in sorted(ip[2].items(), key=lambda kv: kv[1]))
                    inproc_rows.append(f"| {n} | decode {fmt_bytes(b)} (ms/token) | {who} | {rnd} | {ip[0]} {fnum(ip[1] / 1e3, 2)} | {ch} {fnum(tt, 2)} | "
                                       f"{fnum(tt * 1e3 / ip[1], 3)} | {others} |")
        if not sfx:
            for (label, nn), run in runs.items():
                base, rnd = split_label(label)
                m = re.fullmatch(r"contend_static(\d)", base)
                if m and nn == n:
                    for name, b, rows in run.phases().values():
                        cont_rows.append((n, b, f"static {m.group(1)} {CANDS[int(m.group(1))]}", rnd, contention(run, rows, measure),
                                          run.flood[0] if run.flood else None, None))
    # Correctness and agreement, per job.
    bad_static = []
    for (label, n), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        grp = "ll128" if split_label(label)[0].endswith("ll128") else ""
        base = split_label(label)[0]
        if base in ("static3", "static6") and not run.ok():
            bad_static.append((label, n, run))
            grp = "ll128"  # forced LL128, which no tuner can choose here: reported, not part of the criterion
        verdicts.append((f"{n} ranks, {label}: every rank exited 0 and found every result right", run.ok(), grp))
        if base.startswith("auto"):
            d = {r: v[-1] for r, v in run.digests.items() if v}
            same = len(d) == n and len({(x[0], x[1], x[2]) for x in d.values()}) == 1
            verdicts.append((f"{n} ranks, {label}: decision digests at finalize equal on all ranks", same, grp))
            m = re.search(r"decisions --compare[^\n]*\n(.*?)## exit (\d+)", run.cli, re.S)
            verdicts.append((f"{n} ranks, {label}: ncclbpf decisions --compare exit {m.group(2) if m else '?'}", bool(m) and m.group(2) == "0", grp))
    # The in-process comparison (ab phases), where the job ran one: the criterion; the readings
    # above (the sweep on communicators of their own, before / after times) are then reported
    # beside it.
    ab_lines, ab_verdicts = autotune_ab.section(
        runs, CANDS, converged,
        bound_of)
    if ab_verdicts:
        verdicts = [(t, v, "earlier" if g == "" and ("same job's static sweep" in t or "flood at" in t) else g)
                    for t, v, g in verdicts]
        verdicts = ab_verdicts + verdicts
    P("## Verdict\n")
    P("| check | |\n|---|---|")
    for text, okk, _ in verdicts:
        P(f"| {text} | {'pass' if okk else '**FAIL**'} |")
    main_v = [v for _, v, g in verdicts if not g]
    time_v = [v for _, v, g in verdicts if g == "time"]
    xproc_v = [v for _, v, g in verdicts if g == "xproc"]
    extra = [v for _, v, g in verdicts if g not in ("", "time", "xproc", "earlier")]
    earlier = [v for _, v, g in verdicts if g == "earlier"]
    how = ("net_autotune within {:.2f} × the best candidate pinned on the same communicator in alternating blocks, settled, during and "
           "after the flood, converged within the bound, results right, digests equal".format(TOL) if ab_verdicts else
           f"the static sweep inside each net_autotune job (its last all_reduces within {TOL:.2f} × the fastest static choice of the same job, "
           "converged within the bound, the contention phases, results right, digests equal)")
    P(f"\noverall, issue 9's criterion with {how}, plain setup: "
      f"**{'PASS' if main_v and all(main_v) else 'FAIL'}**"
      + (f"; the earlier readings (the sweep on communicators of their own, flood before / after times): **{'PASS' if all(earlier) else 'FAIL'}**" if earlier else "")
      + "; against the static jobs (separate processes), read as choices: "
      f"**{'PASS' if xproc_v and all(xproc_v) else 'FAIL' if xproc_v else 'n/a (no static jobs)'}**, read as times: "
      f"**{'PASS' if time_v and all(time_v) else 'FAIL' if time_v else 'n/a'}**"
      + (f"; the rest (LL128 enabled or forced): **{'PASS' if all(extra) else 'FAIL'}**" if extra else "") + "\n")
    L.extend(ab_lines)
    if isweep_rows:
        P("## The same job: its own static sweep against net_autotune\n")
        P("Each net_autotune job also ran every candidate on a communicator of its own that NCCL_ALGO/NCCL_PROTO restrict to it "
          "(autotune.py `isweep`), before and after its net_autotune phases, in the same process and on the same GPU; a candidate's time "
          f"is the median over those blocks of each block's median over its last {sweep_frac}. net_autotune: the median of its last MEASURE "
          "all_reduces (probes included), and of those its kept choice ran alone.\n")
        P("| ranks | size | tuner | round | kept choice | its time alone (µs) | last all_reduces (µs) | best of the sweep | ratio | "
          "every candidate of the sweep (µs, applied) | converged at |")
        P("|---:|---:|---|---:|---|---:|---:|---|---:|---|---:|")
        for n, b, who, rnd, ch, kept_t, wt, bc, cand_t, applied, conv in isweep_rows:
            every = ", ".join(f"{c} {fnum(t)} ({'/'.join(applied[c])})" for c, t in sorted(cand_t.items(), key=lambda kv: kv[1]))
            P(f"| {n} | {fmt_bytes(b)} | {who} | {rnd} | {ch} | {fnum(kept_t)} | {fnum(wt)} | {bc} {CANDS[bc]} {fnum(cand_t[bc])} | "
              f"{fnum(wt / cand_t[bc], 3)} | {every} | {conv} |")
        P("")
    for label, n, run in bad_static:
        P(f"Forced LL128 gave wrong results: {label}, {n} ranks: " + "; ".join(
            l for lines in run.logs.values() for l in lines if l.startswith("PHASE ") and " bad=0 " not in l) + "\n")
    P("## All-reduce sizes (net_autotune, K = %d, D = %d)\n" % (K, D))
    P("| ranks | size | tuner | best static (candidate → applied) | its time (µs; rounds) | best incl. LL128 | NCCL's choice, static (µs) | "
      "net_autotune settled choice | its time (µs; rounds) | static time of that choice | that / best static (rounds) | measured time / best static (rounds) | converged at (collective of the phase, per round) | pass (by choice) |")
    P("|---:|---:|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|")
    L.extend(sizes_rows)
    P("\n## Decode pattern (160 back-to-back all_reduces per token, bf16; net_autotune with K = %d: one epoch per token)\n" % KDEC)
    P("| ranks | all_reduce | tuner | best static (candidate → applied) | its ms/token (rounds) | best incl. LL128 | NCCL's choice, static | "
      "net_autotune settled choice | its ms/token (rounds) | static ms/token of that choice | that / best static (rounds) | measured time / best static (rounds) | converged at (token, per round) | pass (by choice) |")
    P("|---:|---:|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|")
    L.extend(dec_rows)
    noop = [(split_label(l)[1], nn, run) for (l, nn), run in runs.items() if split_label(l)[0] == "noopagree"]
    if noop:
        P("\n## What the agreement costs: noop.o with NCCL_BPF_AGREEMENT=on (NCCL's choice, records and frames every K) against static0 (no policy)\n")
        P("| ranks | size | round | static0 | noop + agreement | ratio |")
        P("|---:|---|---:|---:|---:|---:|")
        frac = float(meta.get("SWEEP_FRACTION", "0.6"))
        for rnd, nn, run in sorted(noop, key=lambda x: (x[1], x[0])):
            s0 = {s[0]: s for s in []}
            for name, b, rows in run.phases().values():
                key = "decode" if name.startswith("decode") else b
                win = window(rows, frac=frac)
                tn = median([r[5] for r in win])
                ref = [s[1] for s in st.get((nn, key), {}).get(0, []) if s[0] == rnd]
                dv, nd = (1e3, 2) if key == "decode" else (1, 1)
                P(f"| {nn} | {'decode ' + fmt_bytes(b) + ' (ms/token)' if key == 'decode' else fmt_bytes(b)} | {rnd} | {fnum(ref[0] / dv, nd) if ref else 'n/a'} | "
                  f"{fnum(tn / dv, nd)} | {fnum(tn / ref[0], 3) if ref else 'n/a'} |")
    P("\n## In-process: what each net_autotune job measured per applied choice while exploring, against its settled window\n")
    P("| ranks | size | tuner | round | fastest while exploring (µs) | settled (µs) | settled / fastest | every choice (median µs, fastest first) |")
    P("|---:|---|---|---:|---|---|---:|---|")
    L.extend(inproc_rows)
    P("\n## Loopback contention: before, during and after the flood\n")
    P("Median µs per all_reduce over each part, and 'settled': over its last MEASURE all_reduces (its second half if shorter than 2 × MEASURE); "
      "the choices NCCL applied, in order, with run lengths; explorations: net_autotune's count for the class at the end (1: only the first).\n")
    P("| ranks | size | tuner | round | flood | before: med / settled (µs) | during: med / settled | after: med / settled | after / before (settled) | explorations | choices during | choices after |")
    P("|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    for n, b, who, rnd, c, flood, rounds in cont_rows:
        fls = f"{flood[0]} pairs, {flood[3]:.1f} GiB/s for {flood[1]:.1f} s" if flood else "?"
        P(f"| {n} | {fmt_bytes(b)} | {who} | {rnd} | {fls} | {fnum(c['before']['med'])} / {fnum(c['before']['settled'])} ({c['before']['n']}) | "
          f"{fnum(c['during']['med'])} / {fnum(c['during']['settled'])} ({c['during']['n']}) | {fnum(c['after']['med'])} / {fnum(c['after']['settled'])} ({c['after']['n']}) | "
          f"{fnum(c['after']['settled'] / c['before']['settled'], 3)} | {rounds if rounds is not None else ''} | {runs_str(c['during']['runs'])} | {runs_str(c['after']['runs'])} |")
    P("\n## Static sweep (median µs; decode: ms/token; rounds separated by /), with the choice NCCL applied\n")
    keys = sorted({k for (n, k) in st}, key=lambda k: (k == "decode", k if k != "decode" else 0))
    for n in ranks:
        P(f"### {n} ranks\n")
        P("| candidate | " + " | ".join("decode" if k == "decode" else fmt_bytes(k) for k in keys) + " |")
        P("|---|" + "---:|" * len(keys))
        for c in range(NCAND):
            cells = []
            for k in keys:
                v = st.get((n, k), {}).get(c)
                if not v:
                    cells.append("")
                else:
                    dv = 1e3 if k == "decode" else 1
                    cells.append(f"{fl([s[1] / dv for s in sorted(v)], 2 if k == 'decode' else 1)} ({v[0][2]})"
                                 + ("" if all(s[3] for s in v) else " **WRONG RESULTS**"))
            if any(cells):
                P(f"| {c} {CANDS[c]} | " + " | ".join(cells) + " |")
        P("")
    P("## Convergence traces (net_autotune): choice runs per phase\n")
    for n in ranks:
        for (label, nn), run in sorted(runs.items()):
            if nn != n or not split_label(label)[0].startswith("auto"):
                continue
            P(f"- {n} ranks, {label}: {len(run.rows)} trace rows, {run.tuning_lines} TUNING lines on rank 0"
              f"{', ' + str(run.skipped) + ' skipped to align' if run.skipped else ''}")
            for name, b, rows in run.phases().values():
                P(f"  - {name}: {runs_str(changes([run.row_choice(r) for r in rows]), 24)}")
    P("\n## net_autotune's state at the end (`ncclbpf maps PID --map autotune_state`, rank 0, while holding)\n")
    P("| ranks | job | class (sizes) | applies | phase | explorations started | reference / best time (µs per collective) | drift |")
    P("|---:|---|---|---|---|---:|---:|---:|")
    lo = ["0 B", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB"]
    for n in ranks:
        for (label, nn), run in sorted(runs.items()):
            if nn != n or not split_label(label)[0].startswith("auto") or not run.state:
                continue
            if "error" in run.state:
                P(f"| {n} | {label} | state unreadable: {run.state['error']} | | | | | |")
                continue
            for k, s in sorted(run.state.items()):
                if not (s["phase"] or s["apply"]):
                    continue
                rng = f"{k}: {lo[k]} …" + (f" < {lo[k + 1]}" if k < 7 else "")
                ph = {0: "new", 1: f"exploring (candidate {s['idx']}, {s['seen']} epochs)", 2: "settled"}.get(s["phase"], str(s["phase"]))
                tn = "none" if s["time_ns"] >= (1 << 63) else fnum(s["time_ns"] / 1e3)
                P(f"| {n} | {label} | {rng} | {s['apply']} {CANDS[s['apply'] & 7]} | {ph} | {s['rounds']} | {tn} | {s['drift']} |")
    P("\n## Agreement and decision digests (every rank's log at finalize; CLI while holding)\n")
    for (label, n), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if not (run.digests or run.agreements or split_label(label)[0].startswith("auto")):
            continue
        P(f"### {label}, {n} ranks\n\n```")
        for r in range(n):
            for d in run.digests.get(r, []):
                P(f"r{r} decision digest of comm {d[0]}: seq {d[1]}, digest {d[2]} {d[3]}".rstrip())
            for a in run.agreements.get(r, []):
                P(f"r{r} {a}")
        if run.cli:
            m = re.search(r"(## \$ ncclbpf decisions --compare.*?## exit \d+)", run.cli, re.S)
            if m:
                P(m.group(1))
        P("```\n")
    P("## Runs\n")
    P("| job | ranks | exit codes | checks (wrong) per rank |\n|---|---:|---|---|")
    for (label, n), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        P(f"| {label} | {n} | {' '.join(f'r{r}={v}' for r, v in run.rc.items())} | "
          f"{' '.join(f'r{r}={run.done[r][0]} ({run.done[r][1]})' if r in run.done else f'r{r}=?' for r in range(n))} |")
    if os.path.exists(f"{w}/runs.txt"):
        P("\n```\n" + open(f"{w}/runs.txt").read().strip() + "\n```")
    os.makedirs(outdir, exist_ok=True)
    with open(f"{outdir}/summary.md", "w") as f:
        f.write("\n".join(L) + "\n")
    plot(runs, st, ranks, f"{outdir}/convergence.png")
    print(f"wrote {outdir}/summary.md and {outdir}/convergence.png ({len(runs)} jobs)")


# ----------------------------------------------------------------------------- the plot
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000"]


def series(runs, st, ranks):
    """Per panel: (title, xlabel, ylabel, points [(x, y, choice)], spans [(x0, x1)], hlines [(x0, x1, y)], vlines)."""
    panels = []
    for n, (sfx, who) in [(n, v) for n in ranks for v in VARIANTS]:
        if not (rounds_of(runs, "auto" + sfx, n) or rounds_of(runs, "autodec" + sfx, n)):
            continue
        for label, unit in (("auto" + sfx, 1.0), ("autodec" + sfx, 1e3)):
            rr = rounds_of(runs, label, n)
            run = rr[0][1] if rr else None
            pts, spans, hl, vl = [], [], [], []
            dec_run = label.startswith("autodec")
            if run:
                own = [r for r in run.rows if not r[3].startswith(("isweep", "iswarm"))]  # not the sweep inside the job
                for row in own[1:]:  # the first is the communicator's setup
                    x = row[0] if not dec_run else (row[0] - 1) // max(1, row[1] - row[0] + 1) + 1
                    pts.append((x, row[5] / unit, run.row_choice(row)))
                fl = [row for row in run.rows if row[6]]
                if fl:
                    spans.append((fl[0][0], fl[-1][0]))
                for pi, (name, b, rows) in run.phases().items():
                    if not name.startswith(("size", "contend", "decode")):
                        continue
                    x0 = rows[0][0] if not dec_run else 1
                    x1 = rows[-1][0] if not dec_run else len(rows)
                    vl.append(x0)
                    key = "decode" if name.startswith("decode") else b
                    best = best_of(st.get((n, key), {}), None if sfx else [0, 1, 2, 4, 5, 7])
                    if best:
                        hl.append((x0, x1, best[1] / unit))
            ph = list(run.phases().values()) if run else []
            sizes = " / ".join(fmt_bytes(b) for name, b, _ in ph if name.startswith("size"))
            cont = " / ".join(fmt_bytes(b) for name, b, _ in ph if name.startswith("contend"))
            dec = " / ".join(fmt_bytes(b) for name, b, _ in ph if name.startswith("decode"))
            title = (f"{n} ranks, {who}{' (round ' + str(rr[0][0]) + ')' if rr and rr[0][0] > 1 or len(rr) > 1 else ''}: all_reduce {sizes}" + (f", then {cont} with a loopback flood (shaded)" if cont else "")
                     if not dec_run else f"{n} ranks, {who}: decode, {dec} × 160 / token")
            panels.append((title, "collective (tuner seq)" if not dec_run else "token",
                           "µs per all_reduce" if not dec_run else "ms per token", pts, spans, hl, vl))
    return panels


def plot(runs, st, ranks, path):
    panels = series(runs, st, ranks)
    if not panels:
        return
    labels = sorted({p[2] for pan in panels for p in pan[3]})
    color = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(labels)}
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        plot_raw(panels, color, path)
        return
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(16, 4.2 * rows), squeeze=False, gridspec_kw={"width_ratios": [3, 1]})
    for i, (title, xl, yl, pts, spans, hl, vl) in enumerate(panels):
        ax = axes[i // 2][i % 2]
        for x0, x1 in spans:
            ax.axvspan(x0, x1, color="#ffdddd", zorder=0)
        for x in vl:
            ax.axvline(x, color="#cccccc", lw=0.8, zorder=1)
        for c in labels:
            xs = [p[0] for p in pts if p[2] == c]
            ys = [p[1] for p in pts if p[2] == c]
            if xs:
                ax.scatter(xs, ys, s=3 if len(pts) > 500 else 10, color=color[c], label=c, zorder=3)
        for j, (x0, x1, y) in enumerate(hl):
            ax.plot([x0, x1], [y, y], "k--", lw=1, zorder=4, label="best static (reachable)" if j == 0 else None)
        if pts and min(p[1] for p in pts) > 0:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.legend(fontsize=7, markerscale=3, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def png_write(path, w, h, pix):
    raw = b"".join(b"\x00" + bytes(pix[y * w * 3:(y + 1) * w * 3]) for y in range(h))

    def chunk(t, d):
        c = t + d
        return struct.pack(">I", len(d)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def plot_raw(panels, color, path):
    """The same panels without text (no matplotlib): points coloured by choice, log y."""
    pw, ph, pad = 900, 300, 30
    cols = 2
    rows = (len(panels) + 1) // 2
    W, H = cols * (pw + pad) + pad, rows * (ph + pad) + pad
    pix = bytearray(b"\xff" * (W * H * 3))

    def rgb(hexs):
        return tuple(int(hexs[i:i + 2], 16) for i in (1, 3, 5))

    def put(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            o = (y * W + x) * 3
            pix[o:o + 3] = bytes(c)

    for i, (title, xl, yl, pts, spans, hl, vl) in enumerate(panels):
        ox, oy = pad + (i % 2) * (pw + pad), pad + (i // 2) * (ph + pad)
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ys = [math.log10(max(p[1], 1e-9)) for p in pts] + [math.log10(max(y, 1e-9)) for _, _, y in hl]
        x0, x1, y0, y1 = min(xs), max(xs) + 1e-9, min(ys) - 0.05, max(ys) + 0.05
        X = lambda x: ox + int((x - x0) / (x1 - x0) * (pw - 1))
        Y = lambda y: oy + ph - 1 - int((math.log10(max(y, 1e-9)) - y0) / (y1 - y0) * (ph - 1))
        for a, b in spans:
            for x in range(X(a), X(b) + 1):
                for y in range(oy, oy + ph):
                    put(x, y, (255, 221, 221))
        for x in vl:
            for y in range(oy, oy + ph):
                put(X(x), y, (200, 200, 200))
        for x in range(ox, ox + pw):
            put(x, oy, (0, 0, 0))
            put(x, oy + ph - 1, (0, 0, 0))
        for y in range(oy, oy + ph):
            put(ox, y, (0, 0, 0))
            put(ox + pw - 1, y, (0, 0, 0))
        for x, y, c in pts:
            cx, cy = X(x), Y(y)
            for dx in (-1, 0, 1):
                for dy in (-1, 0, 1):
                    put(cx + dx, cy + dy, rgb(color[c]))
        for a, b, y in hl:
            for x in range(X(a), X(b) + 1, 6):
                for k in range(3):
                    put(x + k, Y(y), (0, 0, 0))
    png_write(path, W, H, pix)
    with open(path + ".legend.txt", "w") as f:
        f.write("no matplotlib: colours " + ", ".join(f"{c} {v}" for c, v in color.items()) + "\n")


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--best":
        meta, runs = load(sys.argv[2])
        best = best_of(static_table(runs, meta).get((int(sys.argv[3]), int(sys.argv[4])), {}), [0, 1, 2, 4, 5, 7])
        print(best[0] if best else 0)
        return
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    report(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
