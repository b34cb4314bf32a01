"""One rank of the NVLink case study; run by bench/gpu/nvlink.sh (one process per rank).

For each collective in COLLS (all_reduce in place, all_gather = all_gather_into_tensor,
reduce_scatter = reduce_scatter_tensor; float32) and each size in SIZES, time-boxed as
bench/gpu/e2e.py does, every result of every call checked on every rank.

Communicators. The default process group is gloo (CPU): every helper reduction (the slowest
rank's time, the check counts, barriers) goes through it, so NCCL sees nothing but the measured
collectives. Each collective gets a communicator of its own (dist.new_group(backend="nccl"),
created at its first call, destroyed after its last size): a learning tuner policy
(net_autotune) starts fresh for every collective, and NCCL's TUNING lines of rank 0 name only
measured calls, in order, so bench/gpu/nvlink_report.py can tell which choice NCCL applied to the
timed calls of each size (the last ITERS lines of that collective and size).

SIZE is nccl-tests' size: the buffer (all_reduce), the gathered output (all_gather), the input
that is scattered (reduce_scatter). Per rank max(1, SIZE / 4 / n) elements for all_gather and
reduce_scatter, so at the smallest sizes BYTES (what moved, what the tuner sees as nBytes, used
for the bandwidths) can be more than SIZE; a size whose BYTES equals the previous size's is
skipped (SKIP reason=same-bytes). A size that does not fit in the GPU's memory on some rank is
skipped on every rank (SKIP reason=memory): the need is counted from the buffers this script
allocates (input, expected result, the pool of output rows, the comparison's temporary) against
MEM_FRACTION of the free memory divided by RANKS_PER_GPU (ranks sharing one GPU under MPS).

Time box, per size (as e2e.py): one checked call (warm-up: NCCL connects on first use), one timed
call as an estimate (ten back to back when one call took under TIME_PER_SIZE / 20), then
[SETTLE calls, each followed by a synchronize, checked: a learning policy's exploration, at most
SETTLE_S seconds by the estimate] then ITERS = clamp(TIME_PER_SIZE / estimate, MIN_ITERS,
MAX_ITERS) calls enqueued back to back and synchronized once per pass (the figure is their total
time / ITERS, as nccl-tests measures). Estimates and times are the slowest rank's.

Checks: each call writes its own row of a pool (at most POOL_BYTES, refilled between passes
outside the timed part); after each pass every row is compared with the closed form. Rank r's
element i is ((31 i + 17 (r + 1) + 7 r^2) mod 1999) - 999: small integers, so every sum is exact
in float32; the pattern repeats every 1999 elements, so inputs and expected results are built by
tiling one period (no temporaries of the buffer's size in int64, which at 8 GiB would not fit).
Expected: the sum over ranks (all_reduce; reduce_scatter's slice of rank r), the concatenation
(all_gather). Output rows of all_gather and reduce_scatter start at a sentinel (-5000) so a call
that writes nothing is caught. Wrong rows are counted on the GPU, summed over ranks.

Rank 0 prints, per size:
  RESULT phase=P arm=A ranks=N round=R coll=C size=S bytes=B iters=K settle=L us=T algbw=X busbw=Y checks=.. bad=..
  SKIP phase=P arm=A ranks=N round=R coll=C size=S bytes=B reason=memory|same-bytes [need=.. free=..]
busbw as nccl-tests: algbw x 2 (n - 1) / n (all_reduce), x (n - 1) / n (all_gather,
reduce_scatter); GB/s = 1e9 bytes/s. At the end every rank prints
  DONE rank=.. checks=.. bad=.. seconds_init=.. seconds_total=..
Exit status 1 if any check failed, 2 on a usage error (or NVLink multicast not switched off).

Settings (environment): PHASE, ARM, ROUND (labels only), COLLS, SIZES (comma or space separated),
TIME_PER_SIZE (0.1 s), MIN_ITERS (3), MAX_ITERS (1000), POOL_BYTES (1 GiB), SETTLE (0),
SETTLE_S (4), MEM_FRACTION (0.85), RANKS_PER_GPU (1), LOCAL_RANK (the CUDA device).
"""
import gc
import math
import os
import sys
import time

T_START = time.perf_counter()

# Hard rule of the machines (NVLink multicast can take the host's GPUs out of service): refuse
# to start without it, before torch or NCCL are loaded.
_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _k, _v in _MULTICAST_OFF.items():
    if os.environ.get(_k) != _v:
        print(f"nvlink.py: refusing to run without {_k}={_v} (NVLink multicast must stay off)", file=sys.stderr, flush=True)
        sys.exit(2)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def env_list(name, default):
    v = os.environ.get(name, default)
    return [x for x in v.replace(",", " ").split() if x]


PHASE = os.environ.get("PHASE", "?")
ARM = os.environ.get("ARM", "?")
ROUND = os.environ.get("ROUND", "1")
COLLS = env_list("COLLS", "all_reduce,all_gather,reduce_scatter")
SIZES = [int(x) for x in env_list("SIZES", "8,1048576")]
TIME_PER_SIZE = float(os.environ.get("TIME_PER_SIZE", "0.1"))
MIN_ITERS = int(os.environ.get("MIN_ITERS", "3"))
MAX_ITERS = int(os.environ.get("MAX_ITERS", "1000"))
POOL_BYTES = int(os.environ.get("POOL_BYTES", str(1 << 30)))
SETTLE = int(os.environ.get("SETTLE", "0"))
SETTLE_S = float(os.environ.get("SETTLE_S", "4"))
MEM_FRACTION = float(os.environ.get("MEM_FRACTION", "0.85"))
RANKS_PER_GPU = max(1, int(os.environ.get("RANKS_PER_GPU", "1")))
KNOWN = ("all_reduce", "all_gather", "reduce_scatter")
SENTINEL = -5000
PERIOD, HALF = 1999, 999


def main():
    for c in COLLS:
        if c not in KNOWN:
            print(f"unknown collective {c!r} in COLLS (known: {', '.join(KNOWN)})", file=sys.stderr, flush=True)
            sys.exit(2)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}")
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize
    label = f"phase={PHASE} arm={ARM} ranks={n} round={ROUND}"

    def period(r):
        """One period of rank r's values (float32, PERIOD elements)."""
        i = torch.arange(PERIOD, dtype=torch.int64, device=dev)
        return ((i * 31 + 17 * (r + 1) + 7 * r * r) % PERIOD - HALF).to(torch.float32)

    def tile(p, count, start=0):
        """count elements of the periodic sequence p, from index start (a view of one allocation)."""
        p = torch.roll(p, -(start % PERIOD))
        return p.repeat(-(-count // PERIOD))[:count]

    def slowest(x):
        t = torch.tensor(x if isinstance(x, list) else [x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        v = t.tolist()
        return v if isinstance(x, list) else v[0]

    def smallest(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return t.item()

    def total(x):
        t = torch.tensor(x, dtype=torch.int64)
        dist.all_reduce(t)
        return t.tolist()

    dist.barrier()
    t_init = time.perf_counter() - T_START
    checks = bad = 0
    gc.disable()  # no collector pauses inside the timed loops: collected between sizes instead

    for coll in COLLS:
        gc.collect()
        g = dist.new_group(backend="nccl")
        prev_bytes = None
        for size in SIZES:
            if coll in ("all_gather", "reduce_scatter"):
                c = max(1, size // 4 // n)
                nbytes = c * n * 4
            else:
                c = max(1, size // 4)
                nbytes = c * 4
            head = f"{label} coll={coll} size={size} bytes={nbytes}"
            if nbytes == prev_bytes:
                if rank == 0:
                    print(f"SKIP {head} reason=same-bytes", flush=True)
                continue
            row = n * c if coll == "all_gather" else c  # elements of one output row
            rows = max(1, min(MAX_ITERS, POOL_BYTES // (row * 4)))
            in_elems = {"all_reduce": c, "all_gather": c, "reduce_scatter": n * c}[coll]
            # input (all_reduce: the refill source), expected row, pool, the comparison's bools
            need = 4 * in_elems + 4 * row + rows * row * 5 + 8 * PERIOD * n
            gc.collect()
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(dev)[0]
            fits = need <= MEM_FRACTION * free / RANKS_PER_GPU
            if smallest(1.0 if fits else 0.0) < 1.0:
                if rank == 0:
                    print(f"SKIP {head} reason=memory need={need} free={free} ranks_per_gpu={RANKS_PER_GPU}", flush=True)
                continue
            prev_bytes = nbytes

            if coll == "all_reduce":
                src = tile(period(rank), c)
                exp = tile(sum(period(r) for r in range(n)), c)
                inp = None
            elif coll == "all_gather":
                src = None
                inp = tile(period(rank), c)
                # rank q's block is q's values from index 0 (filled block by block: no second
                # buffer of the whole output)
                exp = torch.empty(n * c, dtype=torch.float32, device=dev)
                for q in range(n):
                    exp[q * c:(q + 1) * c] = tile(period(q), c)
            else:  # reduce_scatter: rank r gets the sum of every rank's slice r
                src = None
                inp = tile(period(rank), n * c)
                exp = tile(sum(period(q) for q in range(n)), c, start=rank * c)
            pool = torch.empty((rows, row), dtype=torch.float32, device=dev)
            views = pool.unbind(0)
            wrong = torch.zeros((), dtype=torch.int64, device=dev)

            if coll == "all_reduce":
                def op(v):
                    dist.all_reduce(v, group=g)
            elif coll == "all_gather":
                def op(v):
                    dist.all_gather_into_tensor(v, inp, group=g)
            else:
                def op(v):
                    dist.reduce_scatter_tensor(v, inp, group=g)

            def calls(k, each=False):
                """k calls, each into its own row (synchronized after each with each=True);
                seconds of the timed passes (refills and checks outside them)."""
                nonlocal wrong
                done, secs = 0, 0.0
                while done < k:
                    m = min(rows, k - done)
                    if coll == "all_reduce":
                        pool[:m].copy_(src.expand(m, -1))
                    else:
                        pool[:m].fill_(SENTINEL)
                    sync()
                    t0 = time.perf_counter()
                    for j in range(m):
                        op(views[j])
                        if each:
                            sync()
                    sync()
                    secs += time.perf_counter() - t0
                    wrong += (pool[:m] != exp).any(dim=1).sum()
                    done += m
                return secs

            calls(1)  # warm-up, checked (the communicator's first call creates it)
            est = slowest(calls(1))
            extra = 0
            if est < TIME_PER_SIZE / 20:
                # One synchronized call of a small size takes much longer than its share of a
                # back-to-back run (wake-ups): estimate from a short run instead.
                est = slowest(calls(10)) / 10
                extra = 10
            settle = 0
            if SETTLE > 0:
                settle = int(min(SETTLE, max(1, SETTLE_S / max(est, 1e-7))))
                settle = int(slowest(float(settle)))  # the same count on every rank
                calls(settle, each=True)
            iters = int(min(MAX_ITERS, max(MIN_ITERS, TIME_PER_SIZE / max(est, 1e-7))))
            secs = slowest(calls(iters))
            nchk, nbad = total([iters + 2 + extra + settle, int(wrong.item())])
            checks += nchk
            bad += nbad
            us = secs / iters * 1e6
            algbw = nbytes / us / 1e3
            factor = 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n
            if rank == 0:
                print(f"RESULT {head} iters={iters} settle={settle} us={us:.2f} algbw={algbw:.6g} "
                      f"busbw={algbw * factor:.6g} checks={nchk} bad={nbad}", flush=True)
            del pool, views, op
            src = inp = exp = None
        sync()
        dist.barrier()
        try:
            dist.destroy_process_group(g)
        except Exception as e:  # keep going: the next collective has its own communicator
            print(f"note: destroying the {coll} communicator failed: {e}", file=sys.stderr, flush=True)

    dist.barrier()
    print(f"DONE rank={rank} {label} checks={checks} bad={bad} "
          f"seconds_init={t_init:.2f} seconds_total={time.perf_counter() - T_START:.2f}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
