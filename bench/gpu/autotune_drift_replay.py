"""Replays the epoch times of a bench/gpu/autotune.sh run through net_autotune's drift rules: the
rule before stop 27 (t over 3/2 of a reference of weight 1/8 in three epochs in a row; the
reference follows every epoch within 3/2) and the current one (a recent average, weight 1/2 of t
capped at twice the reference, over 3/2 of a reference of weight 1/32 in three epochs in a row).

Usage: autotune_drift_replay.py WORKDIR [LABEL N CLASS FIRST LAST]

Without the optional arguments: every run of net_autotune by wall time in WORKDIR (auto-n2,
auto-n4), every class, every stretch of epochs in which the class was settled and measured;
prints the stretches where either rule would start an exploration, with the epoch (index in the
stretch) at which each rule fires. With them: the epochs FIRST..LAST of one run and class, from
the reference the state held before FIRST. t is the slowest rank's wall time per collective (the
epoch log's rank times / K), what net_autotune measured by default before stop 28 (it now takes
the net busy time, the epoch log's `net busy (us)`, where every rank has one); the replay does not model the
first epoch after a pin (which the current rule skips), so read it for the policy's own phases.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autotune_report as R  # noqa: E402

K = 32


def epochs(w, label, n):
    """[(epoch, t ns, state words after it, classes whose words it changed)] from rank 0's log."""
    out, words = [], {}
    for line in open(f"{w}/{label}-n{n}-r0.log", errors="replace"):
        m = R.EPOCH.search(line)
        if not m:
            continue
        ch = set()
        for x in R.STATE_WORD.finditer(m.group(3)):
            i, v = int(x.group(1)), int(x.group(2), 16)
            words[i] = v
            ch.add(i // 4)
        times = [float(x) for x in m.group(2).split()]
        out.append((int(m.group(1)), max(times) * 1e3 / K, dict(words), ch))
    return out


def old_rule(ts, ref):
    fired, d = [], 0
    for i, t in enumerate(ts):
        if t > 1.5 * ref:
            d += 1
            if d >= 3:
                fired.append(i)
                d = 0
        else:
            d = 0
            ref += (t - ref) / 8
    return fired


def new_rule(ts, ref):
    fired, d, recent = [], 0, ref
    for i, t in enumerate(ts):
        recent = (recent + min(t, 2 * ref)) / 2
        if recent > 1.5 * ref:
            d += 1
            if d >= 3:
                fired.append(i)
                d, recent = 0, ref
        else:
            d = 0
        if t <= 1.5 * ref:
            ref += (t - ref) / 32
    return fired


def stretches(eps, cls):
    """(first epoch, reference ns, [t]) for each stretch of settled, measured epochs of cls."""
    out, cur = [], None
    for j, (e, t, w, ch) in enumerate(eps):
        prev = eps[j - 1][2] if j else {}
        settled = prev.get(4 * cls + 1, 0) & 0xFF == 2
        if settled and cls in ch:
            if cur is None:
                cur = (e, prev.get(4 * cls + 2, 0) & 0xFFFFFFFF, [])
            cur[2].append(t)
        elif not settled and cur is not None:
            out.append(cur)
            cur = None
    if cur:
        out.append(cur)
    return out


def main():
    a = sys.argv[1:]
    if len(a) not in (1, 6):
        sys.exit(__doc__)
    w = a[0]
    if len(a) == 6:
        label, n, cls, lo, hi = a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5])
        eps = epochs(w, label, n)
        before = [x for x in eps if x[0] < lo]
        ref = before[-1][2].get(4 * cls + 2, 0) & 0xFFFFFFFF if before else 0
        ts = [t for e, t, _, _ in eps if lo <= e <= hi]
        print(f"{label}-n{n} class {cls} epochs {lo}..{hi}, reference {ref / 1e3:.0f} us: "
              f"old rule fires at {old_rule(ts, ref)}, current rule at {new_rule(ts, ref)}")
        return
    for n in (2, 4):
        if not os.path.exists(f"{w}/auto-n{n}-r0.log"):
            continue
        eps = epochs(w, "auto", n)
        for cls in range(8):
            for e0, ref, ts in stretches(eps, cls):
                if len(ts) < 5 or not ref:
                    continue
                o, c = old_rule(ts, ref), new_rule(ts, ref)
                if o or c:
                    print(f"auto-n{n} class {cls} from epoch {e0}, {len(ts)} epochs, reference {ref / 1e3:.0f} us: "
                          f"old rule fires at {o}, current rule at {c}")


if __name__ == "__main__":
    main()
