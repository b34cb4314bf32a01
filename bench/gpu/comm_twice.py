"""One rank of bench/gpu/comm_twice.sh: two NCCL communicators one after the other in one
process (a gloo default group; dist.new_group(backend="nccl"), one all_reduce checked, the group
destroyed, then a second group the same way). NCCL 2.28/2.29 unload an external net plugin with
the last communicator and cannot load it again (NVIDIA/nccl#1978). Prints
  COMM n=1|2 ok=1|0 [error=...]
and exits 0 only if both communicators worked."""
import os
import sys

import torch
import torch.distributed as dist

rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
dist.init_process_group("gloo")
ok_all = True
for k in (1, 2):
    try:
        g = dist.new_group(backend="nccl")
        x = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(x, group=g)
        torch.cuda.synchronize()
        ok = bool((x == n * (n + 1) / 2).all().item())
        dist.destroy_process_group(g)
        print(f"COMM n={k} ok={int(ok)}", flush=True)
    except Exception as e:  # the second communicator's init fails on an affected NCCL
        ok = False
        msg = str(e).replace("\n", " ")[:200]
        print(f"COMM n={k} ok=0 error={msg}", flush=True)
    ok_all &= ok
    # Both ranks take the same path (gloo still works): keep them in step.
    dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok_all else 1)
