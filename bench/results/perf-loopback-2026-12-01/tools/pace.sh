#!/bin/bash
# pace.sh TAG ARM IO SIZE TOTAL_MIB [env...]: one throughput run recorded with a light cpu-clock
# sampler (499 Hz, no call graphs) and the hrtimer tracepoints; prints the figure, the BBR pacing
# timers (tcp_pace_kick expiries) per message, and where the threads ran (share of samples per CPU)
. /work/perf-run/env.sh
tag=$1 a=$2 io=$3 s=$4 t=$5; shift 5
f=/tmp/pace-$$.data
v=$(env "$@" NCCL_BPF_IO=$io perf record -q -a -e 'cpu-clock/freq=499/' -e timer:hrtimer_expire_entry -c 1 -o $f -- $B arm --arm $a --test tput --size $s --total $(($t<<20)) 2>/dev/null | awk '/@result value/{print $3}')
msgs=$(( (t<<20) / s ))
pk=$(perf script -i $f -F event,trace 2>/dev/null | grep -c "hrtimer_expire_entry.*function=tcp_pace_kick")
pl=$(perf report -i $f --no-children --sort comm,cpu --stdio -g none 2>/dev/null | awk '/^# Samples/{k++} k==1 && /ncclbpf/ && $1+0>=3 {gsub("%","",$1); n=$NF; $1=$1; c=$0; sub(/^[^ ]+ /,"",c); sub(/ [0-9]+$/,"",c); gsub(/ncclbpf-bench/,"poll",c); gsub(/ncclbpf /,"",c); printf "%s@%d:%.0f ", c, n, $1}')
printf "%s %.2f GB/s pace-kicks/msg %.2f | %s\n" "$tag" "$v" "$(echo "$pk / $msgs" | bc -l)" "$pl"
rm -f $f
