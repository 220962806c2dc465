#!/bin/sh
# Stop 23: the single server on the final binary (b69d88c), 4 rounds, as a check that the
# front-end fix leaves a one-back-end front-end unchanged. Usage: single.sh BINARY OUT_DIR
BIN=$1; OUT=$2
for seed in 1 11 21 31; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single \
    --accept-queues 64 --rates 91.1,93.6,96.0,98.5,101.0 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-single.log 2>&1
  echo "$(date +%T) single seed $seed done"
done
