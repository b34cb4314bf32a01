#!/bin/bash
# stat.sh NAME ARM IO TEST SIZE [bench args...]
. /work/perf-run/env.sh
name=$1 a=$2 io=$3 t=$4 s=$5; shift 5
EV=task-clock,context-switches,cpu-migrations,sched:sched_wakeup,raw_syscalls:sys_enter,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_wait,io_uring:io_uring_submit_req,io_uring:io_uring_poll_arm,io_uring:io_uring_task_work_run,ipi:ipi_send_cpu,ipi:ipi_send_cpumask,irq_vectors:reschedule_entry,irq_vectors:call_function_single_entry,irq_vectors:local_timer_entry,irq:softirq_entry,net:netif_rx,sock:sk_data_ready,sock:sock_exceed_buf_limit
o=/work/perf-run/out/$name
echo "load before: $(uptime)" > $o.stat.txt
NCCL_BPF_IO=$io perf stat -x, -e $EV -o $o.stat.csv -- $B arm --arm $a --test $t --size $s "$@" > $o.stat.result 2>&1
echo "load after: $(uptime)" >> $o.stat.txt
cat $o.stat.result | grep @result >> $o.stat.txt
