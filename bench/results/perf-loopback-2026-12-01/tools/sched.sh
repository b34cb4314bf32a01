#!/bin/bash
# sched.sh NAME ARM IO SIZE TOTAL_MIB [env...]
. /work/perf-run/env.sh
name=$1 a=$2 io=$3 s=$4 t=$5; shift 5
o=/work/perf-run/out/$name
echo "load before: $(uptime); cc $(cat /proc/sys/net/ipv4/tcp_congestion_control); $*" > $o.sched.txt
env "$@" NCCL_BPF_IO=$io perf sched record -o /tmp/$name.sched.data -- $B arm --arm $a --test tput --size $s --total $(($t<<20)) 2>/dev/null | grep value >> $o.sched.txt
echo "load after: $(uptime)" >> $o.sched.txt
perf sched timehist -i /tmp/$name.sched.data --state 2>/dev/null > /tmp/$name.timehist
python3 /work/perf-run/sched.py /tmp/$name.timehist $(( (t<<20)/s + 8 )) >> $o.sched.txt
rm -f /tmp/$name.sched.data /tmp/$name.timehist
cat $o.sched.txt
