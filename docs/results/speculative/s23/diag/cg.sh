#!/bin/bash
# One point; precise CPU of each node cgroup (cpuacct.usage) and throttling (cpu.stat) over t=6..16 s.
BIN=${BIN:-/work/bin-s23/farside-bc98b06}
OUT=${1:-cg}; shift
$BIN lab speculative --out $OUT "$@" --duration-s 20 --repeat 1 > $OUT.log 2>&1 &
LP=$!
for i in $(seq 1 300); do n=$(ls -d /sys/fs/cgroup/unified/farside/*/b0 2>/dev/null | wc -l); [ "$n" -ge 1 ] && break; sleep 0.2; done
sleep 8
snap() { for d in /sys/fs/cgroup/unified/farside/*/b*; do n=$(basename $d); c=/sys/fs/cgroup/cpu/farside/$(basename $(dirname $d))/$n; echo "$n $(awk '/usage_usec/{print $2*1000}' $d/cpu.stat) $(awk '/nr_periods/{p=$2}/nr_throttled/{t=$2}/throttled_time/{tt=$2}END{print p,t,tt}' $c/cpu.stat)"; done; }
snap > $OUT-c1.txt; sleep 10; snap > $OUT-c2.txt
wait $LP
join $OUT-c1.txt $OUT-c2.txt | awk '{printf "%s cpu %.1f ms/s periods %d throttled %d (%.0f%%) throttled_time %.0f ms/s\n", $1, ($6-$2)/1e7, $7-$3, $8-$4, 100*($8-$4)/($7-$3+1e-9), ($9-$5)/1e7}'
grep -E "spec32  |acc64  |cpu ms" $OUT.log | tail -2
