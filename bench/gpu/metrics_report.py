"""Report of bench/gpu/metrics.sh: OUTDIR/summary.md from the scrapes, logs and status outputs.

Usage: metrics_report.py OUTDIR
"""
import glob
import os
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(path):
    """[(name, {label: value}, value)] of a Prometheus text exposition."""
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


def total(ss, name, **want):
    return sum(v for n, l, v in ss if n == name and all(l.get(k) == str(x) for k, x in want.items()))


def timing(path):
    try:
        t0, dt, ok = open(path + ".time").read().split()
        return float(t0), float(dt), ok
    except (OSError, ValueError):
        return None, None, "missing"


def main():
    out = sys.argv[1]
    meta = open(f"{out}/meta.txt").read() if os.path.exists(f"{out}/meta.txt") else ""
    logs = {int(m.group(1)): open(p).read() for p in glob.glob(f"{out}/rank*.log")
            for m in [re.search(r"rank(\d+)\.log$", p)] if m}
    phase1 = {}
    done = {}
    for r, text in logs.items():
        m = re.search(r"^PHASE1 rank=(\d+) pid=(\d+) checks=(\d+) bad=(\d+) bytes=(\d+) seconds=([\d.]+) expected_sent_all_ranks=(\d+)", text, re.M)
        if m:
            phase1[r] = dict(pid=m.group(2), checks=int(m.group(3)), bad=int(m.group(4)), bytes=int(m.group(5)),
                             seconds=float(m.group(6)), expected=int(m.group(7)))
        m = re.search(r"^DONE rank=(\d+) checks=(\d+) bad=(\d+)", text, re.M)
        if m:
            done[r] = (int(m.group(2)), int(m.group(3)))
    exp = samples(f"{out}/phase1-exporter.prom")
    L = []
    P = L.append
    P("# Metrics of a running PyTorch job on the GPU machine (issue 10)\n")
    P("Made by `bench/gpu/metrics.sh` (report: `bench/gpu/metrics_report.py`).\n")
    P("```\n" + meta.strip() + "\n```\n")
    verdicts = []
    expected = next(iter(phase1.values()))["expected"] if phase1 else None
    sent = total(exp, "nccl_net_sent_bytes_total")
    recv = total(exp, "nccl_net_received_bytes_total")
    pids = {v["pid"] for v in phase1.values()}
    P("## After phase 1 (every rank done, counters standing still)\n")
    P("| what | bytes | / expected |\n|---|---:|---:|")
    if expected:
        P(f"| expected: N1 × 2 (n − 1) × BYTES (Ring/Simple) | {expected} | 1.000000 |")
        P(f"| exporter: nccl_net_sent_bytes_total, all series | {sent:.0f} | {sent / expected:.6f} |")
        P(f"| exporter: nccl_net_received_bytes_total, all series | {recv:.0f} | {recv / expected:.6f} |")
        verdicts.append(("exporter's sent and received totals equal the bytes the all_reduces moved", sent == expected and recv == expected))
    P("")
    P("| rank | pid | all_reduces checked (bad) | sent by the exporter | sent by its own endpoint | received by the exporter | received by its endpoint | connection ends (exporter) |")
    P("|---:|---:|---:|---:|---:|---:|---:|---:|")
    same = True
    for r in sorted(phase1):
        pid = phase1[r]["pid"]
        own = samples(f"{out}/phase1-rank{r}.prom")
        es, er = total(exp, "nccl_net_sent_bytes_total", pid=pid), total(exp, "nccl_net_received_bytes_total", pid=pid)
        os_, or_ = total(own, "nccl_net_sent_bytes_total", pid=pid), total(own, "nccl_net_received_bytes_total", pid=pid)
        others = {l.get("pid") for n, l, v in own if "pid" in l} - {pid}
        conns = total(exp, "nccl_net_connections", pid=pid)
        same = same and es == os_ and er == or_ and not others and bool(own)
        P(f"| {r} | {pid} | {phase1[r]['checks']} ({phase1[r]['bad']}) | {es:.0f} | {os_:.0f} | {er:.0f} | {or_:.0f} | {conns:.0f} |")
    verdicts.append(("every rank's in-process endpoint serves its own process only, with the exporter's figures", same))
    verdicts.append(("every all_reduce was right on every rank", all(v["bad"] == 0 for v in phase1.values())
                     and len(done) == len(phase1) and all(b == 0 for _, b in done.values())))
    foreign = {l.get("pid") for n, l, v in exp if "pid" in l} - pids
    P(f"\nProcesses in the exporter's scrape: {sorted({l.get('pid') for n, l, v in exp if 'pid' in l})} (the job's: {sorted(pids)}).\n")
    verdicts.append(("the exporter serves the job's processes and no other", not foreign and bool(exp)))
    # The frozen rank.
    t0, dt, ok = timing(f"{out}/frozen-exporter.prom")
    fz = open(f"{out}/freeze.txt").read() if os.path.exists(f"{out}/freeze.txt") else ""
    P("## A rank frozen mid-transfer (SIGSTOP)\n")
    P("```\n" + fz.strip() + "\n```\n")
    P(f"The exporter's scrape while it was stopped: {ok}, in {dt if dt is not None else '?'} s.\n")
    verdicts.append(("the exporter answered while a rank was stopped", ok == "200" and dt is not None and dt < 3))
    st = open(f"{out}/status-frozen.txt").read() if os.path.exists(f"{out}/status-frozen.txt") else ""
    frozen_pid = re.search(r"SIGSTOP rank \d+ pid (\d+)", fz)
    stalled = [l.strip() for l in st.splitlines() if l.strip().startswith("STALLED")]
    P("`ncclbpf status --all --stall-after 2` while it was stopped:\n")
    P("```\n" + st.strip() + "\n```\n")
    named = frozen_pid is not None and any(f"(pid {frozen_pid.group(1)})" in l for l in stalled)
    verdicts.append(("status names stalled connections whose peer is the frozen rank", named))
    for name in ("status-phase1.txt", "status-resumed.txt"):
        if os.path.exists(f"{out}/{name}"):
            P(f"`{name}`:\n\n```\n{open(f'{out}/{name}').read().strip()}\n```\n")
    times = [timing(p)[1] for p in sorted(glob.glob(f"{out}/scrapes/*.prom"))]
    times = [t for t in times if t is not None]
    if times:
        P(f"Scrapes during the job: {len(times)}, answer time median {sorted(times)[len(times) // 2]:.4f} s, max {max(times):.4f} s.\n")
    head = ["## Verdict\n", "| check | |", "|---|---|"] + [f"| {t} | {'pass' if v else '**FAIL**'} |" for t, v in verdicts]
    text = "\n".join(L[:3] + head + [""] + L[3:]) + "\n"
    open(f"{out}/summary.md", "w").write(text)
    print(f"wrote {out}/summary.md: {sum(v for _, v in verdicts)} of {len(verdicts)} checks pass")


if __name__ == "__main__":
    main()
