#!/bin/sh
# spec32 against spec50 (the paper's two windows) at 75/25 around the knee, in one lab run per seed. Usage: win.sh BINARY OUT "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-win --experiment split \
    --splits 75/25 --systems spec32,spec50 --rates 177.3,182.2,187.1 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-win.log 2>&1
  echo "$(date +%T) seed $seed done"
done
