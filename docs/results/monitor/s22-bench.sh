#!/bin/sh
# Stop 22: the monitor's poller at 1,024 back-ends with AF_XDP receive, batched and
# prefetched matching, the UMEM on huge pages, and a group responder of 2 threads.
# Usage (root): s22-bench.sh OLD_BENCH NEW_BENCH OUT_DIR
#   OLD_BENCH: bench_monitor built from 4660bbc (stop 21) with this stop's responder.rs
#   and bench_monitor.rs copied in (the same responder, the old poller);
#   NEW_BENCH: bench_monitor of this stop.
set -e
OLD=$1; NEW=$2; OUT=$3
mkdir -p $OUT
ip netns add xb 2>/dev/null || true
ip -n xb link set lo up
run() { ip netns exec xb "$@" 2>&1 | tail -1; }
H=$(ip netns exec xb $NEW --backends 16 --seconds 0.1 --only group:udp 2>&1 | grep '^backends')
# A/B: the old and new poller, interleaved, 6 runs each, 10 ms period (every read answered).
{ echo "# $(date -u +%FT%TZ) A/B 1024 group xsk, --period-us 10000 --responders 2, 8 s each"; echo "bin $H"
  for i in 1 2 3 4 5 6; do for v in OLD NEW; do eval B=\$$v
    echo "$v $(run $B --backends 1024 --seconds 8 --group --period-us 10000 --xsk lo --only group:xsk --responders 2)"
  done; done; } > $OUT/ab.txt
# The same for the UDP socket, new poller, 1 and 2 responder threads.
{ echo "# $(date -u +%FT%TZ) 1024 group, rx udp and xsk, 1 and 2 responder threads, new poller"; echo "resp $H"
  for i in 1 2 3; do for k in 1 2; do for m in group:udp group:xsk; do
    echo "$k $(run $NEW --backends 1024 --seconds 8 --group --period-us 10000 --xsk lo --only $m --responders $k)"
  done; done; done; } > $OUT/rx-responders.txt
# A real 1 ms period where 2 responder threads keep up (256 back-ends), and 512 (they do not).
{ echo "# $(date -u +%FT%TZ) --period-us 1000 --responders 2, new poller"; echo "$H"
  for i in 1 2 3; do for b in 256 512; do
    run $NEW --backends $b --seconds 8 --group --period-us 1000 --xsk lo --only group:xsk --responders 2
  done; done; } > $OUT/one-ms.txt
# The whole table (decision costs included), new poller.
{ echo "# $(date -u +%FT%TZ) full table, --period-us 10000 --responders 2"
  ip netns exec xb $NEW --backends 16,256,1024 --seconds 5 --group --period-us 10000 --xsk lo --responders 2 2>&1; } > $OUT/table.txt
