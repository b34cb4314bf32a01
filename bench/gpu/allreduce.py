"""One rank of a PyTorch all_reduce sweep through NCCL; run by bench/gpu/run.sh.

Every rank fills its tensor with integer-valued floats drawn from a generator seeded by its
rank, so every rank can compute the exact expected sum and check the result at every size.
Rank 0 prints one line per size: bytes, mean time per all_reduce (us), bus bandwidth.

Opt-in knobs (unset: one sweep, then exit):
  REPEAT=R       run the size sweep R times (every result checked; RESULT lines then carry
                 round=K, from 1);
  HOLD_FILE=path after the last size (and a barrier), print "HOLDING rank=R pid=P" and wait
                 until that file exists (at most HOLD_TIMEOUT seconds, default 120) before
                 destroying the process group, so tools can read the live ranks.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

SIZES = [8, 1024, 65536, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
if os.environ.get("SIZES"):
    SIZES = [int(v) for v in os.environ["SIZES"].split(",")]


def iters_for(nbytes):
    if nbytes <= 4 << 20:
        return 20, 5
    if nbytes <= 64 << 20:
        return 10, 2
    return 4, 1


def values(rank, n, dev):
    g = torch.Generator(device=dev)
    g.manual_seed(1000 + rank)
    return torch.randint(-1000, 1000, (n,), generator=g, device=dev).float()


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    label = sys.argv[1] if len(sys.argv) > 1 else "?"
    bad = 0
    calls = {}
    repeat = int(os.environ.get("REPEAT", "1"))
    rounds = [(r, nbytes) for r in range(1, repeat + 1) for nbytes in SIZES]
    for rnd, nbytes in rounds:
        n = max(1, nbytes // 4)
        expected = sum(values(r, n, dev) for r in range(world))
        mine = values(rank, n, dev)
        t = mine.clone()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ok = torch.equal(t, expected)
        bad += 0 if ok else 1
        iters, warm = iters_for(nbytes)
        for _ in range(warm):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / iters * 1e6
        busbw = 2 * (world - 1) / world * nbytes / us / 1e3
        calls[nbytes] = calls.get(nbytes, 0) + 1 + warm + iters
        if rank == 0:
            tag = f" round={rnd}" if "REPEAT" in os.environ else ""
            print(f"RESULT {label} ranks={world} bytes={nbytes} us={us:.1f} busbw={busbw:.3f} correct={'yes' if ok else 'NO'}{tag}", flush=True)
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    if os.environ.get("MAPS_CMD"):
        # What the net policy counted in this process, read through its maps from another
        # process (the command is `ncclbpf maps PID`), next to what this rank's all_reduces had
        # to send: with Ring and Simple forced, an all_reduce of S bytes sends exactly
        # 2 (n - 1) / n * S bytes from every rank. The only other traffic is torch's barriers
        # (one tiny all_reduce each: len(SIZES) + 2 of them).
        sent = sum(2 * (world - 1) * max(1, b // 4) * 4 // world * c for b, c in calls.items())
        print(f"MOVED rank={rank} allreduce_send_bytes={sent} calls={sum(calls.values())}", flush=True)
        import subprocess
        out = subprocess.run(os.environ["MAPS_CMD"].split() + [str(os.getpid())], capture_output=True, text=True)
        print(f"MAPS rank={rank} rc={out.returncode}\n{out.stdout}{out.stderr}", flush=True)
    if os.environ.get("HOLD_FILE"):
        hold = os.environ["HOLD_FILE"]
        limit = float(os.environ.get("HOLD_TIMEOUT", "120"))
        print(f"HOLDING rank={rank} pid={os.getpid()} checks={len(rounds)} bad={bad}", flush=True)
        t0 = time.monotonic()
        while not os.path.exists(hold) and time.monotonic() - t0 < limit:
            time.sleep(0.05)
        waited = time.monotonic() - t0
        seen = "released" if os.path.exists(hold) else "timed out"
        print(f"HOLD {seen} rank={rank} after {waited:.1f} s", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
