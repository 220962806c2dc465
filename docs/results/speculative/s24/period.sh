#!/bin/sh
# Diagnostic: the lab's node quota at a 5 ms CFS period (1 ms quota, the kernel's minimum at 20 %) against the default
# 10 ms (2 ms), interleaved per seed, pair and single. A watcher rewrites the node cgroups (v1 cpu) as the lab creates them.
# Usage: period.sh BINARY OUT "SEEDS"
BIN=$1; OUT=$2; SEEDS=$3
mkdir -p $OUT
watch5() {
  while [ -e $OUT/.watch ]; do
    for d in /sys/fs/cgroup/cpu/farside/*/b*/; do
      [ -f $d/cpu.cfs_period_us ] || continue
      if [ "$(cat $d/cpu.cfs_period_us)" = 10000 ]; then echo 1000 > $d/cpu.cfs_quota_us; echo 5000 > $d/cpu.cfs_period_us; fi
    done
    sleep 0.02
  done
}
run() { # name seed
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/$1-seed$2-split --experiment split --splits 75/25 --systems spec32 \
    --rates 182.2,187.1 --duration-s 20 --repeat 1 --seed $2 > $OUT/$1-seed$2-split.log 2>&1
  flock /tmp/farside-root.lock $BIN lab speculative --out $OUT/$1-seed$2-single --experiment single --accept-queues 64 \
    --rates 96.0,101.0 --duration-s 20 --repeat 1 --seed $2 > $OUT/$1-seed$2-single.log 2>&1
}
for seed in $SEEDS; do
  run P10 $seed
  touch $OUT/.watch; watch5 & W=$!
  run P5 $seed
  rm -f $OUT/.watch; wait $W
  echo "$(date +%T) seed $seed done"
done
