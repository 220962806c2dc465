#!/bin/sh
# Stop 23, after the front-end's SYN fix (b69d88c): the pair on the knee grid, 8 rounds of
# arrivals, then normal processing against spec32 at 75/25 up to 3x one node's capacity.
# The single server (one back-end: the fix cannot change where its SYNs go) is not re-run.
# Usage: rounds.sh BINARY OUT_DIR
BIN=$1; OUT=$2
for seed in 1 11 21 31 41 51 61 71; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split \
    --splits 75/25 --systems spec32 --rates 167.5,172.4,177.3,182.2 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-split.log 2>&1
  echo "$(date +%T) split seed $seed done"
done
for seed in 1 11; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-acc --experiment split \
    --splits 75/25 --systems acc64,spec32 --rates 172.4,246.3,295.6 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-acc.log 2>&1
  echo "$(date +%T) acc seed $seed done"
done
