"""One rank of the GPU end-to-end benchmark (issue 11); run by bench/gpu/e2e.sh.

Every rank is its own process (and its own NCCL host) on the one GPU. For each collective in
COLLS and each size in SIZES, then for the decode pattern at each size in DECODE:

  collectives  all_reduce (in place), all_gather (all_gather_into_tensor), reduce_scatter
               (reduce_scatter_tensor), broadcast (from rank 0, in place); float32. SIZE is what
               nccl-tests calls the size: the whole buffer (all_reduce, broadcast), the gathered
               output (all_gather), the input that is scattered (reduce_scatter). The element
               count per rank is max(1, SIZE / 4 / n) for all_gather and reduce_scatter, so at
               the smallest sizes the bytes really moved (BYTES=, used for the bandwidths) can
               be more than SIZE.
  decode       per "token", DECODE_PER (160) back-to-back all_reduces of SIZE bytes of bf16, one
               buffer each, then one synchronize; the time of a token is measured around those.

Time box: per size, one checked call (warm-up: connections NCCL opens on first use), three
timed calls as the estimate (their best; ten back to back when a call took under TIME_PER_SIZE /
20), then ITERS = clamp(TIME_PER_SIZE / estimate, MIN_ITERS, MAX_ITERS) calls in PARTS (5) runs,
each enqueued back to back and synchronized once (a run's figure is its total time / its calls,
as nccl-tests measures; the size's figure is the median run's, so a stall of one run, seen on the
GPU machine with every transport, costs that run only; us_parts= gives every run's). The
estimate and each run's time are the slowest rank's (all_reduce MAX), so every rank runs the same
count. Decode likewise: one warm-up token, one estimate, then TOKENS = clamp(DECODE_TIME
/ estimate, MIN_TOKENS, MAX_TOKENS) tokens; the figure is the median token, where a token's time
is the slowest rank's. Reported times are the slowest rank's (all_reduce MAX of each rank's).

Every result of every call is checked on every rank: each call writes its own buffer (rows of a
pool, at most POOL_BYTES, refilled between passes outside the timed part), and after each pass
every row is compared with the closed form: rank r's element i is ((31 i + 17 (r + 1) + 7 r^2)
mod M) - H (M 1999, H 999 for float32; M 9, H 4 for bf16: small integers, so every sum is
exact). Expected: the sum over ranks (all_reduce, reduce_scatter's slice), the concatenation
(all_gather), rank 0's values (broadcast; the other ranks' rows start with their own values).
Output rows of all_gather and reduce_scatter start at a sentinel (-5000) so a call that writes
nothing is caught. The count of wrong rows is summed over ranks.

Rank 0 prints, per size:
  RESULT arm=A ranks=N round=R coll=C size=S bytes=B iters=K us=T us_parts=T1,.. algbw=X busbw=Y checks=.. bad=..
with busbw as nccl-tests: algbw x 2 (n - 1) / n (all_reduce), x (n - 1) / n (all_gather,
reduce_scatter), x 1 (broadcast); GB/s = 1e9 bytes/s. Per decode size:
  DECODE arm=A ranks=N round=R size=S per=160 tokens=K ms_median=.. ms_min=.. ms_max=.. checks=.. bad=..
and at the end (every rank) "DONE rank=.. checks=.. bad=.. seconds_init=.. seconds_total=..".
Exit status 1 if any check failed.

Settings (environment): ARM, ROUND (labels only), COLLS, SIZES, DECODE (comma or space
separated; DECODE empty: no decode), DECODE_PER (160), TIME_PER_SIZE (0.15 s), MIN_ITERS (3),
MAX_ITERS (2000), PARTS (5), DECODE_TIME (0.4 s), MIN_TOKENS (5), MAX_TOKENS (60), POOL_BYTES (1 GiB).
"""
import gc
import os
import statistics
import sys
import time

T_START = time.perf_counter()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def env_list(name, default):
    v = os.environ.get(name, default)
    return [x for x in v.replace(",", " ").split() if x]


ARM = os.environ.get("ARM", "?")
ROUND = os.environ.get("ROUND", "1")
COLLS = env_list("COLLS", "all_reduce,all_gather,reduce_scatter,broadcast")
SIZES = [int(x) for x in env_list("SIZES", "8,1048576")]
DECODE = [int(x) for x in env_list("DECODE", "16384,262144,1048576")]
DECODE_PER = int(os.environ.get("DECODE_PER", "160"))
TIME_PER_SIZE = float(os.environ.get("TIME_PER_SIZE", "0.15"))
MIN_ITERS = int(os.environ.get("MIN_ITERS", "3"))
MAX_ITERS = int(os.environ.get("MAX_ITERS", "2000"))
PARTS = int(os.environ.get("PARTS", "5"))
DECODE_TIME = float(os.environ.get("DECODE_TIME", "0.4"))
MIN_TOKENS = int(os.environ.get("MIN_TOKENS", "5"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "60"))
POOL_BYTES = int(os.environ.get("POOL_BYTES", str(1 << 30)))
KNOWN = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SENTINEL = -5000


def main():
    for c in COLLS:
        if c not in KNOWN:
            print(f"unknown collective {c!r} in COLLS (known: {', '.join(KNOWN)})", file=sys.stderr, flush=True)
            sys.exit(2)
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize

    def vals(r, count, dtype=torch.float32, start=0):
        m, h = (1999, 999) if dtype == torch.float32 else (9, 4)
        i = torch.arange(start, start + count, dtype=torch.int64, device=dev)
        return ((i * 31 + 17 * (r + 1) + 7 * r * r) % m - h).to(dtype)

    def slowest(x):
        """The largest of every rank's x (float or list of floats)."""
        t = torch.tensor(x if isinstance(x, list) else [x], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        v = t.tolist()
        return v if isinstance(x, list) else v[0]

    def total(x):
        t = torch.tensor(x, dtype=torch.int64, device=dev)
        dist.all_reduce(t)
        return t.tolist()

    # The communicator's first collective (connections, NCCL's own setup) stays out of the figures.
    w = torch.ones(1, device=dev)
    dist.all_reduce(w)
    sync()
    dist.barrier()
    sync()
    t_init = time.perf_counter() - T_START
    checks = bad = 0
    gc.disable()  # no collector pauses inside the timed loops: collected between sizes instead

    for coll in COLLS:
        gc.collect()
        for size in SIZES:
            if coll in ("all_gather", "reduce_scatter"):
                c = max(1, size // 4 // n)
                nbytes = c * n * 4
            else:
                c = max(1, size // 4)
                nbytes = c * 4
            if coll == "all_reduce":
                src = vals(rank, c)
                exp = sum(vals(r, c) for r in range(n))
                row = c
            elif coll == "broadcast":
                src = vals(rank, c)
                exp = vals(0, c)
                row = c
            elif coll == "all_gather":
                inp = vals(rank, c)
                exp = torch.cat([vals(r, c) for r in range(n)])
                row = n * c
            else:  # reduce_scatter
                inp = vals(rank, n * c)
                exp = sum(vals(q, c, start=rank * c) for q in range(n))
                row = c
            rows = max(1, min(MAX_ITERS, POOL_BYTES // (row * 4)))
            pool = torch.empty((rows, row), dtype=torch.float32, device=dev)
            views = pool.unbind(0)
            wrong = torch.zeros((), dtype=torch.int64, device=dev)

            if coll == "all_reduce":
                def op(v):
                    dist.all_reduce(v)
            elif coll == "broadcast":
                def op(v):
                    dist.broadcast(v, 0)
            elif coll == "all_gather":
                def op(v):
                    dist.all_gather_into_tensor(v, inp)
            else:
                def op(v):
                    dist.reduce_scatter_tensor(v, inp)

            def calls(k):
                """k calls, each into its own row; seconds of the timed passes."""
                nonlocal wrong
                done, secs = 0, 0.0
                while done < k:
                    m = min(rows, k - done)
                    if coll in ("all_reduce", "broadcast"):
                        pool[:m].copy_(src.expand(m, -1))
                    else:
                        pool[:m].fill_(SENTINEL)
                    sync()
                    t0 = time.perf_counter()
                    for j in range(m):
                        op(views[j])
                    sync()
                    secs += time.perf_counter() - t0
                    wrong += (pool[:m] != exp).any(dim=1).sum()
                    done += m
                return secs

            calls(1)  # warm-up, checked
            # The estimate is the best of three: the first calls on a new pool stalled 10-40 ms
            # now and then on the GPU machine (every transport alike), and one such call taken
            # as the estimate left a handful of timed calls, all in the stall.
            ests = [slowest(calls(1)) for _ in range(3)]
            extra = 3
            est = min(ests)
            if est < TIME_PER_SIZE / 20:
                # One synchronized call of a small size takes much longer than its share of a
                # back-to-back run (wake-ups): estimate from a short run instead.
                est = slowest(calls(10)) / 10
                extra += 10
            iters = int(min(MAX_ITERS, max(MIN_ITERS, TIME_PER_SIZE / max(est, 1e-7))))
            # Timed in PARTS runs of back-to-back calls; the figure is the median run's time
            # per call, so a stall in one run costs that run and not the figure.
            parts = max(1, min(PARTS, iters // MIN_ITERS))
            per = iters // parts
            iters = per * parts
            part_us = sorted(slowest(calls(per)) / per * 1e6 for _ in range(parts))
            nchk, nbad = total([iters + 1 + extra, int(wrong.item())])
            checks += nchk
            bad += nbad
            us = statistics.median(part_us)
            algbw = nbytes / us / 1e3
            factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(coll, (n - 1) / n)
            if rank == 0:
                print(f"RESULT arm={ARM} ranks={n} round={ROUND} coll={coll} size={size} bytes={nbytes} iters={iters} "
                      f"us={us:.2f} us_parts={','.join(f'{x:.1f}' for x in part_us)} algbw={algbw:.6g} busbw={algbw * factor:.6g} checks={nchk} bad={nbad}", flush=True)
            del pool, views
            src = inp = exp = None

    for size in DECODE:
        gc.collect()
        c = max(1, size // 2)
        src = vals(rank, c, torch.bfloat16)
        exp = sum(vals(r, c, torch.bfloat16).float() for r in range(n)).to(torch.bfloat16)
        bufs = torch.empty((DECODE_PER, c), dtype=torch.bfloat16, device=dev)
        views = bufs.unbind(0)
        wrong = torch.zeros((), dtype=torch.int64, device=dev)

        def token():
            nonlocal wrong
            bufs.copy_(src.expand(DECODE_PER, -1))
            sync()
            t0 = time.perf_counter()
            for v in views:
                dist.all_reduce(v)
            sync()
            t = time.perf_counter() - t0
            wrong += (bufs != exp).any(dim=1).sum()
            return t

        token()  # warm-up, checked
        est = slowest(token())
        tokens = int(min(MAX_TOKENS, max(MIN_TOKENS, DECODE_TIME / max(est, 1e-7))))
        times = slowest([token() for _ in range(tokens)])
        nchk, nbad = total([(tokens + 2) * DECODE_PER, int(wrong.item())])
        checks += nchk
        bad += nbad
        if rank == 0:
            ms = [t * 1e3 for t in times]
            print(f"DECODE arm={ARM} ranks={n} round={ROUND} size={size} per={DECODE_PER} tokens={tokens} "
                  f"ms_median={statistics.median(ms):.3f} ms_min={min(ms):.3f} ms_max={max(ms):.3f} checks={nchk} bad={nbad}",
                  flush=True)
        del bufs, views

    sync()
    dist.barrier()
    sync()
    print(f"DONE rank={rank} arm={ARM} ranks={n} round={ROUND} checks={checks} bad={bad} "
          f"seconds_init={t_init:.2f} seconds_total={time.perf_counter() - T_START:.2f}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
