"""The in-process comparison of bench/gpu/autotune.sh (autotune.py `ab` and `abdec` phases), for
autotune_report.py: net_autotune against every candidate pinned on the same communicator, in
alternating blocks of one run.

Why: on this machine one setting differs by tens of percent from one process to the next, from
one communicator to the next in one process, and from one minute to the next on one
communicator; a static sweep in other processes, on other communicators or at other times cannot
decide a 5 % criterion. Here the candidates and net_autotune take turns on net_autotune's own
communicator (pins: policies/src/net_autotune.c, staged with `ncclbpf config --at-seq`), R rounds
with the order rotated, and each round's net_autotune block is set against the same round's
blocks of the best candidate: drift over the run cancels out of the ratio.

A block's figure is the median of its all_reduces (tokens) after the first quarter (the first
token) of it, which sees the switch. A candidate's figure is the median over rounds of its blocks'
figures; the best static choice is the candidate with the lowest; the ratio is the median over
rounds of net_autotune's block / the best candidate's block of the same round ('by time': what
net_autotune's own blocks cost, its probes of a runner-up included). The verdict reads the issue's
criterion by choice: the choice net_autotune settled on (what NCCL applied in most of its
blocks), timed as the fastest pinned arm NCCL applied as that choice, against the best arm,
round by round (1 when it is the best arm).
"""
import collections
import re
import statistics

TOL = 1.05
BLOCK = re.compile(r"(ab|abdec)(\d+)_(\d+)_(\d+)_(a|c\d)$")
# What a pinned candidate must show in NCCL's TUNING line (algorithm/protocol[, channels]); 0
# (NCCL's choice), 3 and 6 (LL128, off here unless NCCL_PROTO names it) are not checked.
PINNED = {1: ("RING", "SIMPLE", None), 2: ("RING", "LL", None), 4: ("TREE", "SIMPLE", None),
          5: ("TREE", "LL", None), 7: ("RING", "SIMPLE", 2)}


def median(v):
    return statistics.median(v) if v else float("nan")


def fnum(v, nd=1):
    return "n/a" if v != v else f"{v:.{nd}f}"


def pin_shown(arm, choice):
    """Whether NCCL's applied choice (ALGO/PROTO/Nch) is what pinning `arm` asks for."""
    want = PINNED.get(arm)
    if want is None:
        return True
    p = choice.split("/")
    if len(p) != 3:
        return False
    return p[0] == want[0] and p[1] == want[1] and (want[2] is None or p[2] == f"{want[2]}ch")


def phase_blocks(run):
    """phase index -> dict(kind, bytes, blocks {(round, arm): rows}, flood: any row flooded)."""
    out = collections.OrderedDict()
    for row in run.rows:
        m = BLOCK.match(row[3])
        if not m:
            continue
        ph = out.setdefault(row[2], dict(kind=m.group(1), bytes=int(m.group(3)), blocks=collections.OrderedDict(), flood=False))
        arm = "a" if m.group(5) == "a" else int(m.group(5)[1:])
        ph["blocks"].setdefault((int(m.group(4)), arm), []).append(row)
        ph["flood"] |= bool(row[6])
    return out


def analyse(run, ph):
    """The comparison of one phase: per arm its figure, applied choice, block figures by round;
    the best pinned arm; the ratio; whether every pin showed in NCCL's choices."""
    dec = ph["kind"] == "abdec"
    per_arm = collections.defaultdict(dict)  # arm -> round -> figure
    applied = collections.defaultdict(collections.Counter)
    for (rnd, arm), rows in ph["blocks"].items():
        skip = 1 if dec else len(rows) // 4
        meas = rows[skip:] or rows
        per_arm[arm][rnd] = median([r[5] for r in meas]) / (1e3 if dec else 1)
        for r in meas:
            applied[arm][run.row_choice(r)] += 1
    fig = {a: median(list(v.values())) for a, v in per_arm.items()}
    pinned = [a for a in fig if a != "a" and fig[a] == fig[a]]
    if "a" not in fig or not pinned:
        return None
    best = min(pinned, key=fig.get)
    ratios = [per_arm["a"][r] / per_arm[best][r] for r in per_arm["a"] if r in per_arm[best]]
    main = {a: c.most_common(1)[0][0] for a, c in applied.items()}
    pins_ok = all(pin_shown(a, ch) and applied[a][ch] == sum(applied[a].values())
                  for a, ch in main.items() if a != "a")
    # By choice (the reading: the choice net_autotune settled on, timed as a static
    # choice): the fastest pinned arm that NCCL applied as net_autotune's main choice, against
    # the best arm, round by round (1 when it is the best arm).
    same = [x for x in pinned if main.get(x) == main.get("a")]
    sbest = min(same, key=fig.get) if same else None
    cratios = ([per_arm[sbest][r] / per_arm[best][r] for r in per_arm[sbest] if r in per_arm[best]]
               if sbest is not None else [])
    return dict(dec=dec, fig=fig, per_arm=per_arm, best=best, ratio=median(ratios), ratios=ratios,
                same=sbest, choice_ratio=median(cratios), choice=main, auto_choices=dict(applied["a"]),
                pins_ok=pins_ok)


def section(runs, cands, conv_of, bound_of):
    """(markdown lines, verdicts [(text, ok, group)]) for every auto job's ab/abdec phases.
    conv_of(run, rows, dec, near) -> (kept choice, converged at) of a net_autotune phase, where
    near is the set of applied choices that count as converged (within TOL of the best pinned);
    bound_of(run, rows, dec) -> (its convergence bound, the duels it had)."""
    lines, verdicts = [], []
    rows_md = []
    for (label, n), run in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if not label.startswith("auto"):
            continue
        phases = run.phases()
        abs_ = phase_blocks(run)
        if not abs_:
            continue
        first_flood = min([r[2] for r in run.rows if r[6]] or [None], key=lambda x: (x is None, x))
        settled_fig = {}
        for pi, ph in abs_.items():
            a = analyse(run, ph)
            if a is None:
                continue
            b, dec = ph["bytes"], a["dec"]
            when = "during the flood" if ph["flood"] else ("after the flood" if first_flood is not None and pi > first_flood else "settled")
            unit = "ms/token" if dec else "µs"
            what = f"decode {b // 1024} KiB" if dec else (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB")
            # The net_autotune phase before it at the same size: convergence.
            prev = [(i, rows) for i, (name, bb, rows) in phases.items() if i < pi and bb == b and not abs_.get(i)
                    and re.match(r"(size|fsize|decode)\d", name)]
            conv_txt, conv_ok = "", True
            if prev and when == "settled":
                # Converged: from the first collective after which every choice it kept ran,
                # pinned on this communicator, within TOL of the best (the criterion's words);
                # two such choices swapped by a probe are both within it.
                near = {a["choice"][x] for x in a["fig"] if x != "a" and a["fig"][x] <= TOL * a["fig"][a["best"]]}
                ch, conv = conv_of(run, prev[-1][1], dec, near)
                bd, duels = bound_of(run, prev[-1][1], dec)
                conv_ok = conv is not None and conv <= bd
                conv_txt = (f"; the phase before settled on {ch} at {'token ' if dec else 'collective '}{conv} "
                            f"(bound {bd}, {duels} duel{'' if duels == 1 else 's'})")
            ok = a["choice_ratio"] <= TOL and a["pins_ok"]
            extra = ""
            if when == "settled":
                settled_fig[(b, dec)] = a["fig"]["a"]
                ok = ok and conv_ok
            elif when == "during the flood":
                # Adapted: it explored again during the flood (three or more choices ran in the
                # phase before, a probe adds one), or the flood never slowed it by half (three
                # such epochs in a row start an exploration).
                ref = settled_fig.get((b, dec))
                hurt = a["fig"]["a"] / ref if ref else float("nan")
                flood_rows = prev[-1][1] if prev else []
                explored = len({run.row_choice(r) for r in flood_rows if r[6]}) >= 3
                extra = (f"; slowed by the flood {fnum(hurt, 2)}× against the settled phase, "
                         f"{'explored again' if explored else 'not explored again'} (needed above 1.5×)")
                ok = ok and (explored or hurt <= 1.5)
            best, same = a["best"], a["same"]
            nd = 2 if dec else 1
            same_txt = (f"{same} {cands[same]} {fnum(a['fig'][same], nd)} {unit}" if same is not None
                        else "no pinned arm ran it")
            verdicts.append((
                f"{n} ranks, {what}, {when}: net_autotune settled on {a['choice'].get('a', '?')}; pinned as that choice, "
                f"{same_txt}, vs the best pinned candidate on the same communicator, {best} {cands[best]} "
                f"{fnum(a['fig'][best], nd)} {unit} ({a['choice'].get(best, '?')}): by choice {fnum(a['choice_ratio'], 3)} ≤ {TOL:.2f}; "
                f"by time (net_autotune's own blocks, its probes included) {fnum(a['fig']['a'], nd)} {unit}, ratio {fnum(a['ratio'], 3)} "
                f"(per round {', '.join(fnum(x, 3) for x in a['ratios'])})"
                f"{'' if a['pins_ok'] else '; a pin did not show in NCCL’s choices'}{conv_txt}{extra}", ok, ""))
            arms = sorted(a["fig"], key=lambda x: (x != "a", a["fig"][x]))
            every = ", ".join(f"{'net_autotune' if x == 'a' else str(x) + ' ' + cands[x]} {fnum(a['fig'][x], 2 if dec else 1)} "
                              f"({a['choice'].get(x, '?')})" for x in arms)
            rounds = len(a["ratios"])
            rows_md.append(f"| {n} | {what} | {when} | {label} | {rounds} | {fnum(a['fig']['a'], 2 if dec else 1)} | "
                           f"{best} {cands[best]} {fnum(a['fig'][best], 2 if dec else 1)} | {fnum(a['choice_ratio'], 3)} | {fnum(a['ratio'], 3)} | "
                           f"{', '.join(f'{c} ×{k}' for c, k in sorted(a['auto_choices'].items(), key=lambda kv: -kv[1]))} | {every} |")
    if rows_md:
        lines.append("## The same communicator: net_autotune against every candidate pinned, in alternating blocks\n")
        lines.append(__doc__.split("\n\n", 1)[1].strip() + "\n")
        lines.append("| ranks | size | when | job | rounds | net_autotune | best pinned | by choice | by time | net_autotune applied (all_reduces or tokens measured) | every arm (median of rounds, applied) |")
        lines.append("|---:|---|---|---|---:|---:|---|---:|---:|---|---|")
        lines.extend(rows_md)
        lines.append("")
    return lines, verdicts
