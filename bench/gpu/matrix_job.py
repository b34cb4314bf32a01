"""One rank of bench/gpu/version-matrix.sh: the same checked job under every NCCL release.

Every rank is its own process and its own NCCL host on the one GPU (as bench/gpu/e2e.py), so
every byte between ranks crosses the net plugin. Two NCCL communicators live at once: the
default process group and a second group of every rank (dist.new_group). On each, at ODD sizes
(element counts that are not powers of two), every collective kind PyTorch drives through NCCL:
all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all; then point-to-point: a
ring of isend/irecv (batch_isend_irecv). Every result is checked on the device against the
value each rank can compute. Then the rank scrapes its own metrics endpoint
(NCCL_BPF_METRICS_ADDR, set per rank by the script) and counts the profiler's timed
collectives there.

Prints, on each rank:
  NCCL_VERSION rank=R version=2.30.7
  CHECK rank=R comm=C op=OP elems=E ok=0|1
  METRICS rank=R timed=N scraped=0|1
  DONE rank=R checks=C bad=B
and exits 0 only if every check passed and the endpoint answered with timed collectives.
"""
import os
import sys
import urllib.request

import torch
import torch.distributed as dist

ODD = [1, 7, 1023, 65537, 1048573]


def check(tag, comm, op, elems, ok, counts):
    counts[0] += 1
    counts[1] += 0 if ok else 1
    print(f"CHECK rank={tag} comm={comm} op={op} elems={elems} ok={int(ok)}", flush=True)


def run_comm(rank, n, group, comm, counts):
    dev = torch.device("cuda", 0)
    for e in ODD:
        # all_reduce: sum of (r + 1) over the ranks.
        x = torch.full((e,), float(rank + 1), device=dev)
        dist.all_reduce(x, group=group)
        check(rank, comm, "all_reduce", e, bool((x == n * (n + 1) / 2).all()), counts)
        # broadcast from the last rank.
        x = torch.full((e,), float(rank), device=dev)
        dist.broadcast(x, src=n - 1, group=group)
        check(rank, comm, "broadcast", e, bool((x == n - 1).all()), counts)
        # reduce to rank 0 (checked there).
        x = torch.full((e,), 2.0, device=dev)
        dist.reduce(x, dst=0, group=group)
        check(rank, comm, "reduce", e, rank != 0 or bool((x == 2.0 * n).all()), counts)
        # all_gather: part r holds r.
        out = torch.empty(e * n, device=dev)
        dist.all_gather_into_tensor(out, torch.full((e,), float(rank), device=dev), group=group)
        want = torch.arange(n, device=dev, dtype=torch.float32).repeat_interleave(e)
        check(rank, comm, "all_gather", e, bool((out == want).all()), counts)
        # reduce_scatter: every rank's input part r holds r; the sum is n r.
        inp = torch.arange(n, device=dev, dtype=torch.float32).repeat_interleave(e)
        out = torch.empty(e, device=dev)
        dist.reduce_scatter_tensor(out, inp, group=group)
        check(rank, comm, "reduce_scatter", e, bool((out == n * rank).all()), counts)
        # all_to_all: part j of rank r holds 1000 r + j; rank r receives 1000 j + r from j.
        inp = torch.cat([torch.full((e,), 1000.0 * rank + j, device=dev) for j in range(n)])
        out = torch.empty(e * n, device=dev)
        dist.all_to_all_single(out, inp, group=group)
        want = torch.cat([torch.full((e,), 1000.0 * j + rank, device=dev) for j in range(n)])
        check(rank, comm, "all_to_all", e, bool((out == want).all()), counts)
        # p2p ring: send r to the next rank, receive from the previous.
        send = torch.full((e,), float(rank), device=dev)
        recv = torch.empty(e, device=dev)
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        ops = [
            dist.P2POp(dist.isend, send, dist.get_global_rank(group, nxt) if group else nxt, group=group),
            dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, prv) if group else prv, group=group),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        check(rank, comm, "sendrecv", e, bool((recv == prv).all()), counts)
    torch.cuda.synchronize()


def scrape(rank):
    addr = os.environ.get("NCCL_BPF_METRICS_ADDR", "")
    if not addr:
        return 0, False
    try:
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    except OSError as e:
        print(f"METRICS rank={rank} error={e}", flush=True)
        return 0, False
    timed = 0
    for line in text.splitlines():
        if line.startswith("nccl_collective_duration_seconds_count{"):
            timed += int(float(line.rsplit(" ", 1)[1]))
    return timed, True


def main():
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    v = torch.cuda.nccl.version()
    print(f"NCCL_VERSION rank={rank} version={'.'.join(map(str, v))}", flush=True)
    second = dist.new_group(list(range(n)), backend="nccl")
    counts = [0, 0]
    for comm, group in ((1, None), (2, second)):
        run_comm(rank, n, group, comm, counts)
    dist.barrier()
    timed, scraped = scrape(rank)
    print(f"METRICS rank={rank} timed={timed} scraped={int(scraped)}", flush=True)
    print(f"DONE rank={rank} checks={counts[0]} bad={counts[1]}", flush=True)
    dist.destroy_process_group(second)
    dist.destroy_process_group()
    ok = counts[1] == 0 and scraped and timed > 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
