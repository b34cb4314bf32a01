"""Report of bench/gpu/interposer.sh: OUTDIR/summary.md.

Usage: interposer_report.py OUTDIR
"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from report_common import fmt_bytes, kv  # noqa: E402

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
RATIOS = [("wfs", "fs"), ("wfs_cc", "fs"), ("copy", "bpf"), ("copy_cc", "bpf_cc"), ("bpf", "socket")]


def prom(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        if line.startswith("#") or not line.strip():
            continue
        m = SAMPLE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(3) or "")), float(m.group(4))))
    return out


def read(path):
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def timings(out):
    res = {}  # (ranks, op, bytes) -> arm -> {round: us}
    bad = []
    for line in read(f"{out}/results.txt").splitlines():
        if not line.startswith("RESULT "):
            continue
        f = kv(line)
        key = (int(f["ranks"]), f["op"], int(f["bytes"]))
        res.setdefault(key, {}).setdefault(f["arm"], {})[int(f["round"])] = float(f["us"])
        if f.get("correct") != "yes":
            bad.append(line)
    return res, bad


def spread(vals):
    if len(vals) < 2:
        return ""
    return f" ({min(vals):.3g}–{max(vals):.3g})"


def table(L, res, ranks):
    keys = sorted(k for k in res if k[0] == ranks)
    if not keys:
        return
    arms = [a for a in ["socket", "bpf", "bpf_cc", "copy", "copy_cc", "fs", "wfs", "wfs_cc"]
            if any(a in res[k] for k in keys)]
    nr = max(len(v) for k in keys for v in res[k].values())
    L.append(f"\n## {ranks} ranks: median µs per collective over {nr} round(s), (min–max)\n")
    L.append("| op | bytes | " + " | ".join(arms) + " |")
    L.append("|---|---:|" + "---:|" * len(arms))
    for k in keys:
        cells = []
        for a in arms:
            v = list(res[k].get(a, {}).values())
            cells.append(f"{statistics.median(v):.1f}{spread(v)}" if v else "–")
        L.append(f"| {k[1]} | {fmt_bytes(k[2])} | " + " | ".join(cells) + " |")
    L.append(f"\n### {ranks} ranks: overhead ratios (median of the per-round ratios, (min–max); 1.00 = no cost)\n")
    L.append("| op | bytes | " + " | ".join(f"{a}/{b}" for a, b in RATIOS) + " |")
    L.append("|---|---:|" + "---:|" * len(RATIOS))
    for k in keys:
        cells = []
        for a, b in RATIOS:
            ra, rb = res[k].get(a, {}), res[k].get(b, {})
            per = [ra[r] / rb[r] for r in ra if r in rb and rb[r] > 0]
            cells.append(f"{statistics.median(per):.3f}{spread(per)}" if per else "–")
        L.append(f"| {k[1]} | {fmt_bytes(k[2])} | " + " | ".join(cells) + " |")


def status_conns(path):
    """[(pid, direction, bytes, messages)] from `ncclbpf status --all --json`."""
    try:
        v = json.loads(read(path))
    except ValueError:
        return None
    rows = []
    for p in v.get("processes", []):
        for c in p.get("connections", []):
            rows.append((p.get("pid"), c.get("direction"), c.get("bytes"), c.get("messages")))
    return rows


def carriers(L, out):
    """Per arm, from rank 0's log of its first 2-rank job: NCCL's channel lines and the line
    naming the inner plugin."""
    L.append("\n## Who carried the data (rank 0, first 2-rank job of each arm)\n")
    L.append("| arm | NCCL's channels | inner plugin named by ncclbpf |")
    L.append("|---|---|---|")
    for arm in ["socket", "bpf", "bpf_cc", "copy", "copy_cc", "fs", "wfs", "wfs_cc"]:
        t = read(f"{out}/sweep-{arm}-n2-1-r0.log")
        if not t:
            continue
        via = sorted(set(re.findall(r"via (NET/[^\s]+)", t)))
        inner = re.findall(r"traffic carried by inner net plugin '([^']*)' \((ncclNetPlugin_v\d+)", t)
        L.append(f"| {arm} | {', '.join(via) or 'none logged'} | "
                 f"{' '.join(sorted(set(f'{a} ({b})' for a, b in inner))) or '–'} |")


def checks(L, out):
    for arm in ("copy", "wfs"):
        d = f"{out}/checks/{arm}"
        if not os.path.isdir(d):
            continue
        L.append(f"\n## Check through `{arm}` (2 ranks, Ring/Simple)\n")
        logs = {int(m.group(1)): read(p) for p in glob.glob(f"{d}/rank*.log")
                for m in [re.search(r"rank(\d+)\.log$", p)] if m}
        for r in sorted(logs):
            t = logs[r]
            carried = sorted(set(re.findall(r"traffic carried by inner net plugin '[^']*' \(ncclNetPlugin_v\d+[^)]*\)[^\n]*", t)))
            via = sorted(set(re.findall(r"via (NET/[^\s]+)", t)))
            L.append(f"- rank {r}: {carried[0] if carried else 'NO line saying which inner plugin carried the traffic'}; "
                     f"NCCL's channels: {', '.join(via) or 'none logged'}")
            for line in re.findall(r"^(?:PHASE1|KIND|DONE|GO never).*$", t, re.M):
                L.append(f"  - `{line}`")
        L.append("")
        L.append("| rank | pid | expected sent (all_reduces) | endpoint sent | endpoint received | status --json send bytes | status recv bytes |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        st = status_conns(f"{d}/status-phase1.json") or []
        for r in sorted(logs):
            m = re.search(r"^PHASE1 rank=\d+ pid=(\d+) expected_sent=(\d+)", logs[r], re.M)
            if not m:
                L.append(f"| {r} | ? | no PHASE1 line | | | | |")
                continue
            pid, exp = int(m.group(1)), int(m.group(2))
            s = prom(f"{d}/phase1-rank{r}.prom")
            sent = sum(v for n, _, v in s if n == "nccl_net_sent_bytes_total")
            recv = sum(v for n, _, v in s if n == "nccl_net_received_bytes_total")
            ss = sum(b or 0 for p, dr, b, _ in st if p == pid and dr == "send")
            sr = sum(b or 0 for p, dr, b, _ in st if p == pid and dr == "recv")
            L.append(f"| {r} | {pid} | {exp} | {sent:.0f} ({sent - exp:+.0f}) | {recv:.0f} ({recv - exp:+.0f}) | {ss} ({ss - exp:+d}) | {sr} ({sr - exp:+d}) |")
        L.append("\nThe differences beyond the all_reduces are torch's barriers and the setup "
                 "all_reduce (a few small messages). Over fastsocket, received bytes are what NCCL "
                 "posted (its `test` leaves the size unwritten; the wrapper then reports the posted size).")
        p2 = status_conns(f"{d}/status-phase2.json")
        L.append(f"\n`ncclbpf status --all --json` during the every-kind phase: "
                 f"{'unreadable: ' + read(d + '/status-phase2.err').strip() if p2 is None else str(len(p2)) + ' connection ends'}"
                 f"; phase 1: {read(d + '/status-phase1.err').strip().splitlines()[-1:] or '?'}")


def main():
    out = sys.argv[1]
    res, bad = timings(out)
    L = ["# The interposer on the GPU machine (issue 33)\n",
         "Made by `bench/gpu/interposer.sh` (report: `bench/gpu/interposer_report.py`).\n",
         "```\n" + read(f"{out}/versions.txt").strip() + "\n```\n",
         "Arms: socket = NCCL's Socket; bpf = our plugin; copy = our plugin over a copy of itself; "
         "fs = fastsocket loaded by NCCL; wfs = our plugin over fastsocket; `_cc` = with conn_counter.o.\n"]
    jobs = [l for l in read(f"{out}/results.txt").splitlines() if l.startswith(("JOB ", "SKIP ", "CHECK "))]
    failed = [l for l in jobs if (" rc=" in l and " rc=0" not in l) or l.startswith("SKIP")]
    L.append(f"Jobs: {sum(l.startswith('JOB ') for l in jobs)}, checks: {sum(l.startswith('CHECK ') for l in jobs)}; "
             f"results not correct: {len(bad)}; failed or skipped: {len(failed)}\n")
    for l in bad + failed:
        L.append(f"- `{l}`")
    for ranks in (2, 4):
        table(L, res, ranks)
    carriers(L, out)
    checks(L, out)
    text = "\n".join(L) + "\n"
    open(f"{out}/summary.md", "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
