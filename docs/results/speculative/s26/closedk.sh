#!/bin/sh
# Stop 26: closed loop of users whose kernels retransmit a dropped SYN (no S-Clients abandon:
# --connect-timeout-ms 0), single acc64 and 75/25 acc64 / spec32 / spec32g at 64, 128, 256 users.
# Usage: closedk.sh BINARY OUT_DIR "SEEDS" [TIMEOUT_MS] [WARMUP_S]
BIN=$1; OUT=$2; SEEDS=$3; TMO=${4:-20000}; WU=${5:-10}
mkdir -p $OUT
for seed in $SEEDS; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-single --experiment single --load closed \
    --accept-queues 64 --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed \
    --connect-timeout-ms 0 --timeout-ms $TMO --warmup-s $WU > $OUT/seed$seed-single.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-split --experiment split --load closed \
    --splits 75/25 --systems acc64,spec32,spec32g --clients 64,128,256 --duration-s 20 --repeat 1 --seed $seed \
    --connect-timeout-ms 0 --timeout-ms $TMO --warmup-s $WU > $OUT/seed$seed-split.log 2>&1
  echo "$(date +%T) seed $seed done"
done
