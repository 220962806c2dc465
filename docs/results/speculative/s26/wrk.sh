#!/bin/bash
# Stop 26: cross-check of the closed loop with a real client. A lab point of one user holds the
# virtual data-center up for --duration-s; wrk (closed loop, Connection: close, so each request
# on a new connection; its kernel retransmits dropped SYNs) runs in the client namespace on the
# client's CPU for 25 s in the middle of it.
# Usage: wrk.sh BINARY OUT_DIR CONNS "single-acc64 split-acc64 split-spec32 ..."
BIN=$1; OUT=$2; CONNS=$3; LINES=$4
mkdir -p $OUT
for line in $LINES; do
  exp=${line%%-*}; sys=${line#*-}
  d=$OUT/$line-c$CONNS
  if [ $exp = single ]; then extra="--accept-queues ${sys#acc}"; else extra="--splits 75/25 --systems $sys"; fi
  flock /tmp/farside-root.lock $BIN lab speculative --out $d --experiment $exp --load closed $extra \
    --clients 1 --duration-s 40 --warmup-s 1 > $d.lab.log 2>&1 &
  lab=$!
  # The point's front-end log appears once its nodes are up.
  for i in $(seq 1 600); do ls $d/logs/*-c1-frontend.log >/dev/null 2>&1 && break; kill -0 $lab || break; sleep 0.1; done
  ns=$(ip netns list | awk '{print $1}' | grep 'client$' | head -1)
  sleep 5
  echo "$(date +%T) $line ns=$ns" > $d.wrk.log
  taskset -c 0 ip netns exec $ns wrk -t1 -c$CONNS -d25s --timeout 20s -H 'Connection: close' \
    http://10.77.1.100/index.html >> $d.wrk.log 2>&1
  wait $lab
  echo "$(date +%T) $line: $(grep -E 'Requests/sec|Non-2xx|Socket errors' $d.wrk.log | tr '\n' ' ')"
done
