#!/bin/bash
# rec.sh NAME ARM IO TEST SIZE [bench args...] : perf record -a, cpu-clock at $FREQ (997) Hz with
# dwarf call graphs, plus every hrtimer expiry (no call graph) to count BBR pacing timers
. /work/perf-run/env.sh
name=$1 a=$2 io=$3 t=$4 s=$5; shift 5
o=/work/perf-run/out/$name
echo "load before: $(uptime)" > $o.rec.txt
echo "cc: $(cat /proc/sys/net/ipv4/tcp_congestion_control); env: $(env | grep -E '^NCCL_BPF_IO' | tr '\n' ' ')" >> $o.rec.txt
NCCL_BPF_IO=$io perf record -a -e "cpu-clock/freq=${FREQ:-997}/" -e 'timer:hrtimer_expire_entry/call-graph=no/' -c 1 --call-graph dwarf,${STACK:-16384} -o $o.perf.data -- $B arm --arm $a --test $t --size $s "$@" > $o.rec.result 2>$o.rec.err
echo "load after: $(uptime)" >> $o.rec.txt
grep @result $o.rec.result >> $o.rec.txt
echo "tcp_pace_kick expiries: $(perf script -i $o.perf.data -F event,trace 2>/dev/null | grep -c 'function=tcp_pace_kick')" >> $o.rec.txt
tail -1 $o.rec.err >> $o.rec.txt
perf script -i $o.perf.data -F comm,pid,tid,cpu,event,ip,sym,dso 2>/dev/null > $o.script
