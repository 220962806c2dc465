#!/bin/bash
E=/root/.cache/ft-sampler/debug/examples/kprof
echo "# $(date -u +%FT%TZ) loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for r in 1 2; do
for v in kp_full kp_notouch ksamp_tick; do
  echo -n "noport "; KSAMP_TICK=$v $E 6 2>&1 | tail -1
  echo -n "port   "; KSAMP_TICK=$v $E 6 39471 2>&1 | tail -1
done
done
echo "# end loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
