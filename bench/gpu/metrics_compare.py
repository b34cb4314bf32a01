"""Compares what the exporter served with what the ranks of bench/gpu/metrics_ports.sh moved.

Reads OUT/results.txt (each rank's MOVED line: the bytes its all_reduces had to send, and its
HOLDING line: its pid) and OUT/exporter.txt (one scrape while all ranks held), prints per rank
the bytes the exporter says it sent and received, their difference from the all_reduces' bytes
(the rest is torch's barriers: a few tiny all_reduces), and per rank whether its in-process
endpoint (OUT/endpoint<r>.txt) agrees with the exporter. Exit 1 when a rank's sent bytes are
below what its all_reduces had to send, or more than 1 MiB above it.
"""
import re
import sys

out = sys.argv[1]


def samples(path, name):
    rows = []
    try:
        text = open(path).read()
    except OSError:
        return rows
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line[len(name):line.rindex("}")]))
        rows.append((labels, float(line.rsplit(" ", 1)[1])))
    return rows


moved, pids = {}, {}
for line in open(f"{out}/results.txt"):
    m = re.match(r"MOVED rank=(\d+) allreduce_send_bytes=(\d+)", line)
    if m:
        moved[int(m[1])] = int(m[2])
    m = re.match(r"HOLDING rank=(\d+) pid=(\d+)", line)
    if m:
        pids[int(m[1])] = m[2]

bad = 0
exp = f"{out}/exporter.txt"
print(f"{'rank':>4} {'pid':>8} {'sent (exporter)':>16} {'all_reduce bytes':>17} {'extra':>8} {'received':>14} {'conns s/r':>9} endpoint")
for r in sorted(pids):
    pid = pids[r]
    sent = sum(v for l, v in samples(exp, "nccl_net_sent_bytes_total") if l["pid"] == pid)
    recv = sum(v for l, v in samples(exp, "nccl_net_received_bytes_total") if l["pid"] == pid)
    conns = {l["direction"]: int(v) for l, v in samples(exp, "nccl_net_connections") if l["pid"] == pid}
    ep = f"{out}/endpoint{r}.txt"
    ep_sent = sum(v for l, v in samples(ep, "nccl_net_sent_bytes_total") if l["pid"] == pid)
    ep_ok = "agrees" if ep_sent == sent and sent > 0 else f"differs ({ep_sent:.0f})"
    want = moved.get(r, 0)
    extra = sent - want
    ok = 0 <= extra <= (1 << 20)
    bad += 0 if ok else 1
    print(f"{r:>4} {pid:>8} {sent:>16.0f} {want:>17} {extra:>8.0f} {recv:>14.0f} {conns.get('send', 0):>4}/{conns.get('recv', 0):<4} {ep_ok}{'' if ok else '  MISMATCH'}")
for name in ["exporter.took", "exporter-frozen.took"]:
    try:
        print(name.replace(".took", "") + ": " + open(f"{out}/{name}").read().strip())
    except OSError:
        pass
frozen = f"{out}/exporter-frozen.txt"
if pids.get(1):
    n = len([1 for l, _ in samples(frozen, "nccl_net_sent_bytes_total") if l["pid"] == pids[1]])
    print(f"scrape with rank 1 (pid {pids[1]}) stopped: {n} of its send connections served")
sys.exit(1 if bad or not pids else 0)
