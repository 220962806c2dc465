#!/bin/bash
# The kernel's NET_RX softirq time beside the monitor's poller, exactly (tracepoints, not
# ticks): bench_monitor with --pin (pollers on CPU 0, responders on CPU 1) runs one row
# while `perf record -a` takes every irq:softirq_entry/exit of NET_RX (vec 3) for WINDOW
# seconds in its steady part; netrx.py sums each CPU's time in NET_RX. On loopback a
# datagram's receive runs on the CPU that sent it: CPU 1's NET_RX is the replies'
# receive (the monitor host's cost behind a NIC), CPU 0's the READs' (the back-ends').
# Run under /work/wt/measure. Usage: netrx.sh OUT BIN_DIR BACKENDS MODE [WINDOW]
#   MODE: unicast or group.
set -u
out=$1 bin=$2 n=$3 mode=$4 window=${5:-4}
mkdir -p "$(dirname "$out")"
flags=(--backends "$n" --seconds $((window + 4)) --pin --only "$mode:udp")
[ "$mode" = group ] && flags+=(--group)
"$bin/bench_monitor" "${flags[@]}" > "$out.bench.txt" 2>&1 &
pid=$!
sleep 2.5
perf record -q -a -o "$out.perf.data" -e irq:softirq_entry --filter 'vec == 3' \
	-e irq:softirq_exit --filter 'vec == 3' -- sleep "$window" 2>> "$out.bench.txt"
wait $pid
perf script -i "$out.perf.data" -F cpu,time,event > "$out.script.txt" 2>/dev/null
rm -f "$out.perf.data"
python3 "$(dirname "$0")/netrx.py" "$out.script.txt" "$out.bench.txt" "$window" > "$out.txt"
rm -f "$out.script.txt"
cat "$out.txt"
