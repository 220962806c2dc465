#!/bin/sh
# Stop 25, round P: as rounds.sh (open loop, pair spec32 / spec32g and single acc64 interleaved per seed) with the binary's
# default tier pinning, then the closed loop for CLOSED_SEEDS. Usage: roundp.sh BINARY OUT_DIR "SEEDS" "CLOSED_SEEDS"
BIN=$1; OUT=$2; SEEDS=$3; CSEEDS=$4
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
for seed in $CSEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/closed$seed-single --experiment single --load closed \
    --accept-queues 64 --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed > $OUT/closed$seed-single.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/closed$seed-split --experiment split --load closed \
    --splits 75/25 --systems acc64,spec32,spec32g --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed > $OUT/closed$seed-split.log 2>&1
  echo "$(date +%T) closed seed $seed done"
done
