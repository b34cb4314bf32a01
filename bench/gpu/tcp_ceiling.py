"""The loopback TCP ceiling of a machine: what any socket transport (NCCL's Socket, ours) can move
between ranks on one host, for the bandwidth goals of issue 11.

Usage: python3 bench/gpu/tcp_ceiling.py [--seconds S] [--streams 1,2,4,8,16] [--chunk-mib M]

For each stream count N and each pattern it starts N sender and N receiver processes (one
blocking TCP connection each, over 127.0.0.1, no Python copy in the loop: sendall of one buffer,
recv_into one buffer) and prints the bytes received per second, in GB/s:
  one-way   N streams from "rank 0" to "rank 1" (what a broadcast's one direction needs);
  both-ways N streams each way at once (2 ranks of a ring all_reduce: every rank sends and
            receives its share at the same time), the figure per direction.
NCCL's bus bandwidth at 2 ranks is the bytes each rank sends per second (all_reduce, broadcast,
all_gather alike), so 'per direction' is the figure to set beside it. Processes, not threads, so
that the interpreter's lock does not limit the copying; the kernel's copies (user to socket
buffer and back, twice per byte) are what is measured.
"""
import argparse
import multiprocessing as mp
import socket
import time


def receiver(port, ready, start, seconds, chunk, out):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1)
    ready.set()
    conn, _ = srv.accept()
    buf = bytearray(chunk)
    view = memoryview(buf)
    start.wait()
    got, t0 = 0, time.perf_counter()
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        if time.perf_counter() - t0 <= seconds:
            got += n
    out.put(got / seconds)
    conn.close()
    srv.close()


def sender(port, start, seconds, chunk):
    s = socket.create_connection(("127.0.0.1", port))
    buf = bytes(chunk)
    start.wait()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds + 0.05:
        s.sendall(buf)
    s.shutdown(socket.SHUT_WR)
    s.close()


def measure(pairs, seconds, chunk, base):
    """pairs: list of connections; returns total bytes/s received."""
    ctx = mp.get_context("fork")
    start = ctx.Event()
    out = ctx.Queue()
    procs = []
    for i in range(pairs):
        ready = ctx.Event()
        r = ctx.Process(target=receiver, args=(base + i, ready, start, seconds, chunk, out))
        r.start()
        ready.wait()
        s = ctx.Process(target=sender, args=(base + i, start, seconds, chunk))
        s.start()
        procs += [r, s]
    time.sleep(0.2)  # every connection accepted
    start.set()
    total = sum(out.get() for _ in range(pairs))
    for p in procs:
        p.join()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--chunk-mib", type=int, default=4)
    a = ap.parse_args()
    chunk = a.chunk_mib << 20
    print(f"loopback TCP ceiling, {a.seconds:.0f} s per figure, {a.chunk_mib} MiB per send, cpus {mp.cpu_count()}")
    print("| streams (per direction) | one-way GB/s | both ways at once, GB/s per direction |")
    print("|---:|---:|---:|")
    base = 42000
    for n in [int(x) for x in a.streams.split(",")]:
        one = measure(n, a.seconds, chunk, base)
        base += n
        both = measure(2 * n, a.seconds, chunk, base) / 2
        base += 2 * n
        print(f"| {n} | {one / 1e9:.2f} | {both / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
