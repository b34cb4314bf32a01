#!/usr/bin/env python3
"""Summarises `perf script -F comm,pid,tid,cpu,event,ip,sym,dso` output of a cpu-clock,
call-graph recording of one `ncclbpf-bench arm` run (system-wide).

usage: prof.py SCRIPT --freq HZ --messages N --mode tput|lat [--folded OUT] [--md]

Prints markdown tables: CPU share per thread (and CPU), time per kind of work per thread role
(in % of all samples and in CPU-µs per message), the top leaf symbols, and the syscalls the
samples are in. Writes folded stacks (role;frames count) for a flame graph with --folded.
"""
import argparse
import collections
import re

ap = argparse.ArgumentParser()
ap.add_argument('script')
ap.add_argument('--freq', type=float, required=True)
ap.add_argument('--messages', type=float, required=True)
ap.add_argument('--mode', default='tput')
ap.add_argument('--folded')
ap.add_argument('--top', type=int, default=15)
a = ap.parse_args()

HDR = re.compile(r'^(.*?)\s+(-?\d+)/(-?\d+)\s+\[(\d+)\]\s+(\S+):')
samples = []  # (comm, pid, tid, cpu, frames leaf-first [(sym, dso)])
cur = None
for line in open(a.script, errors='replace'):
    if not line.strip():
        continue
    if not line[0].isspace():
        m = HDR.match(line)
        if not m:
            continue
        if not m.group(5).startswith('cpu-clock'):
            cur = None
            continue
        cur = [m.group(1).strip(), int(m.group(2)), int(m.group(3)), int(m.group(4)), []]
        samples.append(cur)
    elif cur is not None:
        p = line.strip().split(None, 1)
        rest = p[1] if len(p) > 1 else '[unknown]'
        m = re.match(r'^(.*?)\s+\((.*)\)$', rest)
        sym, dso = (m.group(1), m.group(2)) if m else (rest, '')
        sym = re.sub(r'\+0x[0-9a-f]+$', '', sym)
        cur[4].append((sym, dso))

for smp in samples:
    fr = smp[4]
    for i, (sym, dso) in enumerate(fr):
        if dso == 'inlined':
            d = next((d2 for _, d2 in fr[i + 1:] if d2 != 'inlined'), '')
            fr[i] = (sym, d)
total = len(samples)
if total == 0:
    raise SystemExit('no samples')

# ---------------------------------------------------------------- thread roles
RECV_HINTS = ('irecv', 'progress_recv', 'tcp_recvmsg', 'spin_read', 'read_exact')
SEND_HINTS = ('isend', 'progress_send', 'tcp_sendmsg', 'spin_write', 'write_all')
hint = collections.defaultdict(lambda: [0, 0])
pids = collections.Counter()
for comm, pid, tid, cpu, fr in samples:
    if comm.startswith('ncclbpf'):
        pids[pid] += 1
    syms = ' '.join(s for s, _ in fr)
    hint[tid][0] += any(h in syms for h in RECV_HINTS)
    hint[tid][1] += any(h in syms for h in SEND_HINTS)
bench_pid = pids.most_common(1)[0][0] if pids else None


def role(comm, pid, tid):
    if pid == 0 or comm == 'swapper':
        return 'idle (swapper)'
    if pid != bench_pid:
        return 'other processes (perf, kthreads)'
    if comm.startswith('ncclbpf io'):
        return 'engine worker ' + comm.split()[-1]
    m = re.match(r'ncclbpf ([SR])\d+', comm)
    if m:
        return 'helper threads ' + m.group(1) + '*'
    if tid == pid:
        return 'main (initiator)' if a.mode == 'lat' else 'main (timer, barrier)'
    r, s = hint[tid]
    if a.mode == 'lat':
        return 'echo thread'
    return 'receiver (polls test)' if r >= s else 'sender (polls test)'


# ---------------------------------------------------------------- kinds of work
COPY = ('_copy_to_iter', '_copy_from_iter', 'copy_folio_from_iter_atomic', 'rep_movs_alternative',
        'copy_user_generic', 'copy_page_to_iter', '__memcpy', 'memcpy_orig', 'memcpy',
        '__memmove_avx_unaligned_erms', '__memcpy_avx_unaligned_erms', 'skb_copy_bits',
        'copy_user_enhanced_fast_string')
IRQ = ('asm_sysvec_apic_timer_interrupt', 'asm_common_interrupt', 'asm_sysvec_reschedule_ipi',
       'asm_sysvec_call_function_single', 'asm_sysvec_call_function')
WAKE = ('try_to_wake_up', 'eventfd_write', 'eventfd_read', 'io_poll_wake', 'task_work_add',
        '__wake_up', 'wake_up_q', 'futex_wake', '__io_req_task_work_add', 'kick_process',
        'ttwu_', 'io_eventfd_signal', '__io_cqring_wake')
SCHED = ('__schedule', 'schedule', 'finish_task_switch', 'pick_next_task', 'do_sched_yield',
         '__x64_sys_sched_yield', 'yield_task_fair', 'update_curr', 'sched_balance')
NET = ('tcp_', 'ip_', '__ip_', 'skb_', '__skb', 'net_rx_action', 'process_backlog', '__netif',
       'netif_', 'loopback_xmit', '__dev_queue_xmit', 'dev_hard_start_xmit', 'sock_', '__sock',
       'inet_', '__inet', 'sk_', '__sk', 'release_sock', 'lock_sock', '__tcp', 'kfree_skb',
       '__alloc_skb', 'kmalloc_reserve', '__kfree_skb', 'napi_', '__napi', 'sock_recvmsg',
       'sock_sendmsg', '__sys_recvfrom', '__sys_sendto', 'validate_xmit', 'dst_', 'nf_hook')
URING = ('io_uring', 'io_submit_sqes', 'io_issue_sqe', '__io_issue_sqe', 'io_cqring_wait',
         'tctx_task_work', 'io_handle_tw_list', 'io_poll', '__io_', 'io_send', 'io_recv',
         'io_req_', 'io_fill_cqe', 'io_arm_poll', '__io_arm_poll', 'io_cqe', 'io_init_req',
         'io_free', 'io_submit', 'io_run_task_work', 'ctx_flush_and_put', 'io_queue_sqe',
         'io_import', 'io_sendmsg', 'io_recvmsg', 'io_send_setup', 'io_recv_', 'io_sq_')
EPOLL = ('ep_poll', 'do_epoll_wait', '__x64_sys_epoll_wait', 'ep_send_events', 'ep_item_poll',
         'ep_poll_callback', 'ep_')
ENTRY = ('entry_SYSCALL', 'do_syscall_64', 'syscall_exit', 'exit_to_user_mode', 'x64_sys_call',
         'fdget', 'fput', '__fget', 'fget', 'syscall_return', '__x64_sys_', '__do_sys_',
         'ksys_', 'vfs_', '__audit', 'rw_verify_area', 'security_', 'apparmor_', 'import_ubuf',
         'do_writev', 'do_iter', 'import_iovec', '__check_object_size', 'check_heap_object',
         '__virt_addr_valid', 'rcu_note_context', '__cond_resched', 'irqentry_exit',
         'arch_exit_to_user_mode', 'syscall_enter', 'read_tsc', '__rseq', 'rseq_')


def is_kernel(sym, dso):
    return dso.startswith('[kernel') or dso in ('[unknown]',) and sym.startswith('__x64') \
        or dso == '[kernel.kallsyms]'


def kind(comm, fr):
    """fr: leaf-first [(sym, dso)]."""
    if comm == 'swapper' or any(s in ('do_idle', 'pv_native_safe_halt', 'default_idle', 'cpuidle_idle_call') for s, _ in fr[:6]):
        return 'idle'
    syms = [s for s, _ in fr]
    # Cut at an interrupt entry: the interrupted context is what ran.
    irq_at = next((i for i, s in enumerate(syms) if s in IRQ), None)
    if irq_at is not None:
        upper = syms[:irq_at]
        below = syms[irq_at + 1:irq_at + 3]
        if below[:2] == ['_raw_spin_unlock_irqrestore', 'tcp_write_xmit']:
            return 'BBR pacing: timer irq + softirq right after arming it'
        if any(s in ('tcp_pace_kick', 'tcp_tsq_handler', 'tcp_tsq_write', 'tcp_tasklet_func') for s in upper):
            return 'BBR pacing: timer softirq resumes TCP send'
        if any(s == 'net_rx_action' or s == 'process_backlog' for s in upper):
            return 'softirq at irq exit: loopback rx (TCP receive)'
        return 'irq/softirq at irq exit (timer, RCU, IPI)'
    leaf, ldso = fr[0]
    kernel = ldso.startswith('[kernel') or ldso == '[vdso]'
    if not kernel:
        if 'libnccl-net-bpf' in ldso:
            if any('crossbeam' in s for s in syms[:3]):
                return 'user: engine channel (crossbeam)'
            if any(s.startswith('ncclbpf_netplugin::engine') for s in syms[:4]) or \
                    any('uring::run' in s or 'epoll::run' in s or 'io_uring::' in s for s in syms[:4]):
                return 'user: engine worker loop'
            return 'user: plugin isend/irecv/test'
        if 'ncclbpf-bench' in ldso:
            return 'user: bench/harness'
        if 'libc' in ldso:
            if leaf.startswith(('pthread_mutex', '__pthread_mutex', '__lll')):
                return 'user: libc locks'
            return 'user: libc (syscall wrappers)'
        return 'user: other'
    if leaf in COPY or any(s in COPY for s in syms[:2]):
        if any(('recvmsg' in s or 'io_recv' in s or 'tcp_read' in s or 'recvfrom' in s) for s in syms):
            return 'copy skb→user (receive)'
        return 'copy user→skb (send)'
    # irq-off time shows up at the point interrupts come back on; attribute by caller
    if leaf.startswith(('_raw_spin_unlock_irq', 'handle_softirqs', '__local_bh_enable_ip', 'do_softirq')):
        up = syms[1:12]
        if syms[1] == 'tcp_write_xmit':
            return 'BBR pacing: arming the pacing hrtimer (irqs off)'
        if any(s.startswith(WAKE) for s in up):
            return 'wake-up (irqs off: try_to_wake_up/IPI)'
        if any(s in ('net_rx_action', 'process_backlog', 'do_softirq.part.0', '__dev_queue_xmit', 'tcp_write_xmit', 'ip_finish_output2') for s in up):
            return 'TCP send: loopback xmit+rx (irqs/bh off)'
        if any(s.startswith(SCHED) for s in up):
            return 'scheduler (context switch, yield)'
    if any(s in ('tcp_pace_kick', 'tcp_tsq_handler', 'tcp_tsq_write') for s in syms):
        return 'BBR pacing: timer softirq resumes TCP send'
    for s in syms[:8]:
        if s.startswith(WAKE):
            return 'wake-up (eventfd, try_to_wake_up, task_work)'
        if s.startswith(SCHED):
            return 'scheduler (context switch, yield)'
        if s.startswith(EPOLL):
            return 'epoll'
        if s.startswith(NET):
            break
        if s.startswith(URING):
            break
    if any(s.startswith(NET) for s in syms[:10]):
        return 'TCP/IP stack (not copy)'
    if any(s.startswith(URING) for s in syms[:10]):
        return 'io_uring machinery'
    if any(s.startswith(EPOLL) for s in syms):
        return 'epoll'
    if any(s.startswith(SCHED) for s in syms):
        return 'scheduler (context switch, yield)'
    if any(s.startswith(ENTRY) for s in syms[:6]) or leaf.startswith(ENTRY):
        return 'syscall entry/exit, fd lookup'
    return 'kernel: other'


SYSCALL_OF = [
    ('__do_sys_io_uring_enter', 'io_uring_enter'), ('__x64_sys_io_uring_enter', 'io_uring_enter'),
    ('__x64_sys_sched_yield', 'sched_yield'), ('__x64_sys_recvfrom', 'recvfrom'),
    ('__sys_recvfrom', 'recvfrom'), ('__x64_sys_sendto', 'sendto'), ('__sys_sendto', 'sendto'),
    ('do_writev', 'writev'), ('__x64_sys_writev', 'writev'), ('ksys_write', 'write'),
    ('__x64_sys_write', 'write'), ('ksys_read', 'read'), ('__x64_sys_read', 'read'),
    ('__x64_sys_futex', 'futex'), ('do_epoll_wait', 'epoll_wait'),
    ('__x64_sys_epoll_wait', 'epoll_wait'), ('__x64_sys_poll', 'poll'),
]
USER_SC = {'__GI_sched_yield': 'sched_yield', '__sched_yield': 'sched_yield', '__libc_recv': 'recvfrom',
           '__libc_send': 'sendto', '__GI___writev': 'writev', '__GI___libc_write': 'write',
           '__GI___libc_read': 'read', '__libc_write': 'write', '__libc_read': 'read',
           'epoll_wait': 'epoll_wait', '__GI_epoll_wait': 'epoll_wait'}


def syscall(comm, fr):
    syms = [s for s, _ in fr]
    if comm == 'swapper':
        return 'idle'
    if not (fr[0][1].startswith('[kernel') or fr[0][1] == '[vdso]'):
        return 'user space'
    for s in reversed(syms):  # outermost first
        for k, name in SYSCALL_OF:
            if s == k:
                return name
    # the user frame right below the kernel entry
    for i, (s, d) in enumerate(fr):
        if not d.startswith('[kernel'):
            if s in USER_SC:
                return USER_SC[s]
            if s == 'syscall':
                return 'syscall() (io_uring_enter/futex)'
            break
    if any(s in IRQ for s in syms):
        return 'interrupt'
    return 'kernel (other)'


roles = collections.Counter()
role_cpu = collections.Counter()
kinds = collections.defaultdict(collections.Counter)
sysc = collections.defaultdict(collections.Counter)
leafs = collections.Counter()
folded = collections.Counter()
for comm, pid, tid, cpu, fr in samples:
    r = role(comm, pid, tid)
    roles[r] += 1
    role_cpu[(r, cpu)] += 1
    if not fr:
        fr = [('[unknown]', '')]
    k = kind(comm, fr)
    kinds[r][k] += 1
    sysc[r][syscall(comm, fr)] += 1
    leafs[(fr[0][0], 'k' if fr[0][1].startswith('[kernel') else 'u')] += 1
    folded[';'.join([r.replace(' ', '_')] + [s.replace(';', ':') for s, _ in reversed(fr)])] += 1

us_per_sample = 1e6 / a.freq
per_msg = lambda n: n * us_per_sample / a.messages
pct = lambda n: 100.0 * n / total

print(f'samples: {total} ({total / a.freq:.2f} CPU-s at {a.freq:g} Hz); messages: {a.messages:g}; '
      f'CPU per message: {per_msg(total):.1f} µs (both cores, idle included)\n')
print('| thread | CPU share | CPU-µs per message | on cpu0 / cpu1 |')
print('|---|---:|---:|---:|')
for r, n in roles.most_common():
    c0, c1 = role_cpu[(r, 0)], role_cpu[(r, 1)]
    print(f'| {r} | {pct(n):.1f}% | {per_msg(n):.1f} | {pct(c0):.1f}% / {pct(c1):.1f}% |')

allk = collections.Counter()
for r in kinds:
    allk.update(kinds[r])
main_roles = [r for r, n in roles.most_common() if pct(n) >= 1.0]
print('\n| kind of work (% of all samples) | ' + ' | '.join(main_roles) + ' | all | CPU-µs/msg |')
print('|---|' + '---:|' * (len(main_roles) + 2))
for k, n in allk.most_common():
    if pct(n) < 0.3:
        continue
    cells = ' | '.join(f'{pct(kinds[r][k]):.1f}' if kinds[r][k] else '' for r in main_roles)
    print(f'| {k} | {cells} | {pct(n):.1f} | {per_msg(n):.1f} |')

alls = collections.Counter()
for r in sysc:
    alls.update(sysc[r])
print('\n| in syscall (% of all samples) | ' + ' | '.join(main_roles) + ' | all |')
print('|---|' + '---:|' * (len(main_roles) + 1))
for k, n in alls.most_common():
    if pct(n) < 0.3:
        continue
    cells = ' | '.join(f'{pct(sysc[r][k]):.1f}' if sysc[r][k] else '' for r in main_roles)
    print(f'| {k} | {cells} | {pct(n):.1f} |')

print(f'\ntop {a.top} leaf symbols: ' + '; '.join(
    f'{s} [{d}] {pct(n):.1f}%' for (s, d), n in leafs.most_common(a.top)))

if a.folded:
    with open(a.folded, 'w') as f:
        for k, n in sorted(folded.items()):
            f.write(f'{k} {n}\n')
