#!/bin/sh
# perf profile of a pair point and a single point, 10 s inside the measured window. Usage: prof.sh BIN OUT
BIN=$1; OUT=$2; mkdir -p $OUT
for what in split single; do
  if [ $what = split ]; then ARGS="--experiment split --splits 75/25 --systems spec32 --rates 182.2"; else ARGS="--experiment single --accept-queues 64 --rates 96.0"; fi
  flock /tmp/farside-root.lock sh -c "$BIN lab speculative --out $OUT/$what $ARGS --duration-s 20 --repeat 1 --seed 1 > $OUT/$what.log 2>&1 & P=\$!; sleep 12; perf record -F 1999 -a -g -o $OUT/$what.data -- sleep 10 > $OUT/$what.perf.log 2>&1; wait \$P"
done
