#!/bin/sh
# Stop 21: stop 20's binary (A) against this stop's (B), interleaved, on stop 20's quiet grid
# around both knees (the same relative grid as s20-busy/final.sh, trimmed to the points near
# each peak), 2 runs per point. Usage: abab.sh A_BINARY B_BINARY OUT_DIR [LAB ARGS...]
# (e.g. --seed 11 for a second round with other arrivals).
set -e
A=$1; B=$2; OUT=$3; shift 3
for sys in A B; do
  eval BIN=\$$sys
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/$sys-single --experiment single --accept-queues 64 \
    --rates 91.1,93.6,96.0,98.5,101.0 --duration-s 20 --repeat 2 "$@"
done
for sys in A B; do
  eval BIN=\$$sys
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/$sys-split --experiment split --splits 75/25 \
    --systems spec32 --rates 167.5,172.4,177.3,182.2 --duration-s 20 --repeat 2 "$@"
done
