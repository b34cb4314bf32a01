"""Report of bench/gpu/profiler.sh: the markdown (stdout) and the raw data (JSON_OUT) from its
work folder.

Reads WORKDIR/meta.txt, jobs.txt, logs/<label>-rank<r>.jsonl (the records bench/gpu/profiler.py
wrote) and logs/<label>-rank<r>.log (NCCL's log and the rank's own lines).

  1. The four plugin types: rank 0's log lines of the plugins job that match each type's
     patterns (case-insensitive), verbatim, with whether the line that shows it loaded is there
     (NCCL 2.28.9's texts: "NET/Plugin: Loaded net plugin", "Using network BPF", "TUNER/Plugin:
     Using", "PROFILER/Plugin: Loaded", "ENV/Plugin: Using" / "Successfully loaded external env
     plugin"); every PROFILER/BPF line of that log, and the PROFILER/BPF finalize summaries and
     warnings of every job.
  2. Accuracy: per job, size and rank, the profiler's mean time per collective against the mean
     CUDA-event time; PASS when every collective was counted (delta count = N), every result was
     right and |profiler - CUDA| <= max(TOL_REL x CUDA, TOL_US).
  3. Overhead: per size, the median over rounds of each arm's time per collective, on / off,
     the spread (each round's on / off, and the worst pairing: min(on) / max(off) to
     max(on) / min(off)); goal on / off <= 1 + OVH_GOAL from OVH_GOAL_FROM bytes on, stated at
     smaller sizes.

Usage: profiler_report.py WORKDIR [JSON_OUT]
"""
import glob
import json
import os
import re
import statistics
import sys

from report_common import fmt_bytes, kv

TOL_REL = float(os.environ.get("TOL_REL", "0.10"))  # accuracy: relative tolerance ...
TOL_US = float(os.environ.get("TOL_US", "5"))  # ... or this many µs, whichever is larger
OVH_GOAL = 0.01  # overhead goal: on / off <= 1.01 ...
OVH_GOAL_FROM = 65536  # ... from this size on
MAX_LINES = 40  # per plugin type in the report (the JSON has them all)

PATTERNS = {
    "net": r"NET/Plugin|Using network|Initialized NET plugin|Assigned NET plugin|external network plugin|NCCL_NET_PLUGIN|NET/BPF",
    "tuner": r"TUNER/Plugin|TUNER/BPF|tuner|NCCL_TUNER_PLUGIN",
    "profiler": r"PROFILER/Plugin|PROFILER/BPF|profiler plugin|NCCL_PROFILER_PLUGIN",
    "env": r"ENV/Plugin|ENV/BPF|env plugin|NCCL_ENV_PLUGIN",
}
# A line that shows the type loaded (NCCL 2.28.9's texts; the first found is shown).
LOADED = {
    "net": [r"Using network BPF\b", r"NET/Plugin: Loaded net plugin BPF", r"Initialized NET plugin BPF"],
    "tuner": [r"TUNER/Plugin: Using ", r"Successfully loaded external tuner plugin"],
    "profiler": [r"PROFILER/Plugin: Loaded ", r"Successfully loaded external profiler plugin"],
    "env": [r"ENV/Plugin: Using ", r"Successfully loaded external env plugin"],
}
# Lines that say it did not.
NOT_LOADED = {
    "net": [r"Failed to initialize NET plugin", r"External network plugin .* is unsupported", r"NET/Plugin: .*: "],
    "tuner": [r"External tuner plugin .* is unsupported"],
    "profiler": [r"External profiler plugin .* is unsupported", r"Profiler init failed"],
    "env": [r"External env plugin .* is unsupported", r"ENV/Plugin: .*: "],
}
NOISE = re.compile(r"NET/BPF closed |via NET/")


def f(x, nd=2):
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:.0f}"
    if abs(x) >= 100:
        return f"{x:.1f}"
    if abs(x) < 0.01 and x != 0:
        return f"{x:.2g}"
    return f"{x:.{nd}f}"


def read_lines(path):
    try:
        with open(path, errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def records(w):
    out, errors = [], []
    for p in sorted(glob.glob(os.path.join(w, "logs", "*.jsonl"))):
        for i, line in enumerate(read_lines(p)):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                errors.append(f"{os.path.basename(p)}:{i + 1}: {e}")
    return out, errors


def main():
    w = sys.argv[1]
    json_out = sys.argv[2] if len(sys.argv) > 2 else None
    meta_lines = read_lines(os.path.join(w, "meta.txt"))
    meta = {}
    for line in meta_lines:
        if "=" in line and " " not in line.split("=", 1)[0]:
            k, v = line.split("=", 1)
            meta[k] = v
    jobs, skipped = [], []
    for line in read_lines(os.path.join(w, "jobs.txt")):
        if line.startswith("JOB "):
            jobs.append(kv(line))
        elif line.startswith("SKIPPED "):
            skipped.append(kv(line))
    recs, rec_errors = records(w)
    data = {"meta": meta_lines, "jobs": jobs, "skipped": skipped, "record_errors": rec_errors,
            "tolerance": {"rel": TOL_REL, "us": TOL_US}, "overhead_goal": {"ratio": 1 + OVH_GOAL, "from_bytes": OVH_GOAL_FROM}}
    verdicts = []
    L = []
    P = L.append
    P("# GPU check of the profiler plugin (ncclProfiler in libnccl-net-bpf.so)\n")
    P("Made by `bench/gpu/profiler.sh` (rank program `bench/gpu/profiler.py`, this report "
      "`bench/gpu/profiler_report.py`). Every rank a separate process and its own NCCL host on the one GPU "
      "(MPS, P2P/SHM off), so every byte between ranks crosses the net plugin; float32 all_reduce; every "
      "result checked.\n")
    P("```")
    L.extend(meta_lines)
    P("```\n")

    # Jobs.
    P("## Jobs\n")
    P("| job | kind | ranks | round | exit | seconds | channels via NET | via P2P/SHM | network | NCCL | ranks done | "
      "'PROFILER/Plugin: Loaded' lines | PROFILER/BPF lines |")
    P("|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|")
    bad_jobs = []
    for d in jobs:
        ok = d.get("rc") == "0" and d.get("via_other") == "0" and d.get("via_net", "0") != "0"
        prof = int(d.get("profiler_loaded", "0") or 0)
        note = ""
        if d.get("arm") == "off" and prof:
            ok, note = False, " (profiler loaded in the off arm!)"
        if d.get("arm") in ("on", "acc", "plugins") and not prof:
            note = " (no 'PROFILER/Plugin: Loaded' line)"
        if not ok:
            bad_jobs.append(d.get("label"))
        P(f"| {d.get('label')}{note} | {d.get('kind')} | {d.get('ranks')} | {d.get('round')} | {d.get('rc')} | {d.get('seconds')} | "
          f"{d.get('via_net')} | {d.get('via_other')} | {d.get('network')} | {d.get('nccl')} | {d.get('done')} | "
          f"{d.get('profiler_loaded')} | {d.get('profiler_bpf_lines')} |")
    for d in skipped:
        P(f"| {d.get('label')} | {d.get('kind')} | {d.get('ranks')} | {d.get('round')} | skipped ({d.get('reason')}: "
          f"{d.get('left')} left, {d.get('expected')} expected) | | | | | | | | |")
    P("")
    if rec_errors:
        P("Records that could not be read: " + "; ".join(rec_errors[:10]) + "\n")
    verdicts.append(f"- every job ran to the end with all its channels via NET (and no profiler in the off arm): "
                    f"{'yes' if not bad_jobs and jobs else 'NO'}"
                    + (f" (not: {', '.join(bad_jobs)})" if bad_jobs else "")
                    + (f"; {len(skipped)} skipped for the deadline" if skipped else ""))

    # 1. Four plugin types.
    P("## 1. Four plugin types from one library\n")
    arm_line = next((l for l in meta_lines if l.startswith("arm plugins ")), "")
    P(f"Job plugins-n2: `{arm_line[len('arm plugins '):]}`, NCCL_TUNER_PLUGIN and NCCL_PROFILER_PLUGIN unset; "
      f"rank 0's log, lines matching each type's patterns (case-insensitive), verbatim; 'closed' and channel "
      f"lines left out.\n")
    sym = next((l for l in meta_lines if l.startswith("lib_symbols ")), None)
    if sym:
        P(f"Plugin table names in the library's strings (its exported symbols): `{sym[len('lib_symbols '):].strip() or 'none found'}`\n")
    log0 = read_lines(os.path.join(w, "logs", "plugins-n2-rank0.log"))
    data["plugin_lines"] = {}
    data["plugin_loaded"] = {}
    if not log0:
        P("No log of the plugins job (skipped or not run).\n")
    for t, pat in PATTERNS.items():
        rx = re.compile(pat, re.I)
        lines = [l for l in log0 if rx.search(l) and not NOISE.search(l)]
        data["plugin_lines"][t] = lines
        found = next((l for l in log0 for p in LOADED[t] if re.search(p, l)), None)
        against = next((l for l in log0 for p in NOT_LOADED[t] if re.search(p, l) and not NOISE.search(l)), None)
        data["plugin_loaded"][t] = {"evidence": found, "against": against}
        status = "loaded (by the line below)" if found else "NO line showing it loaded"
        if against:
            status += "; but also: `" + against.strip() + "`"
        P(f"**{t}**: {status}" + (f": `{found.strip()}`" if found else ""))
        P("")
        P("```")
        for l in lines[:MAX_LINES]:
            P(l)
        if len(lines) > MAX_LINES:
            P(f"... {len(lines) - MAX_LINES} more (all in profiler.json)")
        if not lines:
            P("(none)")
        P("```\n")
    loaded = [t for t in PATTERNS if data["plugin_loaded"][t]["evidence"]]
    verdicts.append(f"- plugin types with a line showing them loaded from the one library (rank 0, plugins job): "
                    f"{', '.join(loaded) or 'none'}; without: {', '.join(t for t in PATTERNS if t not in loaded) or 'none'} "
                    f"(heuristic on NCCL 2.28.9's texts: judge the lines above)")
    pl = [r for r in recs if r.get("label") == "plugins-n2" and r.get("kind") == "acc"]
    if pl:
        P("The profiler counted in this configuration (rank, size, N, delta count, mean CUDA-event µs, mean "
          "profiler µs, checked (wrong)):\n")
        P("| rank | size | variant | N | Δcount | CUDA µs | profiler µs | checked (wrong) | scrape |")
        P("|---:|---:|---|---:|---:|---:|---:|---|---|")
        for r in sorted(pl, key=lambda r: (r["size"], r.get("variant", ""), r["rank"])):
            P(f"| {r['rank']} | {fmt_bytes(r['bytes'])} | {r.get('variant', '?')} | {r['iters']} | {f(r.get('dcount'), 0)} | {f(r['cuda_us_mean'])} | "
              f"{f(r.get('prof_us_mean'))} | {r['checks']} ({r['bad']}) | {r.get('scrape_error') or 'ok'} |")
        P("")
    bpf0 = [l for l in log0 if "PROFILER/BPF" in l]
    P("Every PROFILER/BPF line of that log (the profiler's own: event mask, finalize summary):\n")
    P("```")
    L.extend(bpf0[:MAX_LINES] or ["(none)"])
    if len(bpf0) > MAX_LINES:
        P(f"... {len(bpf0) - MAX_LINES} more")
    P("```\n")
    data["profiler_bpf_lines_plugins_rank0"] = bpf0
    summ = []
    for p in sorted(glob.glob(os.path.join(w, "logs", "*-rank*.log"))):
        name = os.path.basename(p)[:-4]
        for l in read_lines(p):
            if "PROFILER/BPF" in l and ("operations timed" in l or " WARN " in l or "event mask" in l):
                summ.append(f"{name}: {l[l.find('PROFILER/BPF'):] if 'PROFILER/BPF' in l else l}")
    data["profiler_bpf_summaries"] = summ
    if summ:
        P("PROFILER/BPF event-mask, finalize-summary and warning lines of every job and rank (from the tag on):\n")
        P("```")
        L.extend(summ[:120])
        if len(summ) > 120:
            P(f"... {len(summ) - 120} more (all in profiler.json)")
        P("```\n")
    nwarn = sum(1 for s in summ if " WARN " in s)
    fin = [s for s in summ if "operations timed" in s]
    verdicts.append(f"- PROFILER/BPF finalize summaries: {len(fin)} over all jobs and ranks; warning lines: {nwarn}")

    # 2. Accuracy.
    acc = [r for r in recs if r.get("kind") == "acc" and str(r.get("label", "")).startswith("acc-")]
    acc_end = [r for r in recs if r.get("kind") == "acc_end"]
    P("## 2. Accuracy: the profiler's per-collective GPU time against CUDA events\n")
    P(f"Per size and variant, N calls each bracketed by CUDA events (current stream) and synchronized; the profiler's mean is "
      f"Δ`_sum` / Δ`_count` of the duration histogram (collective allreduce, the size's bucket, this pid, all label "
      f"sets) between a scrape before and one after the N calls. Tolerance: |profiler − CUDA| ≤ max({TOL_REL:g} × CUDA, "
      f"{TOL_US:g} µs); every collective must be counted (Δcount = N) and every result right. 'warm-up counted' is the "
      f"bucket's count (timed + untimed) before the N calls against the calls of that size made before (the bucket is the "
      f"size's own). The profiler times first channel start to last channel end on the GPU clock. Variants: **queued** = "
      f"a `torch.cuda._sleep` spin on the stream before the start event, so both events and the collective are queued "
      f"before the GPU reaches them (GPU time only: the like-for-like comparison); **plain** = record, all_reduce, "
      f"record on an idle stream, so the CUDA-event time also holds the host's launch latency (torch's and NCCL's "
      f"enqueue) that no GPU-clock profiler sees: expect profiler/CUDA below 1 there at small sizes.\n")
    rows = []
    for r in acc:
        problems = []
        cuda = r["cuda_us_mean"]
        prof = r.get("prof_us_mean")
        tol = max(TOL_REL * cuda, TOL_US)
        if r.get("scrape_error"):
            problems.append("NO ENDPOINT")
        if r.get("bad"):
            problems.append("WRONG RESULT")
        if not r.get("scrape_error"):
            if r.get("dcount") != r["iters"]:
                problems.append(f"COUNT {f(r.get('dcount'), 0)}≠{r['iters']}")
            if prof is None:
                problems.append("NO TIME")
            elif abs(prof - cuda) > tol:
                problems.append("OUT OF TOLERANCE")
        verdict = "PASS" if not problems else "FAIL: " + ", ".join(problems)
        rows.append(dict(r, tol_us=tol, diff_us=(prof - cuda) if prof is not None else None,
                         ratio=(prof / cuda) if prof is not None and cuda > 0 else None, verdict=verdict))
    data["accuracy"] = rows
    data["accuracy_end"] = acc_end
    vorder = {"queued": 0, "plain": 1}
    groups = sorted({(r["label"], r.get("variant", "plain")) for r in rows},
                    key=lambda g: (len(g[0]), g[0], vorder.get(g[1], 9), g[1]))
    for label, variant in groups:
        sub = sorted((r for r in rows if r["label"] == label and r.get("variant", "plain") == variant),
                     key=lambda r: (r["size"], r["rank"]))
        P(f"### {label} ({sub[0]['ranks']} ranks), {variant}\n")
        P("| size | rank | N | Δcount | Δuntimed | warm-up counted | CUDA µs mean | (median; min–max) | profiler µs mean | "
          "profiler / CUDA | diff µs | tolerance µs | verdict | label sets (algorithm/protocol: Δcount) | checked (wrong) |")
        P("|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|---|---|")
        for r in sub:
            sets = ", ".join(f"{s.get('algorithm', '?')}/{s.get('protocol', '?')}: {f(s.get('dcount'), 0)}"
                             + (f" (+{f(s['duntimed'], 0)} untimed)" if s.get("duntimed") else "")
                             for s in r.get("label_sets", []))
            warm = (f"{f(r['before_count'] + r.get('before_untimed', 0), 0)} / {r.get('expected_before', r['warmup'])}"
                    if r.get("before_count") is not None else "n/a")
            P(f"| {fmt_bytes(r['bytes'])} | {r['rank']} | {r['iters']} | {f(r.get('dcount'), 0)} | {f(r.get('duntimed'), 0)} | {warm} | "
              f"{f(r['cuda_us_mean'])} | {f(r['cuda_us_median'])}; {f(r['cuda_us_min'])}–{f(r['cuda_us_max'])} | "
              f"{f(r.get('prof_us_mean'))} | {f(r.get('ratio'), 3)} | {f(r.get('diff_us'))} | {f(r['tol_us'])} | {r['verdict']} | "
              f"{sets or (r.get('scrape_error') or '')} | {r['checks']} ({r['bad']}) |")
        P("")
        ends = sorted((e for e in acc_end if e.get("label") == label), key=lambda e: e["rank"])
        if ends and variant == max((g[1] for g in groups if g[0] == label), key=lambda v: vorder.get(v, 9)):
            P("At the end of the job (each rank's endpoint):\n")
            P("| rank | misuse_total | nonzero reasons | open events | operations (outcome: count) | untimed (any) | scrapes (failed) |")
            P("|---:|---:|---|---:|---|---|---|")
            for e in ends:
                if e.get("scrape_error"):
                    P(f"| {e['rank']} | n/a | scrape failed: {e['scrape_error']} | | | | {e.get('scrapes')} ({e.get('scrape_failures')}) |")
                    continue
                reasons = ", ".join(f"{p['labels'].get('reason', '?')}={f(p['value'], 0)}" for p in e.get("misuse_nonzero", []))
                ops = ", ".join(f"{p['labels'].get('outcome', '?')}={f(p['value'], 0)}" for p in e.get("operations", []))
                unt = ", ".join(f"{p['labels'].get('collective', '?')}/{p['labels'].get('size_bytes', '?')}={f(p['value'], 0)}"
                                for p in e.get("untimed_all", []))
                mis = e.get("misuse_total")
                P(f"| {e['rank']} | {'absent' if mis is None else f(mis, 0)} | {reasons or '-'} | "
                  f"{'absent' if e.get('open_events') is None else f(e['open_events'], 0)} | {ops or '-'} | {unt or '-'} | "
                  f"{e.get('scrapes')} ({e.get('scrape_failures')}) |")
            P("")
    for variant in sorted({r.get("variant", "plain") for r in rows}, key=lambda v: vorder.get(v, 9)):
        vr = [r for r in rows if r.get("variant", "plain") == variant]
        npass = sum(1 for r in vr if r["verdict"] == "PASS")
        failing = [f"{r['label']} {fmt_bytes(r['bytes'])} rank {r['rank']}: {r['verdict'][6:]}" for r in vr if r["verdict"] != "PASS"]
        ratios = [r["ratio"] for r in vr if r.get("ratio") is not None]
        verdicts.append(f"- accuracy, {variant} CUDA events: within max({TOL_REL:g} × CUDA, {TOL_US:g} µs), every collective "
                        f"counted, every result right: {'PASS' if npass == len(vr) else 'FAIL'}, {npass} of {len(vr)} "
                        f"(job, size, rank) points"
                        + (f"; profiler / CUDA {f(min(ratios), 3)}–{f(max(ratios), 3)} (median {f(statistics.median(ratios), 3)})" if ratios else "")
                        + ("" if not failing else f"; failing: {'; '.join(failing[:8])}" + (f"; … {len(failing) - 8} more" if len(failing) > 8 else "")))
    if not rows:
        verdicts.append("- accuracy: no points")
    unreachable = sorted({f"{r['label']} rank {r['rank']} ({r['scrape_error']})" for r in recs
                          if r.get("kind") in ("acc", "acc_end") and r.get("scrape_error")})
    if any(r.get("kind") == "acc" for r in recs):
        verdicts.append("- metrics endpoint (NCCL_BPF_METRICS_ADDR) reachable from every rank: "
                        + ("yes" if not unreachable else f"NO: {'; '.join(unreachable[:6])}"
                           + (f"; … {len(unreachable) - 6} more" if len(unreachable) > 6 else "")))
    if acc_end:
        mis = [e.get("misuse_total") for e in acc_end]
        opn = [e.get("open_events") for e in acc_end]
        verdicts.append(f"- misuse at the end of every accuracy job: "
                        f"{'0 everywhere' if mis and all(m == 0 for m in mis) else 'NOT 0 or not read: ' + ', '.join(map(str, mis))}; "
                        f"open events: {', '.join('n/a' if o is None else f(o, 0) for o in opn)}")

    # 3. Overhead.
    ovh = [r for r in recs if r.get("kind") == "ovh"]
    P("## 3. Overhead: profiler on against off\n")
    P("Arms: on = `" + next((l[len('arm on '):] for l in meta_lines if l.startswith("arm on ")), "?") + "`; off = `"
      + next((l[len('arm off '):] for l in meta_lines if l.startswith("arm off ")), "?") + "`. Per job and size, "
      "OVH_BATCHES batches of K back-to-back all_reduces between CUDA events, time per collective of the median batch "
      "(slowest rank); per arm the median over rounds (rounds' min–max); busbw = 2(n−1)/n × bytes / time. on/off of the "
      "medians; spread: each round's on/off, and the worst pairing min(on)/max(off)–max(on)/min(off).\n")
    summary = []
    if ovh:
        P("| size | K | on µs | (rounds) | off µs | (rounds) | on / off | per round on/off | worst pairing | busbw on GB/s | busbw off GB/s | checked (wrong) | goal |")
        P("|---:|---|---:|---|---:|---|---:|---|---|---:|---:|---|---|")
        for size in sorted({r["size"] for r in ovh}):
            by = {a: sorted((r for r in ovh if r["size"] == size and r["arm"] == a), key=lambda r: r["round"]) for a in ("on", "off")}
            ks = sorted({r["k"] for r in ovh if r["size"] == size})
            nbytes = next(r["bytes"] for r in ovh if r["size"] == size)
            nr = next(r["ranks"] for r in ovh if r["size"] == size)
            chk = sum(r["checks"] for r in ovh if r["size"] == size)
            wrong = sum(r["bad"] for r in ovh if r["size"] == size)
            on = [r["us_median"] for r in by["on"]]
            off = [r["us_median"] for r in by["off"]]
            s = {"size": size, "bytes": nbytes, "ranks": nr, "k": ks, "on_us": on, "off_us": off, "checks": chk, "bad": wrong}
            if on and off:
                mon, moff = statistics.median(on), statistics.median(off)
                ratio = mon / moff
                pairs = {}
                for r in by["on"]:
                    o = [x for x in by["off"] if x["round"] == r["round"]]
                    if o:
                        pairs[r["round"]] = r["us_median"] / o[0]["us_median"]
                lo, hi = min(on) / max(off), max(on) / min(off)
                bw = lambda us: 2 * (nr - 1) / nr * nbytes / (us * 1e-6) / 1e9  # noqa: E731
                if wrong:
                    goal = "WRONG RESULT"
                elif size >= OVH_GOAL_FROM:
                    goal = ("PASS" if ratio <= 1 + OVH_GOAL else "FAIL") + (
                        " (every round too)" if pairs and max(pairs.values()) <= 1 + OVH_GOAL else "")
                else:
                    goal = f"stated: {100 * (ratio - 1):+.1f}% ({f(mon - moff)} µs)"
                s.update(on_median=mon, off_median=moff, ratio=ratio, per_round=pairs, worst=[lo, hi], goal=goal,
                         busbw_on=bw(mon), busbw_off=bw(moff))
                P(f"| {fmt_bytes(nbytes)} | {'/'.join(map(str, ks))} | {f(mon)} | {f(min(on))}–{f(max(on))} | {f(moff)} | "
                  f"{f(min(off))}–{f(max(off))} | {ratio:.4f} | "
                  f"{', '.join(f'r{k} {v:.4f}' for k, v in sorted(pairs.items()))} | {lo:.4f}–{hi:.4f} | "
                  f"{bw(mon):.4g} | {bw(moff):.4g} | {chk} ({wrong}) | {goal} |")
            else:
                s["goal"] = "missing an arm"
                P(f"| {fmt_bytes(nbytes)} | {'/'.join(map(str, ks))} | {f(statistics.median(on)) if on else 'n/a'} | | "
                  f"{f(statistics.median(off)) if off else 'n/a'} | | n/a | | | | | {chk} ({wrong}) | missing an arm |")
            summary.append(s)
        P("")
        rounds = sorted({r["round"] for r in ovh})
        P(f"Rounds measured: {', '.join(map(str, rounds))}; each job's batches are in profiler.json (`overhead.records`).\n")
    else:
        P("No overhead figures.\n")
    data["overhead"] = {"records": ovh, "summary": summary}
    big = [s for s in summary if s["size"] >= OVH_GOAL_FROM and "ratio" in s]
    small = [s for s in summary if s["size"] < OVH_GOAL_FROM and "ratio" in s]
    if big:
        ok = [s for s in big if s["ratio"] <= 1 + OVH_GOAL and not s["bad"]]
        worst = max(big, key=lambda s: s["ratio"])
        verdicts.append(f"- overhead < {100 * OVH_GOAL:g}% from {fmt_bytes(OVH_GOAL_FROM)} on (median on / median off): "
                        f"{'PASS' if len(ok) == len(big) else 'FAIL'}, {len(ok)} of {len(big)} sizes (worst "
                        f"{100 * (worst['ratio'] - 1):+.2f}% at {fmt_bytes(worst['bytes'])}; its rounds "
                        f"{', '.join(f'{100 * (v - 1):+.2f}%' for _, v in sorted(worst['per_round'].items()))})")
    else:
        verdicts.append("- overhead: no sizes with both arms")
    for s in small:
        verdicts.append(f"- overhead at {fmt_bytes(s['bytes'])}: {100 * (s['ratio'] - 1):+.2f}% "
                        f"({f(s['on_median'])} µs on, {f(s['off_median'])} µs off; worst pairing "
                        f"{100 * (s['worst'][0] - 1):+.1f}% to {100 * (s['worst'][1] - 1):+.1f}%)")
    # 4. Paired: on and off in the same processes.
    paired = [r for r in recs if r.get("kind") == "paired"]
    if paired:
        P("## 4. Overhead, paired: profiler on and off in the same processes\n")
        P("One job, 2 ranks, the profiler loaded: per size, pairs of batches of K back-to-back all_reduces, one with "
          "the profiler on (`ncclBpfProfilerResume`: NCCL's mask as the profiler chose it) and one off "
          "(`ncclBpfProfilerPause`: mask 0, no events), order alternated, two untimed calls after each switch; time per "
          "collective of each batch (slowest rank); the ratio on/off of the two batches of each pair, median and "
          "quartiles over the pairs.\n")
        P("| size | K | pairs | on µs (median) | off µs (median) | on / off, median of pairs | quartiles | checked (wrong) |")
        P("|---:|---:|---:|---:|---:|---:|---|---|")
        for r in sorted(paired, key=lambda r: r["bytes"]):
            P(f"| {fmt_bytes(r['bytes'])} | {r['k']} | {r['pairs']} | {f(r['on_median'])} | {f(r['off_median'])} | "
              f"{r['ratio_median']:.4f} | {r['ratio_q1']:.4f}–{r['ratio_q3']:.4f} | {r['checks']} ({r['bad']}) |")
            verdicts.append(f"- paired overhead at {fmt_bytes(r['bytes'])}: {100 * (r['ratio_median'] - 1):+.2f}% "
                            f"(quartiles {100 * (r['ratio_q1'] - 1):+.2f}% to {100 * (r['ratio_q3'] - 1):+.2f}%, "
                            f"{r['pairs']} pairs)")
        P("")
    chk = sum(r.get("checks", 0) for r in recs if r.get("kind") in ("acc", "ovh", "paired"))
    bad = sum(r.get("bad", 0) for r in recs if r.get("kind") in ("acc", "ovh", "paired"))
    verdicts.insert(0, f"- every result correct: {'yes' if bad == 0 and chk > 0 else 'NO'} ({chk} calls checked, {bad} wrong)")

    P("## Verdicts\n")
    P("\n".join(verdicts) + "\n")
    data["verdicts"] = verdicts
    print("\n".join(L))
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
