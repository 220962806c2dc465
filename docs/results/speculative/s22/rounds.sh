#!/bin/sh
# Stop 22: this stop's binary on stop 21's quiet knee grid, the same four rounds of
# arrivals as stop 21's B (--seed 1, 11, 21, 31), 2 runs per point each; the single
# server again for seeds 1 and 11 (drift check against stop 21's runs with the same
# arrivals). Usage: rounds.sh BINARY OUT_DIR
set -e
BIN=$1; OUT=$2
for seed in 1 11 21 31; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split \
    --splits 75/25 --systems spec32 --rates 167.5,172.4,177.3,182.2 --duration-s 20 --repeat 2 --seed $seed
done
for seed in 1 11; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single \
    --accept-queues 64 --rates 91.1,93.6,96.0,98.5,101.0 --duration-s 20 --repeat 2 --seed $seed
done
