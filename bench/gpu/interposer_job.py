"""One rank of the interposer run on the GPU machine; started by bench/gpu/interposer.sh.

MODE=sweep (default): all_reduce and all_gather at every size of SIZES (bytes of the tensor the
collective returns; all_gather's input is that divided by the ranks), each result checked once
against exact integer sums, then timed. Rank 0 prints one line per operation and size:
  RESULT arm=A ranks=N op=OP bytes=B us=T iters=I correct=yes|NO round=K

MODE=check: the wrapper checks of bench/gpu/interposer.sh.
  phase 1: N1 all_reduces of BYTES (with NCCL_ALGO=Ring NCCL_PROTO=Simple every rank sends
           exactly 2 (n - 1) / n x BYTES per all_reduce), then
           "PHASE1 rank=R pid=P expected_sent=E checks=C bad=B" and a wait for GO_FILE (the
           script reads `ncclbpf status --json` and the metrics endpoints meanwhile);
  phase 2: one checked run of every collective kind (all_reduce, all_gather, reduce_scatter,
           broadcast, reduce, all_to_all, send/recv around the ring), each printed as
           "KIND rank=R op=OP correct=yes|NO", then "DONE rank=R checks=C bad=B".
The exit status is 1 when any check failed.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

SIZES = [8, 65536, 1 << 20, 16 << 20, 256 << 20]
if os.environ.get("SIZES"):
    SIZES = [int(v) for v in os.environ["SIZES"].split(",")]


def iters_for(nbytes):
    """(timed iterations, warm-ups): fewer for the big sizes."""
    if nbytes <= 64 << 10:
        return 50, 5
    if nbytes <= 1 << 20:
        return 20, 3
    if nbytes <= 16 << 20:
        return 8, 2
    return 3, 1


def values(seed, n, dev):
    """Integer-valued floats, exact under summation, the same on every rank for one seed."""
    g = torch.Generator(device=dev)
    g.manual_seed(1000 + seed)
    return torch.randint(-1000, 1000, (n,), generator=g, device=dev).float()


def timed(fn, iters, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def sweep(rank, world, dev, arm, rnd):
    bad = 0
    for op in ("all_reduce", "all_gather"):
        for nbytes in SIZES:
            if op == "all_reduce":
                n = max(1, nbytes // 4)
                mine = values(rank, n, dev)
                expected = sum(values(r, n, dev) for r in range(world))
                t = mine.clone()
                dist.all_reduce(t)
                torch.cuda.synchronize()
                ok = torch.equal(t, expected)
                fn = lambda: dist.all_reduce(t)  # noqa: E731
                moved = n * 4
            else:
                per = max(1, nbytes // 4 // world)
                mine = values(rank, per, dev)
                expected = torch.cat([values(r, per, dev) for r in range(world)])
                out = torch.empty(per * world, device=dev)
                dist.all_gather_into_tensor(out, mine)
                torch.cuda.synchronize()
                ok = torch.equal(out, expected)
                fn = lambda: dist.all_gather_into_tensor(out, mine)  # noqa: E731
                moved = per * world * 4
            bad += 0 if ok else 1
            iters, warm = iters_for(nbytes)
            us = timed(fn, iters, warm)
            if rank == 0:
                print(f"RESULT arm={arm} ranks={world} op={op} bytes={moved} us={us:.1f} iters={iters} "
                      f"correct={'yes' if ok else 'NO'} round={rnd}", flush=True)
            del expected, mine
            torch.cuda.empty_cache()
    return bad


def kinds(rank, world, dev):
    """One checked run of every collective kind; returns the number that failed."""
    n = 1 << 18  # 1 MiB of float32 per rank
    results = {}
    # all_reduce
    t = values(rank, n, dev)
    dist.all_reduce(t)
    results["all_reduce"] = torch.equal(t, sum(values(r, n, dev) for r in range(world)))
    # all_gather
    out = torch.empty(n * world, device=dev)
    dist.all_gather_into_tensor(out, values(rank, n, dev))
    results["all_gather"] = torch.equal(out, torch.cat([values(r, n, dev) for r in range(world)]))
    # reduce_scatter: rank r gets block r of the sum
    big = values(100 + rank, n * world, dev)
    got = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(got, big)
    full = sum(values(100 + r, n * world, dev) for r in range(world))
    results["reduce_scatter"] = torch.equal(got, full[rank * n:(rank + 1) * n])
    # broadcast from the last rank
    root = world - 1
    b = values(200 + rank, n, dev)
    dist.broadcast(b, src=root)
    results["broadcast"] = torch.equal(b, values(200 + root, n, dev))
    # reduce to rank 0 (only the root's result is defined)
    r0 = values(300 + rank, n, dev)
    dist.reduce(r0, dst=0)
    results["reduce"] = (rank != 0) or torch.equal(r0, sum(values(300 + r, n, dev) for r in range(world)))
    # all_to_all: block j of rank r goes to rank j
    src = values(400 + rank, n * world, dev)
    dst = torch.empty(n * world, device=dev)
    dist.all_to_all_single(dst, src)
    want = torch.cat([values(400 + r, n * world, dev)[rank * n:(rank + 1) * n] for r in range(world)])
    results["all_to_all"] = torch.equal(dst, want)
    # send/recv around the ring
    s = values(500 + rank, n, dev)
    r = torch.empty(n, device=dev)
    ops = [dist.P2POp(dist.isend, s, (rank + 1) % world), dist.P2POp(dist.irecv, r, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    results["send_recv"] = torch.equal(r, values(500 + (rank - 1) % world, n, dev))
    torch.cuda.synchronize()
    for op, ok in results.items():
        print(f"KIND rank={rank} op={op} correct={'yes' if ok else 'NO'}", flush=True)
    return sum(0 if ok else 1 for ok in results.values()), len(results)


def wait_for(path, limit):
    t0 = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t0 < limit:
        time.sleep(0.05)
    return os.path.exists(path)


def check(rank, world, dev):
    nbytes = int(os.environ.get("BYTES", str(4 << 20)))
    n1 = int(os.environ.get("N1", "100"))
    n = nbytes // 4
    src = values(rank, n, dev)
    exp = sum(values(r, n, dev) for r in range(world))
    buf = torch.empty_like(src)
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    for _ in range(n1):
        buf.copy_(src)
        dist.all_reduce(buf)
        bad += (buf != exp).any()
    torch.cuda.synchronize()
    sent = n1 * 2 * (world - 1) * nbytes // world
    print(f"PHASE1 rank={rank} pid={os.getpid()} expected_sent={sent} checks={n1} bad={int(bad.item())}", flush=True)
    if not wait_for(os.environ["GO_FILE"], 60):
        print(f"GO never came rank={rank}", flush=True)
    kbad, kn = kinds(rank, world, dev)
    total_bad = int(bad.item()) + kbad
    print(f"DONE rank={rank} checks={n1 + kn} bad={total_bad}", flush=True)
    return total_bad


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    arm = sys.argv[1] if len(sys.argv) > 1 else "?"
    if os.environ.get("MODE", "sweep") == "check":
        bad = check(rank, world, dev)
    else:
        bad = sweep(rank, world, dev, arm, int(os.environ.get("ROUND", "1")))
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
