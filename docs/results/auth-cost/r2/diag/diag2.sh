#!/bin/bash
# diag2.sh ROUNDS NAME=BIN...: per variant, bench_monitor under perf trace -s (syscalls per thread), interleaved
rounds=$1; shift
for r in $(seq 1 $rounds); do for v in "$@"; do name=${v%%=*} bin=${v#*=}
perf trace -s -o trace-$name-$r.txt -- $bin/bench_monitor --backends 64 --seconds 3 --only unicast:udp > bench-trace-$name-$r.txt 2>&1
perf record -q -o perf-$name-$r.data -- $bin/bench_monitor --backends 64 --seconds 3 --only unicast:udp > bench-perf-$name-$r.txt 2>&1
done; done
