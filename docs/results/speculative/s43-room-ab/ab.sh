#!/bin/sh
# A/B of the target's room check on seed 002's closed-loop split (spec32 at 75/25),
# before (no room check) and after, alternating; 2 seeds each.
OUT=/work/wt/ab-spec; mkdir -p $OUT
for seed in 1 2; do
  for v in before after; do
    flock /tmp/farside-root.lock /root/farside-$v lab speculative --out $OUT/$v-seed$seed --experiment split --load closed \
      --splits 75/25 --systems spec32 --clients 128,256 --duration-s 20 --repeat 1 --seed $seed \
      --connect-timeout-ms 0 --timeout-ms 20000 --warmup-s 10 > $OUT/$v-seed$seed.log 2>&1
    echo "$(date +%T) $v seed $seed: $(grep -h 'spec32' $OUT/$v-seed$seed.log | grep -o 'c[0-9]*.*' | tail -2 | cut -c1-200 | tr '\n' '|')"
  done
done
