#!/bin/sh
# ab.sh OUT "RATES" "SEEDS" NAME=BIN ...  : the pair (75/25 spec32) per seed, binaries interleaved
OUT=$1; RATES=$2; SEEDS=$3; shift 3
mkdir -p $OUT
for seed in $SEEDS; do
  for nb in "$@"; do
    name=${nb%%=*}; bin=${nb#*=}
    flock /tmp/farside-root.lock $bin lab speculative --out $OUT/$name-seed$seed --experiment split \
      --splits 75/25 --systems spec32 --rates $RATES --duration-s 20 --repeat 1 --seed $seed > $OUT/$name-seed$seed.log 2>&1
    echo "$(date +%T) $name seed $seed done"
  done
done
