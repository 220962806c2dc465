#!/bin/sh
# perf record of the two specds only, 10 s in a pair point's window, 20 kHz. Usage: prof2.sh BIN OUT
BIN=$1; OUT=$2; shift 2; mkdir -p $OUT
flock /tmp/farside-root.lock sh -c "$BIN lab speculative --out $OUT/split --experiment split --splits 75/25 --systems spec32 --rates 182.2 --duration-s 20 --repeat 1 --seed 1 $* > $OUT/split.log 2>&1 & P=\$!; sleep 12; perf record -F 20000 -g -p \$(ps -eo pid,args | grep '[s]pecd --listen' | awk '{print \$1}' | paste -sd,) -o $OUT/specd.data -- sleep 10 > $OUT/perf.log 2>&1; wait \$P"
