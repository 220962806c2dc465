#!/bin/sh
# Normal processing (acc64) against speculative (spec32, and spec32g: gated on the peer's load) at 75/25 on S-Clients-like load, at 1.75x, 2.5x, 3x one
# node's capacity; random source ports (the default) and, for acc64 at 3x, the kernel's ports. Usage: acc.sh BINARY OUT "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-acc --experiment split \
    --splits 75/25 --systems acc64,spec32,spec32g --rates 172.4,246.3,295.6 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-acc.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-kernelports --experiment split --source-ports kernel \
    --splits 75/25 --systems acc64 --rates 295.6 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-kernelports.log 2>&1
  echo "$(date +%T) seed $seed done"
done
