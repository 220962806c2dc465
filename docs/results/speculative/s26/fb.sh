#!/bin/sh
# Stop 26: spec32 with fall-backs holding their window place (binary of the fall-back commit), open loop 75/25 at the
# knee and at 3x and 4x one node's capacity, per seed. Usage: fb.sh BINARY OUT_DIR "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-spec --experiment split --load open \
    --splits 75/25 --systems spec32 --rates 182.2,187.1,295.6,369.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-spec.log 2>&1
  echo "$(date +%T) seed $seed done"
done
