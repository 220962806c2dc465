#!/bin/bash
# Watches my own r2 run: nginx error logs and socket summaries of its namespaces.
for i in $(seq 1 60); do
  if ! pgrep -f "out /tmp/nginxq/r2" >/dev/null; then echo "run ended"; break; fi
  date -u +%T
  tail -n 3 /tmp/nginxq/r2.err 2>/dev/null
  for f in /tmp/farside-nginx-*/error.log; do [ -f "$f" ] && { echo "== $f"; tail -n 3 "$f"; }; done
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^fs-a[0-9]+-(b0|proxy)$"); do
    echo "-- $ns: $(ip netns exec $ns ss -tn state established | wc -l) estab, $(ip netns exec $ns ss -tln | grep -E ':80 |:8080 ' | awk '{print $2"/"$3}' | tr '\n' ' ') recvq/backlog"
  done
  sleep 5
done
