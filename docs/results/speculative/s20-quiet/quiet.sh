#!/bin/sh
# Stop 20 quiet rerun around both knees (nothing else running): the same relative grid as
# final.sh, trimmed to the points near each peak.
set -e
B=$1; OUT=$2
flock /tmp/farside-root.lock $B lab speculative --out $OUT/single --experiment single --accept-queues 64 \
  --rates 91.1,93.6,96.0,98.5,101.0 --duration-s 20 --repeat 2
flock /tmp/farside-root.lock $B lab speculative --out $OUT/split --experiment split --splits 75/25 \
  --systems spec32 --rates 167.5,172.4,177.3,182.2 --duration-s 20 --repeat 2
