"""Turns RESULT lines into a markdown table: time per config, and plugin / Socket ratios."""
import collections
import sys

rows = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split()[2:])
    label = line.split()[1]
    rows[(int(f["ranks"]), int(f["bytes"]))][label] = (float(f["us"]), f["correct"])
labels = sorted({l for r in rows.values() for l in r}, key=lambda l: (l != "socket", l))
print("| ranks | bytes | " + " | ".join(f"{l} (us)" for l in labels) + " | bpf / socket time | all correct |")
print("|---:|---:|" + "---:|" * len(labels) + "---:|---|")
for (n, b), r in sorted(rows.items()):
    cells = [f"{r[l][0]:.1f}" if l in r else "" for l in labels]
    ratio = f"{r['bpf'][0] / r['socket'][0]:.2f}" if "bpf" in r and "socket" in r else ""
    correct = "yes" if all(c == "yes" for _, c in r.values()) else "NO"
    print(f"| {n} | {b} | " + " | ".join(cells) + f" | {ratio} | {correct} |")
