"""One rank of the metrics check on the GPU machine; run by bench/gpu/metrics.sh.

Phase 1: N1 all_reduces of BYTES (float32, every result checked on the device), then
"PHASE1 rank=R pid=P ..." and a wait for the file GO (so the script can scrape a job whose
counters stand still). Phase 2: all_reduces of BYTES, each checked, until the file STOP exists
(the script freezes one rank meanwhile; every 16 all_reduces the ranks agree, by a MAX
all_reduce of a flag, whether to stop); then "DONE rank=R checks=C bad=B".

With NCCL_ALGO=Ring NCCL_PROTO=Simple every rank sends 2 (n - 1) / n x BYTES per all_reduce
through the net plugin (each rank is its own NCCL host), so phase 1 moves
N1 x 2 (n - 1) x BYTES bytes summed over the ranks, sent and received alike.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def wait_for(path, limit):
    t0 = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t0 < limit:
        time.sleep(0.05)
    return os.path.exists(path)


def main():
    nbytes = int(os.environ.get("BYTES", str(4 << 20)))
    n1 = int(os.environ.get("N1", "200"))
    go, stop = os.environ["GO_FILE"], os.environ["STOP_FILE"]
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    n = nbytes // 4

    def values(r):
        g = torch.Generator(device=dev)
        g.manual_seed(1000 + r)
        return torch.randint(-1000, 1000, (n,), generator=g, device=dev).float()

    src = values(rank)
    exp = sum(values(r) for r in range(world))
    buf = torch.empty_like(src)
    bad = torch.zeros((), dtype=torch.int64, device=dev)
    checks = 0
    t0 = time.perf_counter()
    for _ in range(n1):
        buf.copy_(src)
        dist.all_reduce(buf)
        bad += (buf != exp).any()
        checks += 1
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    print(f"PHASE1 rank={rank} pid={os.getpid()} checks={checks} bad={int(bad.item())} bytes={nbytes} "
          f"seconds={secs:.2f} expected_sent_all_ranks={n1 * 2 * (world - 1) * nbytes}", flush=True)
    if not wait_for(go, 120):
        print(f"GO never came rank={rank}", flush=True)
    t1 = time.perf_counter()
    flag = torch.zeros(1, device=dev)
    while True:
        buf.copy_(src)
        dist.all_reduce(buf)
        bad += (buf != exp).any()
        checks += 1
        if checks % 16 == 0:
            # Every rank stops at the same all_reduce: the largest of their flags decides.
            flag.fill_(float(os.path.exists(stop) or time.perf_counter() - t1 > 120))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                break
    torch.cuda.synchronize()
    print(f"DONE rank={rank} checks={checks} bad={int(bad.item())}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if int(bad.item()) else 0)


if __name__ == "__main__":
    main()
