"""One rank of the GPU check of the profiler plugin; run by bench/gpu/profiler.sh.

Every rank is its own process (and its own NCCL host) on the one GPU, as in bench/gpu/e2e.py.
float32 all_reduce (in place) at each size in SIZES; SIZE is the buffer's bytes (elements
max(1, SIZE / 4)).

MODE=accuracy (also the "four plugin types" job of profiler.sh, with few iterations)
  Per size: WARMUP checked calls, then for each variant in ACC_VARIANTS, N calls (ITERS;
  ITERS_LARGE from LARGE_FROM bytes on), each one bracketed by torch.cuda.Event(enable_timing=
  True) records on the current stream before and after, and synchronized: a CUDA-event time per
  collective. Variants:
    plain   fill, record, all_reduce, record, synchronize: the start event is reached while the
            host is still in torch's and NCCL's enqueue, so the time also holds that launch
            latency (tens of µs, which the profiler's GPU-clock time does not see);
    queued  the same with torch.cuda._sleep(SLEEP_CYCLES) on the stream before the start event,
            so the event, the collective and the end event are queued before the GPU reaches
            them: GPU time only (skipped, and said, if torch has no _sleep).
  Every call's result is checked (buffer filled with rank + 1 before the start event; expected
  n (n + 1) / 2).
  The profiler's time comes from this process's metrics endpoint (NCCL_BPF_METRICS_ADDR, read
  like the plugin does: host:port, :port or port, plus LOCAL_RANK when the port is not 0; or
  SCRAPE_URL): scraped before the N calls (once the count of the size's bucket stands still)
  and after them (once it reached before + N, or SETTLE_S passed), for each variant apart, the histogram
  METRIC_DURATION's _sum and _count summed over every label set with collective COLL_VALUE
  and the size's bucket (size_bytes = the power of two at or above the bytes) of this pid.
  Mean profiler time = delta _sum / delta _count, against the mean CUDA-event time; delta count
  against N. No collective of this communicator runs between the two scrapes but the N.
  At the end, the misuse counter, the open-events gauge and the operations counter, and the
  profiler's families of the last scrape into PROM_DUMP.
  An endpoint that cannot be reached is recorded (scrape_error), never fatal.

MODE=overhead
  Per size: WARMUP checked calls (rank + 1 -> n (n + 1) / 2), then K calls back to back between
  two CUDA events on the current stream, OVH_BATCHES times; time per collective = batch time /
  K, the slowest rank's per batch (all_reduce MAX afterwards, outside the timing). The timed
  calls run on a zeroed buffer (so nothing overflows) that must still be zero afterwards. K:
  from OVH_K ("size:k,size:k"; profiler.sh passes the first job's to every later one, so every
  arm and round runs the same K), else clamp(OVH_BATCH_S / estimate, OVH_KMIN, OVH_KMAX) with
  rank 0's estimate (5 calls) broadcast. Rank 0 prints "OVH_K size=S k=K".

Output: one JSON object per line appended to RESULT_FILE (rank 0 and every other rank: "acc"
records per size and rank, "acc_end" per rank, "ovh" per size from rank 0, "done" per rank),
and short lines on stdout. Exit status 1 if any check failed, 2 on a bad setting.

Settings (environment): MODE, LABEL, ARM, ROUND (labels only), SIZES, ITERS (50), ITERS_LARGE
(20), LARGE_FROM (67108864), WARMUP (5), ACC_VARIANTS ("queued plain"), SLEEP_CYCLES (300000,
about 150 µs at 2 GHz), SETTLE_S (3), OVH_BATCH_S (0.2), OVH_BATCHES (5),
OVH_KMIN (3), OVH_KMAX (4000), OVH_K, RESULT_FILE, PROM_DUMP, SCRAPE_URL.
"""
import ctypes
import gc
import json
import os
import re
import statistics
import sys
import time
import urllib.error
import urllib.request

T_START = time.perf_counter()
try:  # torch is only on the GPU machine; py_compile and --help work without it
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover
    torch = dist = None

# ---- The metrics this check reads (adjust here if the exposition's names change) ----------
METRIC_DURATION = "nccl_collective_duration_seconds"  # histogram: _sum (s), _count
METRIC_UNTIMED = "nccl_collective_untimed_total"  # same labels, operations without a GPU time
METRIC_MISUSE = "ncclbpf_profiler_misuse_total"  # by reason; must stay 0
# The open-events gauge: the first of these (name, labels that must match) found is used.
METRIC_OPEN_EVENTS = [("ncclbpf_profiler_open", {"what": "events"}), ("ncclbpf_profiler_open_events", {})]
METRIC_OPS = "ncclbpf_profiler_operations_total"  # by outcome (timed, untimed, reclaimed)
LABEL_COLL = "collective"
LABEL_SIZE = "size_bytes"
LABEL_PID = "pid"
COLL_VALUE = "allreduce"  # compared lower-case, without '_' and '-'
KEEP_LABELS = ("comm", "rank", "algorithm", "protocol")  # shown per label set in the report
DUMP_PREFIXES = ("nccl_collective", "ncclbpf_profiler")  # families kept in PROM_DUMP
SCRAPE_TIMEOUT_S = 3.0


def env_list(name, default):
    v = os.environ.get(name, default)
    return [x for x in v.replace(",", " ").split() if x]


MODE = os.environ.get("MODE", "accuracy")
LABEL = os.environ.get("LABEL", "?")
ARM = os.environ.get("ARM", "")
ROUND = int(os.environ.get("ROUND", "1"))
SIZES = [int(x) for x in env_list("SIZES", "8,65536,1048576,16777216,134217728")]
ITERS = int(os.environ.get("ITERS", "50"))
ITERS_LARGE = int(os.environ.get("ITERS_LARGE", "20"))
LARGE_FROM = int(os.environ.get("LARGE_FROM", str(64 << 20)))
WARMUP = int(os.environ.get("WARMUP", "5"))
SETTLE_S = float(os.environ.get("SETTLE_S", "3"))
ACC_VARIANTS = env_list("ACC_VARIANTS", "queued plain")
SLEEP_CYCLES = int(os.environ.get("SLEEP_CYCLES", "300000"))
OVH_BATCH_S = float(os.environ.get("OVH_BATCH_S", "0.2"))
OVH_BATCHES = int(os.environ.get("OVH_BATCHES", "5"))
OVH_KMIN = int(os.environ.get("OVH_KMIN", "3"))
OVH_KMAX = int(os.environ.get("OVH_KMAX", "4000"))
RESULT_FILE = os.environ.get("RESULT_FILE", "")
PROM_DUMP = os.environ.get("PROM_DUMP", "")


def parse_k(v):
    out = {}
    for part in v.replace(" ", ",").split(","):
        if ":" in part:
            s, k = part.split(":", 1)
            out[int(s)] = int(k)
    return out


OVH_K = parse_k(os.environ.get("OVH_K", ""))


def emit(rec):
    line = json.dumps(rec, sort_keys=True)
    if RESULT_FILE:
        with open(RESULT_FILE, "a") as f:
            f.write(line + "\n")
    else:
        print("RECORD " + line, flush=True)


def bucket_of(nbytes):
    """The profiler's size bucket (its upper bound): k holds (2^(k-1), 2^k] bytes."""
    return 1 << max(0, (nbytes - 1).bit_length())


def norm(s):
    return s.lower().replace("_", "").replace("-", "")


# ---- Prometheus text ------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(v):
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_prom(text):
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            val = float(m.group(3))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        out.append((m.group(1), labels, val))
    return out


def metrics_url():
    if os.environ.get("SCRAPE_URL"):
        return os.environ["SCRAPE_URL"], None
    v = os.environ.get("NCCL_BPF_METRICS_ADDR", "").strip()
    if not v:
        return None, "NCCL_BPF_METRICS_ADDR not set"
    host, port = "127.0.0.1", None
    if v.lstrip(":").isdigit():
        port = int(v.lstrip(":"))
    else:
        h, _, p = v.rpartition(":")
        if not p.isdigit():
            return None, f"NCCL_BPF_METRICS_ADDR={v!r}: no port"
        port = int(p)
        host = h.strip("[]") or "127.0.0.1"
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    lr = os.environ.get("LOCAL_RANK", "").strip()
    if port != 0 and lr.isdigit():
        port += int(lr)
    if port == 0:
        return None, "NCCL_BPF_METRICS_ADDR port 0 (the port file is not read here): give a port"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics", None


class Scraper:
    def __init__(self):
        self.url, self.error = metrics_url()
        self.pid = str(os.getpid())
        self.scrapes = 0
        self.failures = 0
        self.last_text = ""

    def get(self):
        """The samples of one scrape, or None (the error in self.error)."""
        if not self.url:
            return None
        try:
            with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as r:
                text = r.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.failures += 1
            self.error = f"{self.url}: {e}"
            return None
        self.scrapes += 1
        self.last_text = text
        return parse_prom(text)

    def mine(self, labels):
        return LABEL_PID not in labels or labels[LABEL_PID] == self.pid


def coll_series(scraper, samples, bound):
    """Per label set (without le) of METRIC_DURATION / METRIC_UNTIMED for COLL_VALUE at the
    bucket `bound`: {key: {"sum": s, "count": c, "untimed": u, "labels": {...}}}."""
    out = {}
    want = norm(COLL_VALUE)
    for name, labels, v in samples:
        if name == METRIC_DURATION + "_sum":
            part = "sum"
        elif name == METRIC_DURATION + "_count":
            part = "count"
        elif name == METRIC_UNTIMED:
            part = "untimed"
        else:
            continue
        if norm(labels.get(LABEL_COLL, "")) != want or not scraper.mine(labels):
            continue
        try:
            if int(float(labels.get(LABEL_SIZE, "nan"))) != bound:
                continue
        except ValueError:
            continue
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        d = out.setdefault(key, {"sum": 0.0, "count": 0.0, "untimed": 0.0,
                                 "labels": {k: labels[k] for k in KEEP_LABELS if k in labels}})
        d[part] += v
    return out


def totals(series):
    return (sum(d["sum"] for d in series.values()), sum(d["count"] for d in series.values()),
            sum(d["untimed"] for d in series.values()))


def family(scraper, samples, name, match=None):
    """Sum of `name` over this pid's label sets matching `match`, and the nonzero ones."""
    total, found, parts = 0.0, False, []
    for n, labels, v in samples:
        if n != name or not scraper.mine(labels):
            continue
        if match and any(labels.get(k) != x for k, x in match.items()):
            continue
        found = True
        total += v
        if v:
            parts.append({"labels": {k: x for k, x in labels.items() if k not in ("pid", "host")}, "value": v})
    return (total if found else None), parts


def main():
    if torch is None:
        print("profiler.py: torch is not importable here (run it on the GPU machine)", file=sys.stderr, flush=True)
        sys.exit(2)
    if MODE not in ("accuracy", "overhead", "paired"):
        print(f"profiler.py: unknown MODE {MODE!r} (accuracy, overhead, paired)", file=sys.stderr, flush=True)
        sys.exit(2)
    if any(v not in ("queued", "plain") for v in ACC_VARIANTS):
        print(f"profiler.py: ACC_VARIANTS {ACC_VARIANTS!r}: queued, plain", file=sys.stderr, flush=True)
        sys.exit(2)
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize
    # The communicator's first collective (connections, NCCL's setup) stays out of the figures:
    # 4 bytes, a bucket of its own.
    w = torch.ones(1, device=dev)
    dist.all_reduce(w)
    sync()
    t_init = time.perf_counter() - T_START
    base = {"label": LABEL, "arm": ARM, "round": ROUND, "ranks": n, "rank": rank, "pid": os.getpid(), "mode": MODE}
    expected = float(n * (n + 1) // 2)
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    checks = bad = 0
    gc.disable()  # no collector pauses inside the timed loops: collected between sizes instead

    def timed_size(size, fixed_k=None):
        """One size of the overhead and paired modes: a buffer after WARMUP checked calls, its
        error count, its bytes, and K (calls per timed batch: fixed_k, else from rank 0's
        estimate over 5 calls, broadcast, with the estimate in µs); the buffer is left zeroed."""
        gc.collect()
        c = max(1, size // 4)
        buf = torch.empty(c, dtype=torch.float32, device=dev)
        wrong = torch.zeros((), dtype=torch.int64, device=dev)
        for _ in range(WARMUP):  # checked
            buf.fill_(rank + 1)
            dist.all_reduce(buf)
            wrong += (buf != expected).any()
        sync()
        buf.zero_()
        if fixed_k is not None:
            return buf, wrong, c * 4, fixed_k, None
        e0.record()
        for _ in range(5):
            dist.all_reduce(buf)
        e1.record()
        e1.synchronize()
        t = torch.tensor([e0.elapsed_time(e1) * 1e3 / 5], dtype=torch.float64, device=dev)
        dist.broadcast(t, 0)
        est = t.item()
        return buf, wrong, c * 4, int(min(OVH_KMAX, max(OVH_KMIN, OVH_BATCH_S / max(est * 1e-6, 1e-9)))), est

    if MODE == "accuracy":
        sc = Scraper()
        first = sc.get()
        for _ in range(12):  # the endpoint starts with the first net init; give it 3 s
            if first is not None or not sc.url:
                break
            time.sleep(0.25)
            first = sc.get()
        print(f"rank {rank}: metrics {sc.url or '-'}: {'reachable' if first is not None else 'NOT reachable: ' + str(sc.error)}",
              flush=True)
        queued_missing = "queued" in ACC_VARIANTS and not hasattr(torch.cuda, "_sleep")
        variants = [v for v in ACC_VARIANTS if not (v == "queued" and queued_missing)]
        variants = variants or ["plain"]
        if queued_missing:
            print("note: torch.cuda._sleep missing: the queued variant is skipped", flush=True)

        def settle(bound, target=None):
            """Scrape until the bucket's count stands still (target None) or reached target;
            then once more 0.1 s later. Returns (series, seconds waited) or (None, s)."""
            t0 = time.perf_counter()
            prev = None
            while True:
                s = sc.get()
                if s is None:
                    return None, time.perf_counter() - t0
                ser = coll_series(sc, s, bound)
                c = totals(ser)[1] + totals(ser)[2]
                waited = time.perf_counter() - t0
                if target is None and prev is not None and c == prev:
                    return ser, waited
                if target is not None and c >= target:
                    time.sleep(0.1)
                    s2 = sc.get()
                    return (coll_series(sc, s2, bound) if s2 is not None else ser), time.perf_counter() - t0
                if waited > SETTLE_S:
                    return ser, waited
                prev = c
                time.sleep(0.1 if target is None else 0.05)

        for size in SIZES:
            gc.collect()
            c = max(1, size // 4)
            nbytes = c * 4
            bound = bucket_of(nbytes)
            iters = ITERS_LARGE if nbytes >= LARGE_FROM else ITERS
            buf = torch.empty(c, dtype=torch.float32, device=dev)
            wrong = torch.zeros((), dtype=torch.int64, device=dev)

            def one(queued):
                nonlocal wrong
                buf.fill_(rank + 1)
                if queued:
                    torch.cuda._sleep(SLEEP_CYCLES)
                e0.record()
                dist.all_reduce(buf)
                e1.record()
                e1.synchronize()
                wrong += (buf != expected).any()
                return e0.elapsed_time(e1) * 1e3  # µs

            for _ in range(WARMUP):
                one(False)
            sync()
            wbad = int(wrong.item())  # the warm-up's, counted with the first variant
            done_before = WARMUP  # calls of this size (bucket) made so far
            for vi, variant in enumerate(variants):
                wrong.zero_()
                before, wait_b = settle(bound) if sc.url else (None, 0.0)
                times = [one(variant == "queued") for _ in range(iters)]
                sync()
                nwrong = int(wrong.item())
                after, wait_a = (None, 0.0)
                if before is not None:
                    b_sum, b_cnt, b_unt = totals(before)
                    after, wait_a = settle(bound, target=b_cnt + b_unt + iters)
                if vi == 0:
                    nwrong += wbad
                rec = dict(base, kind="acc", variant=variant, size=size, bytes=nbytes, bucket=bound, iters=iters,
                           warmup=WARMUP, expected_before=done_before, checks=iters + (WARMUP if vi == 0 else 0),
                           bad=nwrong, sleep_cycles=SLEEP_CYCLES if variant == "queued" else 0,
                           cuda_us_mean=statistics.fmean(times), cuda_us_median=statistics.median(times),
                           cuda_us_min=min(times), cuda_us_max=max(times),
                           cuda_us_stdev=statistics.stdev(times) if len(times) > 1 else 0.0,
                           metrics_url=sc.url, scrape_error=None)
                if before is None or after is None:
                    rec["scrape_error"] = sc.error or "no scrape"
                else:
                    b_sum, b_cnt, b_unt = totals(before)
                    a_sum, a_cnt, a_unt = totals(after)
                    d_sum, d_cnt, d_unt = a_sum - b_sum, a_cnt - b_cnt, a_unt - b_unt
                    sets = []
                    for key, d in after.items():
                        p = before.get(key, {"sum": 0.0, "count": 0.0, "untimed": 0.0})
                        if d["count"] - p["count"] or d["untimed"] - p["untimed"]:
                            sets.append(dict(d["labels"], dcount=d["count"] - p["count"], dsum=d["sum"] - p["sum"],
                                             duntimed=d["untimed"] - p["untimed"]))
                    rec.update(before_count=b_cnt, before_untimed=b_unt, before_sum_s=b_sum, dsum_s=d_sum,
                               dcount=d_cnt, duntimed=d_unt, settle_before_s=wait_b, settle_after_s=wait_a,
                               prof_us_mean=(d_sum / d_cnt * 1e6) if d_cnt > 0 else None, label_sets=sets)
                emit(rec)
                checks += rec["checks"]
                bad += nwrong
                done_before += iters
                pm = rec.get("prof_us_mean")
                print(f"ACC rank={rank} size={size} variant={variant} iters={iters} dcount={rec.get('dcount')} "
                      f"cuda_us={rec['cuda_us_mean']:.2f} prof_us={'n/a' if pm is None else f'{pm:.2f}'} bad={nwrong}"
                      + (f" scrape_error={rec['scrape_error']}" if rec["scrape_error"] else ""), flush=True)
            del buf

        end = dict(base, kind="acc_end", metrics_url=sc.url, scrapes=sc.scrapes, scrape_failures=sc.failures,
                   variants=variants, queued_unavailable=queued_missing)
        s = sc.get()
        if s is None:
            end["scrape_error"] = sc.error or "no scrape"
        else:
            end["misuse_total"], end["misuse_nonzero"] = family(sc, s, METRIC_MISUSE)
            end["open_events"] = None
            for name, match in METRIC_OPEN_EVENTS:
                v, _ = family(sc, s, name, match)
                if v is not None:
                    end["open_events"], end["open_events_metric"] = v, name
                    break
            _, end["operations"] = family(sc, s, METRIC_OPS)
            _, end["untimed_all"] = family(sc, s, METRIC_UNTIMED)
            if PROM_DUMP:
                keep = [l for l in sc.last_text.splitlines()
                        if any(l.startswith(p) or l.startswith("# HELP " + p) or l.startswith("# TYPE " + p)
                               for p in DUMP_PREFIXES)]
                with open(PROM_DUMP, "w") as f:
                    f.write("\n".join(keep) + "\n")
        emit(end)
        print(f"ACC_END rank={rank} misuse={end.get('misuse_total')} open_events={end.get('open_events')}"
              + (f" scrape_error={end['scrape_error']}" if end.get("scrape_error") else ""), flush=True)

    elif MODE == "paired":
        # The profiler on and off in the same processes: ncclBpfProfilerPause/Resume set NCCL's
        # mask (0: no events) for the collectives enqueued after them, so batches of one arm and
        # the other alternate (on off, off on, ...) over the same communicator, connections and
        # GPU state; what differs between two neighbouring batches is the profiler alone.
        lib = ctypes.CDLL(os.environ["PAIRED_LIB"], mode=os.RTLD_NOW | os.RTLD_LOCAL)
        lib.ncclBpfProfilerPause.restype = ctypes.c_int
        lib.ncclBpfProfilerResume.restype = ctypes.c_int
        pairs = int(os.environ.get("PAIRED_PAIRS", "20"))
        for size in SIZES:
            buf, wrong, nbytes, k, _ = timed_size(size)
            times = {"on": [], "off": []}
            rc_bad = 0
            for i in range(pairs):
                for arm in (("on", "off") if i % 2 == 0 else ("off", "on")):
                    rc = lib.ncclBpfProfilerResume() if arm == "on" else lib.ncclBpfProfilerPause()
                    rc_bad += rc != 0
                    # Two calls after the switch so that none of the timed ones was enqueued before it.
                    for _ in range(2):
                        dist.all_reduce(buf)
                    sync()
                    dist.barrier(device_ids=[0])
                    e0.record()
                    for _ in range(k):
                        dist.all_reduce(buf)
                    e1.record()
                    e1.synchronize()
                    times[arm].append(e0.elapsed_time(e1) * 1e3 / k)
            lib.ncclBpfProfilerResume()
            wrong += (buf != 0).any()
            t = torch.tensor(times["on"] + times["off"], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            v = t.tolist()
            on, off = v[:pairs], v[pairs:]
            tw = torch.tensor([int(wrong.item()) + rc_bad], dtype=torch.int64, device=dev)
            dist.all_reduce(tw)
            nbad = int(tw.item())
            nchk = n * (WARMUP + 1)
            checks += nchk
            bad += nbad
            if rank == 0:
                ratios = sorted(a / b for a, b in zip(on, off) if b > 0)
                med = statistics.median(ratios)
                lo, hi = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
                emit(dict(base, kind="paired", size=size, bytes=nbytes, k=k, pairs=pairs, us_on=on, us_off=off,
                          on_median=statistics.median(on), off_median=statistics.median(off),
                          ratio_median=med, ratio_q1=lo, ratio_q3=hi, checks=nchk, bad=nbad))
                print(f"PAIRED size={size} k={k} pairs={pairs} on={statistics.median(on):.2f} "
                      f"off={statistics.median(off):.2f} ratio={med:.4f} iqr={lo:.4f}-{hi:.4f} bad={nbad}", flush=True)
            del buf

    else:  # overhead
        for size in SIZES:
            buf, wrong, nbytes, k, est = timed_size(size, OVH_K.get(size))
            sync()
            own = []
            for _ in range(OVH_BATCHES):
                e0.record()
                for _ in range(k):
                    dist.all_reduce(buf)
                e1.record()
                e1.synchronize()
                own.append(e0.elapsed_time(e1) * 1e3 / k)
            wrong += (buf != 0).any()
            t = torch.tensor(own, dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            slowest = t.tolist()
            tw = torch.tensor([int(wrong.item())], dtype=torch.int64, device=dev)
            dist.all_reduce(tw)
            nbad = int(tw.item())
            nchk = n * (WARMUP + 1)
            checks += nchk
            bad += nbad
            if rank == 0:
                med = statistics.median(slowest)
                busbw = 2 * (n - 1) / n * nbytes / (med * 1e-6) / 1e9 if med > 0 else 0.0
                emit(dict(base, kind="ovh", size=size, bytes=nbytes, k=k, batches=OVH_BATCHES, estimate_us=est,
                          us_batches=slowest, us_rank0=own, us_median=med, busbw=busbw, checks=nchk, bad=nbad))
                print(f"OVH_K size={size} k={k}", flush=True)
                print(f"OVH arm={ARM} round={ROUND} size={size} k={k} us={med:.2f} busbw={busbw:.4g} bad={nbad}", flush=True)
            del buf

    sync()
    dist.barrier(device_ids=[0])
    sync()
    emit(dict(base, kind="done", checks=checks, bad=bad, seconds_init=t_init,
              seconds_total=time.perf_counter() - T_START))
    print(f"DONE rank={rank} label={LABEL} checks={checks} bad={bad} seconds_init={t_init:.2f} "
          f"seconds_total={time.perf_counter() - T_START:.2f}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
