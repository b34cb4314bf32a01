"""Turns RESULT lines into markdown tables: time per configuration (the mean of its rounds,
labels like `bpf-r1`/`bpf-r2` are rounds of `bpf`), and ratios to NCCL's Socket transport."""
import collections
import sys

rows = collections.defaultdict(lambda: collections.defaultdict(list))
correct = collections.defaultdict(lambda: True)
for line in open(sys.argv[1]):
    parts = line.split()
    label = parts[1].split("-r")[0]
    f = dict(kv.split("=", 1) for kv in parts[2:])
    key = (int(f["ranks"]), int(f["bytes"]))
    rows[key][label].append(float(f["us"]))
    correct[key] &= f["correct"] == "yes"
labels = sorted({l for r in rows.values() for l in r}, key=lambda l: (l != "socket", l))
mean = lambda v: sum(v) / len(v)
head = " | ".join(f"{l} (us)" for l in labels)
ratios = [l for l in labels if l != "socket"]
print(f"| ranks | bytes | {head} | " + " | ".join(f"{l} / socket" for l in ratios) + " | all correct |")
print("|---:|---:|" + "---:|" * (len(labels) + len(ratios)) + "---|")
for (n, b), r in sorted(rows.items()):
    cells = [f"{mean(r[l]):.1f}" if l in r else "" for l in labels]
    rs = [f"{mean(r[l]) / mean(r['socket']):.2f}" if l in r and "socket" in r else "" for l in ratios]
    print(f"| {n} | {b} | " + " | ".join(cells + rs) + f" | {'yes' if correct[(n, b)] else 'NO'} |")
