#!/bin/sh
# Stop 26: speculative admission at 3x and 4x one node's capacity (open loop, 75/25), spec32 and spec32g, to set
# beside roundo.sh's normal processing there. Usage: over.sh BINARY OUT_DIR "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-spec --experiment split --load open \
    --splits 75/25 --systems spec32,spec32g --rates 295.6,369.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-spec.log 2>&1
  echo "$(date +%T) seed $seed done"
done
