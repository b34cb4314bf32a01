#!/usr/bin/env python3
"""sched.py TIMEHIST_TXT MESSAGES: per thread of the bench, from `perf sched timehist --state`:
run time, times switched out asleep (S) or still runnable (R: preempted or sched_yield), time
runnable but waiting for a CPU (sch delay after a wake-up + wait after an R switch-out), per message."""
import re, sys, collections
msgs = float(sys.argv[2])
L = re.compile(r'^\s*([\d.]+)\s+\[(\d+)\]\s+(.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s*$')
run = collections.Counter(); sw = collections.defaultdict(collections.Counter)
rwait = collections.Counter(); cpu = collections.defaultdict(collections.Counter)
last_state = {}
t0 = t1 = None
for l in open(sys.argv[1]):
    m = L.match(l)
    if not m: continue
    t, c, task, wait, delay, rt, st = m.groups()
    t = float(t)
    if 'ncclbpf' not in task: continue
    name = task
    t0 = t if t0 is None else t0; t1 = t
    run[name] += float(rt); cpu[name][int(c)] += float(rt)
    sw[name][st] += 1
    # runnable-waiting before this slice: after a wake-up its sch delay; after an R switch-out, all of the wait
    rwait[name] += float(wait) if last_state.get(name) == 'R' else float(delay)
    last_state[name] = st
wall = (t1 - t0) * 1000
tot_run = sum(run.values()); tot_rw = sum(rwait.values())
print(f'span {wall:.0f} ms; bench threads ran {tot_run:.0f} ms ({tot_run/wall:.2f} CPUs), waited runnable {tot_rw:.0f} ms: '
      f'on average {(tot_run+tot_rw)/wall:.2f} threads runnable')
print('| thread | run ms (cpu0/cpu1) | switched out asleep (S) | switched out runnable (R) | runnable but waiting, ms | per message: slices, sleeps, µs waiting runnable |')
print('|---|---:|---:|---:|---:|---:|')
for n, r in run.most_common():
    if r < 0.01 * tot_run: continue
    s = sw[n]
    print(f'| {n} | {r:.0f} ({cpu[n][0]:.0f}/{cpu[n][1]:.0f}) | {s["S"]} | {s["R"]} | {rwait[n]:.0f} | '
          f'{sum(s.values())/msgs:.2f}, {s["S"]/msgs:.2f}, {rwait[n]*1000/msgs:.1f} |')
