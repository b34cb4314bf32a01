"""One rank of the net_autotune benchmark; run by bench/gpu/autotune.sh (shared/docs/gpu-testbed.md).

Runs a plan of phases, one all_reduce size at a time, and checks every result on every rank:

  size:BYTES:N            N all_reduces of BYTES (float32), each one followed by
                          torch.cuda.synchronize(), so that the time between two enqueues (what
                          net_autotune's epoch program sees) is the time of one all_reduce;
  decode:BYTES:T[:PER]    T "tokens" of PER (default 160) back-to-back all_reduces of BYTES
                          (bf16, one buffer each), then one synchronize per token;
  contend:BYTES:A:B:C     A + B + C all_reduces as in size:, with a loopback flood (FLOOD_PAIRS
                          TCP streams through 127.0.0.1, each a sender and a receiver process)
                          started by rank 0 after the first A and stopped after the next B;
  isweep:BYTES:N:C1,C2..  the static sweep inside this job: for each candidate C (net_autotune's
                          numbering: 1 Ring/Simple, 2 Ring/LL, 3 Ring/LL128, 4 Tree/Simple,
                          5 Tree/LL, 6 Tree/LL128) N all_reduces as in size: on a communicator
                          of its own that NCCL_ALGO/NCCL_PROTO restrict to that choice (set while
                          NCCL creates it, at its first all_reduce, traced as iswarm<C>; NCCL reads
                          both when it tunes a new communicator), traced as isweep<i>_<BYTES>_c<C>.
                          The tuner runs there too, but with one usable table entry every
                          candidate of net_autotune runs as NCCL's choice and is skipped.

  ab:BYTES:B:R:ARMS       the in-process static sweep on net_autotune's own communicator: blocks
                          of B all_reduces as in size:, one per arm of ARMS (comma-separated: 'a'
                          net_autotune deciding, a number c: candidate c pinned, 0 NCCL's choice),
                          R rounds, the arms rotated by one each round; every pin is staged
                          before the phase (rank 0 runs `ncclbpf config --at-seq N PID...
                          autotune_pin CLASS=c+1`, NCCLBPF_CLI, one call per block, while every
                          rank waits on a gloo barrier), so all ranks switch at the same
                          collective and nothing pauses inside the phase; B >= 65 lead-in
                          all_reduces run first (net_autotune deciding, traced <name>_lead);
                          blocks are traced <name>_<round>_<arm> (a, c0 .. c7);
  abdec:BYTES:T:R:ARMS[:PER]  the same on the decode pattern, blocks of T tokens;
  floodon:0 / floodoff:0  start / stop the loopback flood (as contend:) between phases;
  fsize:BYTES:N           as size:, named apart (the report takes size: phases as the sizes to
                          converge on; fsize: runs into and out of a flood).

Phases are separated by ';' in PLAN. No other collective is issued (no barrier), so the k-th
all_reduce of the run is the tuner's k-th decision (its sequence number), and NCCL's TUNING
line k of rank 0 says what was applied to it.

Each rank fills its input from a generator seeded by its rank with small integers, so the sum is
exact and every rank computes the expected result itself; every all_reduce is compared with it
on the device (the count of wrong all_reduces accumulates there and is read at each phase's end).

Rank 0 writes TRACE (if set): one line per all_reduce (size, contend) or per token (decode):
  seq_first seq_last phase_index phase_name bytes us flood
with us the time of that all_reduce (or token) measured around it (synchronized before and
after), flood 1 while the flood runs. Every rank prints "PHASE rank=R ..." per phase and
"DONE rank=R checks=C bad=B"; with HOLD_FILE it then prints "HOLDING rank=R pid=P ..." and waits
until that file exists (HOLD_TIMEOUT seconds at most) before destroying the process group.

`python3 autotune.py --flood PAIRS SECONDS` is the flood itself (no torch): PAIRS sender/receiver
process pairs over 127.0.0.1 until SIGTERM or SECONDS; prints "FLOOD pairs=.. seconds=..
bytes=.. gibps=.." at the end.
"""
import os
import signal
import socket
import subprocess
import sys
import time


# ----------------------------------------------------------------------------- the flood
def flood_main(pairs, limit):
    stop_at = time.monotonic() + limit
    # A rank pinned to its own cores (autotune.sh PIN=1) starts the flood: the flood competes
    # for the network stack of the whole host, not for that rank's cores alone.
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except OSError:
        pass
    parent = os.getpid()
    owner = os.getppid()  # the rank that started it: the flood ends when it is gone
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(pairs)
    port = lsock.getsockname()[1]
    children = []
    rfd, wfd = os.pipe()

    def on_term(*_):
        raise SystemExit(0)

    def child(fn):
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGTERM, on_term)
                fn()
            except BaseException:
                pass
            finally:
                os._exit(0)
        children.append(pid)

    def receiver():
        s, _ = lsock.accept()
        buf = bytearray(1 << 20)
        while time.monotonic() < stop_at + 5 and os.getppid() == parent:
            if not s.recv_into(buf):
                break

    def sender():
        s = socket.create_connection(("127.0.0.1", port))
        buf = b"\x5a" * (1 << 20)
        sent = 0
        try:
            while time.monotonic() < stop_at and os.getppid() == parent:
                sent += s.send(buf)
        finally:
            os.write(wfd, f"{sent}\n".encode())

    for _ in range(pairs):
        child(receiver)
        child(sender)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    t0 = time.monotonic()
    while not stopped and time.monotonic() < stop_at and os.getppid() == owner:
        time.sleep(0.02)
    secs = time.monotonic() - t0
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    left, end = set(children), time.monotonic() + 5
    while left and time.monotonic() < end:
        for pid in list(left):
            if os.waitpid(pid, os.WNOHANG)[0]:
                left.discard(pid)
        time.sleep(0.01)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(wfd)
    data = b""
    while True:
        chunk = os.read(rfd, 4096)
        if not chunk:
            break
        data += chunk
    total = sum(int(v) for v in data.split())
    print(f"FLOOD pairs={pairs} seconds={secs:.2f} bytes={total} gibps={total / max(secs, 1e-9) / 2**30:.2f}", flush=True)


# ----------------------------------------------------------------------------- the rank
def parse_plan(text):
    phases = []
    for i, item in enumerate(p for p in text.split(";") if p.strip()):
        f = item.strip().split(":")
        kind, nbytes = f[0], int(f[1])
        if kind in ("size", "fsize"):
            phases.append(dict(kind=kind, bytes=nbytes, n=int(f[2])))
        elif kind == "decode":
            phases.append(dict(kind=kind, bytes=nbytes, tokens=int(f[2]), per=int(f[3]) if len(f) > 3 else 160))
        elif kind == "contend":
            phases.append(dict(kind=kind, bytes=nbytes, a=int(f[2]), b=int(f[3]), c=int(f[4])))
        elif kind in ("ab", "abdec"):
            arms = ["a" if a == "a" else int(a) for a in f[4].split(",")]
            phases.append(dict(kind=kind, bytes=nbytes, block=int(f[2]), rounds=int(f[3]), arms=arms,
                               per=int(f[5]) if len(f) > 5 else 160))
            if phases[-1]["block"] * (phases[-1]["per"] if kind == "abdec" else 1) < 65:
                raise SystemExit(f"{item!r}: a block must be at least 65 all_reduces (a stage is 64 ahead)")
        elif kind in ("floodon", "floodoff"):
            phases.append(dict(kind=kind, bytes=nbytes))
        elif kind == "isweep":
            phases.append(dict(kind=kind, bytes=nbytes, n=int(f[2]), cands=[int(c) for c in f[3].split(",")]))
        else:
            raise SystemExit(f"unknown phase {item!r}")
        phases[-1]["name"] = f"{kind}{i}_{nbytes}"
    return phases


def main():
    import torch
    import torch.distributed as dist

    plan = parse_plan(os.environ.get("PLAN", "size:65536:200"))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    label = sys.argv[1] if len(sys.argv) > 1 else "?"
    trace = open(os.environ["TRACE"], "w") if rank == 0 and os.environ.get("TRACE") else None
    pairs = int(os.environ.get("FLOOD_PAIRS", "4"))
    flood_limit = float(os.environ.get("FLOOD_LIMIT", "120"))

    def values(r, n, dtype, lo, hi):
        g = torch.Generator(device=dev)
        g.manual_seed(1000 + r)
        return torch.randint(lo, hi, (n,), generator=g, device=dev).to(dtype)

    def inputs(nbytes, dtype, lo, hi):
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        exp = sum(values(r, n, dtype, lo, hi).float() for r in range(world)).to(dtype)
        return values(rank, n, dtype, lo, hi), exp

    seq = 0  # all_reduces of every communicator (the trace's numbering, NCCL's TUNING lines)
    dseq = 0  # those of the default group: net_autotune's decisions there (its sequence number)
    checks = bad_total = 0
    flood = None
    # timeout(1) sends SIGTERM: unwind (the finally below stops the flood) instead of dying.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))

    def flood_start():
        nonlocal flood
        if rank == 0 and pairs > 0:
            flood = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--flood", str(pairs), str(flood_limit)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if os.environ.get("FLOOD_PIDFILE"):
                with open(os.environ["FLOOD_PIDFILE"], "w") as f:
                    f.write(f"{flood.pid}\n")
            print(f"FLOOD started pid={flood.pid} pairs={pairs} at seq={seq}", flush=True)

    def flood_stop():
        nonlocal flood
        if flood is None:
            return
        flood.terminate()
        try:
            out, _ = flood.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            flood.kill()
            out, _ = flood.communicate()
        print(f"{out.strip()} stopped_at_seq={seq}", flush=True)
        flood = None
        if os.environ.get("FLOOD_PIDFILE"):
            try:
                os.unlink(os.environ["FLOOD_PIDFILE"])
            except FileNotFoundError:
                pass

    cand_env = {1: ("Ring", "Simple"), 2: ("Ring", "LL"), 3: ("Ring", "LL128"), 4: ("Tree", "Simple"),
                5: ("Tree", "LL"), 6: ("Tree", "LL128")}
    groups = {}

    def group_for(c):
        """Candidate c's communicator (made at its first use, traced as iswarm<c>)."""
        nonlocal seq
        if c in groups:
            return groups[c]
        saved = {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO")}
        os.environ["NCCL_ALGO"], os.environ["NCCL_PROTO"] = cand_env[c]
        try:
            g = dist.new_group(list(range(world)))
            warm = torch.ones(16, device=dev)
            t0 = time.perf_counter()
            dist.all_reduce(warm, group=g)  # NCCL creates the communicator here
            torch.cuda.synchronize()
            seq += 1
            if trace:
                trace.write(f"{seq} {seq} -1 iswarm{c} 64 {(time.perf_counter() - t0) * 1e6:.1f} 0\n")
            if warm[0].item() != world:
                raise SystemExit(f"iswarm{c}: wrong result {warm[0].item()}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        groups[c] = g
        return g

    # Pins (ab, abdec phases): a gloo group keeps the ranks in step while rank 0 stages them.
    gloo = pids = None
    if any(ph["kind"] in ("ab", "abdec") for ph in plan):
        gloo = dist.new_group(list(range(world)), backend="gloo")
        pids = [None] * world
        dist.all_gather_object(pids, os.getpid(), group=gloo)
    cli = os.environ.get("NCCLBPF_CLI", "ncclbpf")

    def size_class(b):
        for k, lim in enumerate((1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)):
            if b < lim:
                return k
        return 7

    def schedule(ph, per_block):
        """Stages the phase's pins (every rank calls it with nothing in flight); returns the
        blocks as (round, arm) and the lead-in's length in all_reduces."""
        arms, blocks = ph["arms"], []
        for r in range(ph["rounds"]):
            k = r % len(arms)
            blocks += [(r, a) for a in arms[k:] + arms[:k]]
        lead = per_block  # >= 65: the first stage must be 64 decisions ahead (tuner/src/stage.rs)
        torch.cuda.synchronize()
        dist.barrier(group=gloo)
        result = [None]
        if rank == 0:
            cls, at, out = size_class(ph["bytes"]), dseq + lead + 1, []
            for _, a in blocks + [(None, "a")]:  # and back to net_autotune at the end
                cmd = [cli, "config", "--at-seq", str(at), *map(str, pids), "autotune_pin",
                       f"{cls}={0 if a == 'a' else a + 1}"]
                t0 = time.perf_counter()
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
                out.append(f"PIN at={at} class={cls} arm={a} rc={r.returncode} ms={(time.perf_counter() - t0) * 1e3:.0f}"
                           + ("" if r.returncode == 0 else f" output={r.stdout.strip()!r}"))
                if r.returncode != 0:
                    break
                at += per_block
            result[0] = out
        dist.broadcast_object_list(result, src=0, group=gloo)
        if rank == 0:
            print("\n".join(result[0]), flush=True)
        if any(" rc=0 " not in l for l in result[0]):
            raise SystemExit(f"{ph['name']}: staging a pin failed: {result[0][-1]}")
        return blocks, lead

    flooding = 0  # 1 while the flood runs (the trace's last column)
    import gc
    try:
        for pi, ph in enumerate(plan):
            # No collector pauses inside a phase (they would show as slow collectives).
            gc.collect()
            gc.disable()
            t_phase = time.perf_counter()
            acc = torch.zeros((), dtype=torch.int64, device=dev)
            if ph["kind"] == "isweep":
                src, exp = inputs(ph["bytes"], torch.float32, -1000, 1000)
                buf = torch.empty_like(src)
                done = 0
                for c in ph["cands"]:
                    g = group_for(c)
                    for i in range(ph["n"]):
                        buf.copy_(src)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        dist.all_reduce(buf, group=g)
                        torch.cuda.synchronize()
                        us = (time.perf_counter() - t0) * 1e6
                        seq += 1
                        acc += (buf != exp).any()
                        if trace:
                            trace.write(f"{seq} {seq} {pi} {ph['name']}_c{c} {ph['bytes']} {us:.1f} 0\n")
                    done += ph["n"]
                hist = acc.reshape(1)
            elif ph["kind"] in ("floodon", "floodoff"):
                if ph["kind"] == "floodon":
                    flood_start()
                    flooding = 1
                else:
                    flood_stop()
                    flooding = 0
                done = 0
                hist = acc.reshape(1)
            elif ph["kind"] == "ab":
                src, exp = inputs(ph["bytes"], torch.float32, -1000, 1000)
                buf = torch.empty_like(src)
                B = ph["block"]
                blocks, lead = schedule(ph, B)
                names = [f"{ph['name']}_lead"] * lead
                for r, a in blocks:
                    names += [f"{ph['name']}_{r}_{'a' if a == 'a' else 'c' + str(a)}"] * B
                hist = torch.zeros(len(names), dtype=torch.int64, device=dev)
                for i, name in enumerate(names):
                    buf.copy_(src)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    dist.all_reduce(buf)
                    torch.cuda.synchronize()
                    us = (time.perf_counter() - t0) * 1e6
                    seq += 1
                    dseq += 1
                    acc += (buf != exp).any()
                    hist[i] = acc
                    if trace:
                        trace.write(f"{seq} {seq} {pi} {name} {ph['bytes']} {us:.1f} {flooding}\n")
                done = len(names)
            elif ph["kind"] in ("size", "fsize", "contend"):
                src, exp = inputs(ph["bytes"], torch.float32, -1000, 1000)
                buf = torch.empty_like(src)
                n = ph["a"] + ph["b"] + ph["c"] if ph["kind"] == "contend" else ph["n"]
                on_at = ph.get("a", -1)
                off_at = ph.get("a", 0) + ph.get("b", 0)
                hist = torch.zeros(n, dtype=torch.int64, device=dev)  # wrong ones so far, per all_reduce
                for i in range(n):
                    if ph["kind"] == "contend" and i == on_at:
                        flood_start()
                        flooding = 1
                    if ph["kind"] == "contend" and i == off_at:
                        flood_stop()
                        flooding = 0
                    buf.copy_(src)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    dist.all_reduce(buf)
                    torch.cuda.synchronize()
                    us = (time.perf_counter() - t0) * 1e6
                    seq += 1
                    dseq += 1
                    acc += (buf != exp).any()
                    hist[i] = acc
                    if trace:
                        trace.write(f"{seq} {seq} {pi} {ph['name']} {ph['bytes']} {us:.1f} {flooding}\n")
                if ph["kind"] == "contend":
                    flood_stop()
                    flooding = 0
                done = n
            else:  # decode, abdec: the same tokens; abdec names them by block
                src, exp = inputs(ph["bytes"], torch.bfloat16, -4, 5)
                per = ph["per"]
                if ph["kind"] == "abdec":
                    T = ph["block"]
                    blocks, lead = schedule(ph, T * per)
                    names = [f"{ph['name']}_lead"] * -(-lead // per)
                    for r, a in blocks:
                        names += [f"{ph['name']}_{r}_{'a' if a == 'a' else 'c' + str(a)}"] * T
                else:
                    names = [ph["name"]] * ph["tokens"]
                bufs = torch.empty((per, src.numel()), dtype=src.dtype, device=dev)
                hist = torch.zeros(len(names), dtype=torch.int64, device=dev)
                for tok, name in enumerate(names):
                    bufs.copy_(src.expand(per, -1))
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for j in range(per):
                        dist.all_reduce(bufs[j])
                    torch.cuda.synchronize()
                    us = (time.perf_counter() - t0) * 1e6
                    acc += (bufs != exp).any(dim=1).sum()
                    hist[tok] = acc
                    if trace:
                        trace.write(f"{seq + 1} {seq + per} {pi} {name} {ph['bytes']} {us:.1f} {flooding}\n")
                    seq += per
                    dseq += per
                done = len(names) * per
            gc.enable()
            bad = int(acc.item())
            checks += done
            bad_total += bad
            # The first wrong all_reduce (or token) of the phase, 0-based, if any.
            first = int(torch.nonzero(hist)[0].item()) if bad else -1
            if trace:
                trace.flush()
            print(f"PHASE rank={rank} label={label} name={ph['name']} checks={done} bad={bad} first_bad={first} "
                  f"seq_end={seq} seconds={time.perf_counter() - t_phase:.2f}", flush=True)
    finally:
        flood_stop()
    print(f"DONE rank={rank} label={label} checks={checks} bad={bad_total} seq={seq}", flush=True)
    if trace:
        trace.close()
    if os.environ.get("HOLD_FILE"):
        hold = os.environ["HOLD_FILE"]
        limit = float(os.environ.get("HOLD_TIMEOUT", "60"))
        print(f"HOLDING rank={rank} pid={os.getpid()} checks={checks} bad={bad_total}", flush=True)
        t0 = time.monotonic()
        while not os.path.exists(hold) and time.monotonic() - t0 < limit:
            time.sleep(0.05)
        seen = "released" if os.path.exists(hold) else "timed out"
        print(f"HOLD {seen} rank={rank} after {time.monotonic() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad_total else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--flood":
        flood_main(int(sys.argv[2]), float(sys.argv[3]))
    else:
        main()
