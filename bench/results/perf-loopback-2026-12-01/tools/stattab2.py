#!/usr/bin/env python3
"""stattab2.py MESSAGES label=name ...: selected perf stat counters per message, one column per run."""
import sys
msgs=float(sys.argv[1]); cols=[a.split('=',1) for a in sys.argv[2:]]
ROWS=[('task-clock','CPU time (task-clock), µs'),('context-switches','context switches'),('sched:sched_wakeup','wake-ups (sched_wakeup)'),
('raw_syscalls:sys_enter','syscalls, all'),('syscalls:sys_enter_recvfrom','recvfrom'),('syscalls:sys_enter_sendto','sendto'),
('syscalls:sys_enter_writev','writev (message header)'),('syscalls:sys_enter_write','write (eventfd wake of a parked worker)'),
('syscalls:sys_enter_io_uring_enter','io_uring_enter'),('io_uring:io_uring_submit_req','io_uring SQEs submitted'),
('io_uring:io_uring_task_work_run','io_uring task-work runs'),('syscalls:sys_enter_epoll_wait','epoll_wait'),
('syscalls:sys_enter_sched_yield','sched_yield'),('syscalls:sys_enter_futex','futex'),
('ipi:ipi_send_cpu','IPIs sent'),('irq_vectors:local_timer_entry','local timer interrupts (pacing hrtimers)'),('net:netif_rx','loopback packets (netif_rx)')]
vals=[]
for lab,n in cols:
    v={}
    for l in open(f'/work/perf-run/out/{n}.stat.csv'):
        p=l.strip().split(',')
        if len(p)<3 or l.startswith('#'): continue
        try: v[p[2]]=float(p[0])
        except: pass
    r=[l.split()[-1] for l in open(f'/work/perf-run/out/{n}.stat.txt') if 'value' in l]
    vals.append((lab,n,v,float(r[0])))
print('| per 256 KiB message |'+''.join(f' {lab} ({g:.2f} GB/s) |' for lab,n,v,g in vals))
print('|---|'+'---:|'*len(vals))
for k,t in ROWS:
    cells=[]
    for lab,n,v,g in vals:
        x=v.get(k)
        cells.append('–' if x is None else (f'{x*1000/msgs:.0f}' if k=='task-clock' else f'{x/msgs:.2f}'))
    print(f'| {t} | '+' | '.join(cells)+' |')
