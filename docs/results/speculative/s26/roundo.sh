#!/bin/sh
# Stop 26, round O: open loop at the defaults (pinned), pair spec32 at the knee and single acc64 interleaved per seed,
# and normal processing (acc64 75/25) at 3x and 4x one node's capacity for ACC_SEEDS.
# Usage: roundo.sh BINARY OUT_DIR "SEEDS" "ACC_SEEDS"
BIN=$1; OUT=$2; SEEDS=$3; ASEEDS=$4
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split --load open \
    --splits 75/25 --systems spec32 --rates 182.2,187.1 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-split.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single --load open \
    --accept-queues 64 --rates 93.6,96.0,98.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-single.log 2>&1
  case " $ASEEDS " in *" $seed "*)
    flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-acc --experiment split --load open \
      --splits 75/25 --systems acc64 --rates 295.6,369.5 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-acc.log 2>&1 ;;
  esac
  echo "$(date +%T) seed $seed done"
done
