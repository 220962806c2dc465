#!/bin/sh
# Stop 23: normal processing (acc64) against spec32 at 75/25 on S-Clients-like load, at the
# knee and at 2.5x / 3x one node's capacity (the lab's default grid), seeds 1 and 11; then
# the target's CPU per migration with the connect timeout off and on (same binary).
BIN=$1; OUT=$2
for seed in 1 11; do
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-acc --experiment split \
    --splits 75/25 --systems acc64,spec32 --rates 172.4,246.3,295.6 --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-acc.log 2>&1
  echo "$(date +%T) acc seed $seed done"
done
for seed in 1 11; do
  for ct in 0 500; do
    flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/seed$seed-ct$ct --experiment split \
      --splits 75/25 --systems spec32 --rates 172.4 --connect-timeout-ms $ct --duration-s 20 --repeat 1 --seed $seed > $OUT/seed$seed-ct$ct.log 2>&1
    echo "$(date +%T) ct $ct seed $seed done"
  done
done
