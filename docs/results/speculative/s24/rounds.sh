#!/bin/sh
# Stop 24: pair (75/25 spec32) and single (acc64) interleaved per seed, the binary's defaults. Usage: rounds.sh BINARY OUT_DIR "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split \
    --splits 75/25 --systems spec32 --rates 172.4,177.3,182.2,187.1 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-split.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single \
    --accept-queues 64 --rates 91.1,93.6,96.0,98.5,101.0,103.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-single.log 2>&1
  echo "$(date +%T) seed $seed done"
done
