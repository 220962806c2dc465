#!/bin/sh
# Stop 21: more rounds of this stop's binary alone on the same knee grid as abab.sh, with
# other seeds (other Poisson arrivals). Usage: more.sh BINARY OUT_DIR SEED...
set -e
B=$1; OUT=$2; shift 2
for seed in "$@"; do
  flock /tmp/farside-root.lock $B lab speculative --out $OUT/seed$seed-single --experiment single --accept-queues 64 \
    --rates 91.1,93.6,96.0,98.5,101.0 --duration-s 20 --repeat 2 --seed $seed
  flock /tmp/farside-root.lock $B lab speculative --out $OUT/seed$seed-split --experiment split --splits 75/25 \
    --systems spec32 --rates 167.5,172.4,177.3,182.2 --duration-s 20 --repeat 2 --seed $seed
done
