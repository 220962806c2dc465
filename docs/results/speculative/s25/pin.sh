#!/bin/sh
# Diagnostic: one pair point (75/25 spec32 at 182.2, open loop) with both back-end nodes' cpusets set to CPU 1 (pin) or left at 0-1 (free).
# Usage: pin.sh BIN OUT SEED pin|free
BIN=$1; OUT=$2; SEED=$3; MODE=$4; mkdir -p $OUT
flock /tmp/farside-root.lock sh -c "
$BIN lab speculative --out $OUT/seed$SEED-$MODE --experiment split --splits 75/25 --systems spec32 --rates 182.2 --load open --duration-s 20 --repeat 1 --seed $SEED > $OUT/seed$SEED-$MODE.log 2>&1 & P=\$!
if [ $MODE = pin ]; then
  i=0; while [ \$i -lt 200 ]; do d=\$(ls -d /sys/fs/cgroup/cpuset/farside/s*/b1 2>/dev/null | head -1); [ -n \"\$d\" ] && break; sleep 0.05; i=\$((i+1)); done
  for n in b0 b1; do echo 1 > \$(dirname \$d)/\$n/cpuset.cpus; done; cat \$(dirname \$d)/b0/cpuset.cpus > $OUT/seed$SEED-$MODE.cpuset
fi
wait \$P"
