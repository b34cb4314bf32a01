"""How often net_autotune's duel picks right at the noise a job's epochs really had.

Reads the epoch lines of NCCL_BPF_AGREEMENT_LOG=1 (rank 0 logs of autotune.sh's auto jobs, or
the logs tarball unpacked) and takes the ratio of consecutive epochs' times (slowest rank) where
no class changed the choice it applies: the pair-to-pair noise of one choice. For a challenger
that is truly faster (or slower) by delta, a pair is won when ratio * (1 - delta) < 1 (resp.
ratio * (1 + delta) < 1). The duel's rule (policies/src/net_autotune.c: ends when one side
leads by MARGIN pairs, else after MAX pairs, the majority winning, a tie keeping the best) is
then evaluated exactly over the pair outcomes, treated as independent.

    python3 bench/gpu/autotune_duel_power.py [--margin M --max N] DIR...

e.g. for the logs kept in bench/results:
    for t in duels duel-probes-2ranks; do mkdir -p /tmp/$t
      tar xzf bench/results/gpu-2026-12-02-autotune-$t-logs.tar.gz -C /tmp/$t; done
    python3 bench/gpu/autotune_duel_power.py /tmp/duels /tmp/duel-probes-2ranks
"""
import glob
import math
import sys

from autotune_report import EPOCH, STATE_WORD  # the epoch line's format, in one place


def ratios(dirs):
    out = []
    for f in sorted(f for d in dirs for f in glob.glob(f"{d}/*auto*-r0.log")):
        ep = []
        for line in open(f, errors="replace"):
            m = EPOCH.search(line)
            if m:
                applies = any(int(w.group(1)) % 4 == 0 for w in STATE_WORD.finditer(m.group(3)))
                ep.append((int(m.group(1)), max(float(x) for x in m.group(2).split()), applies))
        for (e1, t1, c1), (e2, t2, c2) in zip(ep, ep[1:]):
            if e2 == e1 + 1 and not c1 and not c2 and t1 > 0 and 0.2 < t2 / t1 < 5:
                out.append(t2 / t1)
    return out


def duel(p, margin, most):
    """(P(the challenger wins), expected pairs) for a pair-win probability p."""
    states, win, pairs = {(0, 0): 1.0}, 0.0, 0.0
    while states:
        nxt = {}
        for (w, l), pr in states.items():
            if w + l >= most or abs(w - l) >= margin:
                win += pr if w > l else 0.0
                pairs += pr * (w + l)
                continue
            for k, q in (((w + 1, l), p), ((w, l + 1), 1 - p)):
                nxt[k] = nxt.get(k, 0.0) + pr * q
        states = nxt
    return win, pairs


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margin", type=int, default=4)
    ap.add_argument("--max", type=int, default=16)
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    margin, most = a.margin, a.max
    r = ratios(a.dirs)
    if not r:
        sys.exit(f"no epoch lines in {a.dirs}/*auto*-r0.log (run with NCCL_BPF_AGREEMENT_LOG=1)")
    ls = sorted(math.log(x) for x in r)
    q = [ls[int(f * (len(ls) - 1))] for f in (0.1, 0.25, 0.5, 0.75, 0.9)]
    print(f"{len(r)} pairs of consecutive epochs; log ratio quantiles 10/25/50/75/90 %: "
          + " ".join(f"{x:+.3f}" for x in q))
    print(f"| challenger | pair won | duel won (margin {margin}, at most {most}) | pairs (mean) | fixed 6 pairs, 4 wins |")
    print("|---|---:|---:|---:|---:|")
    for delta in (0.13, 0.10, 0.05, 0.0, -0.05, -0.10):
        p = sum(1 for x in r if x * (1 - delta) < 1) / len(r)
        w, n = duel(p, margin, most)
        fixed = sum(math.comb(6, k) * p ** k * (1 - p) ** (6 - k) for k in range(4, 7))
        what = f"{abs(delta) * 100:.0f} % {'faster' if delta > 0 else 'slower'}" if delta else "the same"
        print(f"| {what} | {p:.2f} | {w:.3f} | {n:.1f} | {fixed:.3f} |")


if __name__ == "__main__":
    main()
