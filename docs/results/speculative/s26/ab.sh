#!/bin/sh
# Stop 26: A/B at the knee, spec32 75/25 open loop, binary A (before the fall-back change) and B (after), interleaved
# per seed. Usage: ab.sh BIN_A BIN_B OUT_DIR "SEEDS"
A=$1; B=$2; OUT=$3; SEEDS=$4
mkdir -p $OUT
for seed in $SEEDS; do
  for v in a b; do
    if [ $v = a ]; then BIN=$A; else BIN=$B; fi
    flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-$v --experiment split --load open \
      --splits 75/25 --systems spec32 --rates 182.2,187.1 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-$v.log 2>&1
  done
  echo "$(date +%T) seed $seed done"
done
