#!/bin/bash
E=/root/.cache/ft-sampler/debug/examples/kprof
echo "# $(date -u +%FT%TZ) loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
for v in kp_noop kp_ktime kp_ema kp_min kp_nozero kp_nolisten kp_full ksamp_tick; do
  echo -n "noport "; KSAMP_TICK=$v $E 6 2>&1 | tail -1
done
for v in kp_nolisten kp_full ksamp_tick; do
  echo -n "port   "; KSAMP_TICK=$v $E 6 39471 2>&1 | tail -1
done
echo "# end loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
