#!/bin/sh
# Stop 25, round A: pair (75/25 spec32 near its knee, spec32g at 2.1-2.5x) and single (acc64) interleaved per seed, open loop.
# Usage: rounds.sh BINARY OUT_DIR "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split --load open \
    --splits 75/25 --systems spec32 --rates 182.2,187.1 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-split.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-gated --experiment split --load open \
    --splits 75/25 --systems spec32g --rates 209.4,246.3 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-gated.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single --load open \
    --accept-queues 64 --rates 93.6,96.0,98.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-single.log 2>&1
  echo "$(date +%T) seed $seed done"
done
