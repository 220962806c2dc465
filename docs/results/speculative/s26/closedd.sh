#!/bin/sh
# Stop 26: closed loop at the product's defaults (users retransmit a dropped SYN, 20 s timeout,
# 3 s warm-up): single acc64 and 75/25 acc64 / spec32 / spec32g at 64, 128, 256 users, per seed.
# Usage: closedd.sh BINARY OUT_DIR "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single --load closed \
    --accept-queues 64 --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-single.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split --load closed \
    --splits 75/25 --systems acc64,spec32,spec32g --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-split.log 2>&1
  echo "$(date +%T) seed $seed done"
done
