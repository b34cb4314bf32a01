#!/usr/bin/env python3
"""timeline.py PERF_SCRIPT_NS: one-way message timeline of a ping-pong from syscall tracepoints
(send enter/exit: writev for the plugin, sendto for raw TCP; recvfrom exits with ret > 0).
For each one-way message: send syscall, send exit -> first successful receive, further
successful receives of that message, last receive -> the reply's send enter. Medians in µs."""
import sys, re, statistics
ev = []
for l in open(sys.argv[1]):
    m = re.match(r'\s*(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)', l)
    if not m: continue
    tid, t, io, sc, rest = m.groups()
    ev.append((float(t) * 1e6, int(tid), io, sc, rest))
ev.sort()
SEND = ('writev', 'sendto')
segs = {'send syscall': [], 'send exit -> first data read': [], 'extra reads of the message': [],
        'last read -> reply send enter': [], 'one way (send enter -> reply send enter)': []}
reads_per_msg = []
i = 0
pending = None  # (t_enter, t_exit, sender tid)
reads = []
for t, tid, io, sc, rest in ev:
    if sc in SEND and io == 'enter':
        if pending and reads and tid != pending[2]:
            t0, t1, _ = pending
            segs['send syscall'].append(t1 - t0)
            segs['send exit -> first data read'].append(reads[0] - t1)
            segs['extra reads of the message'].append(reads[-1] - reads[0])
            segs['last read -> reply send enter'].append(t - reads[-1])
            segs['one way (send enter -> reply send enter)'].append(t - t0)
            reads_per_msg.append(len(reads))
        pending = [t, None, tid]
        reads = []
    elif sc in SEND and io == 'exit' and pending and tid == pending[2] and pending[1] is None:
        pending[1] = t
    elif sc == 'recvfrom' and io == 'exit' and pending and pending[1] is not None and tid != pending[2]:
        reads.append(t)
n = len(reads_per_msg)
# drop warm-up: first 50
print(f'{n} one-way messages; successful reads per message: median {statistics.median(reads_per_msg)}')
for k, v in segs.items():
    v = v[50:]
    print(f'| {k} | {statistics.median(v):.2f} | {statistics.mean(v):.2f} |')
