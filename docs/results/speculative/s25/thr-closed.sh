#!/bin/sh
# per-thread CPU of the specds, 10 s in a pair point's window. Usage: thr.sh BIN OUT [extra lab args]
BIN=$1; OUT=$2; shift 2; mkdir -p $OUT
flock /tmp/farside-root.lock sh -c "$BIN lab speculative --out $OUT/split --experiment split --splits 75/25 --systems spec32 --rates 182.2 --load closed --clients 128 --duration-s 20 --repeat 1 --seed 1 $* > $OUT/split.log 2>&1 & P=\$!; sleep 12; /work/runs/s25/threads.py 10 \$(ps -eo pid,args | grep '[s]pecd --listen' | awk '{print \$1}') > $OUT/threads.txt; wait \$P"
