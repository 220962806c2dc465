#!/bin/bash
# Dashboard CPU cost: proxy CPU over 30 s without and with one /events stream (10/s).
set -e
B=${B:-farside}
D=$(mktemp -d)
$B backend --listen 127.0.0.1:39101 --workers 4 >$D/be0.log 2>&1 & P1=$!
$B backend --listen 127.0.0.1:39102 --workers 4 >$D/be1.log 2>&1 & P2=$!
$B gatherd --watch-port 39101 --shm $D/r0 >$D/g0.log 2>&1 & P3=$!
$B gatherd --watch-port 39102 --shm $D/r1 >$D/g1.log 2>&1 & P4=$!
sleep 1
$B proxy --listen 127.0.0.1:39100 --admin-listen 127.0.0.1:39109 --admission \
  --backend 127.0.0.1:39101,region=shm:$D/r0 --backend 127.0.0.1:39102,region=shm:$D/r1 >$D/px.log 2>&1 & PX=$!
sleep 1
cpu() { awk '{print $14+$15}' /proc/$PX/stat; }
T=${T:-30}
a=$(cpu); sleep $T; b=$(cpu); echo "no page: $((b-a)) ticks in ${T}s ($(echo "scale=2; ($b-$a)/$T" | bc)% of a core)"
curl -sN http://127.0.0.1:39109/events > $D/events.txt & C=$!
sleep 1
a=$(cpu); sleep $T; b=$(cpu); echo "one page (10/s): $((b-a)) ticks in ${T}s ($(echo "scale=2; ($b-$a)/$T" | bc)% of a core)"
kill $C; echo "events received: $(grep -c '^data:' $D/events.txt), bytes $(wc -c < $D/events.txt)"
kill $PX $P1 $P2 $P3 $P4; wait 2>/dev/null; rm -rf $D
