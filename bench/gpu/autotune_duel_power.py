"""How often net_autotune's duel picks right at the noise a job's epochs really had.

Reads the epoch lines of NCCL_BPF_AGREEMENT_LOG=1 (rank 0 logs of autotune.sh's auto jobs, or
the logs tarballs unpacked) and keeps the stretches of consecutive epochs in which no class
changed the choice it applies: real sequences of one choice's epoch times (slowest rank), with
their drift and their stalls. A duel is replayed on a stretch from a random start: its epochs
alternate between the best and a challenger that is truly faster (or slower) by delta, i.e. the
challenger's epochs are multiplied by 1 - delta (resp. 1 + delta). Two rules are replayed, each
to its end (a lead of MARGIN comparisons, else MAX comparisons, the majority winning, a tie
keeping the best):

  adjacent  every two adjacent epochs are one comparison, whichever side ran first (the rule of
            policies/src/net_autotune.c since stop 28: margin 6, at most 31 comparisons, i.e.
            32 epochs);
  pairs     only a challenger epoch right after a best epoch is a comparison (the rule before:
            margin 4, at most 16 pairs, 32 epochs).

    python3 bench/gpu/autotune_duel_power.py [--trials N] [--busy] DIR...

e.g. for the logs kept in bench/results:
    for t in stop27 stop27-run2 wall-time-2; do mkdir -p /tmp/$t
      tar xzf bench/results/gpu-2026-12-03-autotune-$t-logs.tar.gz -C /tmp/$t; done
    python3 bench/gpu/autotune_duel_power.py /tmp/stop27 /tmp/stop27-run2 /tmp/wall-time-2
"""
import glob
import random
import sys

from autotune_report import BUSY, EPOCH, STATE_WORD  # the epoch line's format, in one place

EPOCHS = 32  # a duel's epochs at most, either rule


def stretches(dirs, least=EPOCHS + 2, busy=False):
    """Runs of consecutive epochs in which no class changed what it applies: the slowest
    rank's wall time per epoch, or its net busy time (busy; lines without one end a run)."""
    out = []
    for f in sorted(f for d in dirs for f in glob.glob(f"{d}/**/*auto*-r0.log", recursive=True)):
        cur, last = [], None
        for line in open(f, errors="replace"):
            m = EPOCH.search(line)
            if not m:
                continue
            e = int(m.group(1))
            b = BUSY.search(line)
            times = (b.group(1) if b else "0") if busy else m.group(2)
            t = max(float(x) for x in times.split())
            applies = any(int(w.group(1)) % 4 == 0 for w in STATE_WORD.finditer(m.group(3)))
            if applies or last is None or e != last + 1 or t <= 0:
                if len(cur) >= least:
                    out.append(cur)
                cur = []
            else:
                cur.append(t)
            last = e
        if len(cur) >= least:
            out.append(cur)
    return out


def duel(seq, delta, margin, most, adjacent):
    """(the challenger won, epochs the duel ran) on epoch times seq: even epochs the best's,
    odd ones the challenger's."""
    t = [x * (1 - delta) if i % 2 else x for i, x in enumerate(seq)]
    won = lost = 0
    for i in range(1, len(t)):
        if not adjacent and i % 2 == 0:
            continue  # pairs: (best, challenger) in that order only
        ch, best = (t[i], t[i - 1]) if i % 2 else (t[i - 1], t[i])
        won, lost = (won + 1, lost) if ch < best else (won, lost + 1)
        if won + lost >= most or abs(won - lost) >= margin:
            return won > lost, i + 1
    return won > lost, len(t)


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--busy", action="store_true", help="the epochs' net busy times (runs since stop 28), not their wall times")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    runs = stretches(a.dirs, busy=a.busy)
    if not runs:
        sys.exit(f"no stretches of {EPOCHS + 2} steady epochs in {a.dirs} (run with NCCL_BPF_AGREEMENT_LOG=1)")
    rng = random.Random(a.seed)
    starts = [(r, i) for r in runs for i in range(len(r) - EPOCHS + 1)]
    print(f"{len(runs)} stretches of steady epochs, {sum(map(len, runs))} epochs; {a.trials} duels per cell")
    rules = (("adjacent, margin 6, at most 31", 6, 31, True), ("pairs, margin 4, at most 16", 4, 16, False))
    print("| challenger | " + " | ".join(f"{n}: won (epochs)" for n, *_ in rules) + " |")
    print("|---|" + "---:|" * len(rules))
    for delta in (0.10, 0.06, 0.03, 0.0, -0.03, -0.06, -0.10):
        cells = []
        for _, margin, most, adj in rules:
            w = n = 0
            for _ in range(a.trials):
                r, i = rng.choice(starts)
                won, ep = duel(r[i:i + EPOCHS], delta, margin, most, adj)
                w += won
                n += ep
            cells.append(f"{w / a.trials:.3f} ({n / a.trials:.1f})")
        what = f"{abs(delta) * 100:.0f} % {'faster' if delta > 0 else 'slower'}" if delta else "the same"
        print(f"| {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
