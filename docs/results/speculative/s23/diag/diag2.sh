#!/bin/bash
# One point; samples every 50 ms the CLOSE_WAIT sockets in b0 and b1 (client gone before
# the server finished), and nstat at the end.
BIN=/work/bin-s23/farside-bc98b06
RATE=${1:-177.3}; SEED=${2:-11}; OUT=${3:-out}
$BIN lab speculative --out $OUT ${ARGS:---experiment split --splits 75/25 --systems spec32} --rates $RATE --duration-s 20 --repeat 1 --seed $SEED > $OUT.log 2>&1 &
LP=$!
for i in $(seq 1 300); do n=$(ip netns list | grep -c '^fs-.*-b0'); [ "$n" -ge 1 ] && break; sleep 0.2; done
sleep 1
B0=$(ip netns list | awk '/^fs-.*-b0/{print $1}'); B1=$(ip netns list | awk '/^fs-.*-b1/{print $1}')
: > $OUT-cw-b0.txt; : > $OUT-cw-b1.txt
while kill -0 $LP 2>/dev/null; do
  ip netns exec $B0 ss -Htn state close-wait 2>/dev/null | awk '{print $3, $4}' >> $OUT-cw-b0.txt
  [ -n "$B1" ] && ip netns exec $B1 ss -Htn state close-wait 2>/dev/null | awk '{print $3, $4}' >> $OUT-cw-b1.txt
  ip netns exec $B0 true 2>/dev/null || break
  sleep 0.05
done
wait $LP
echo "b0 close-wait distinct: $(sort -u $OUT-cw-b0.txt | wc -l)  b1: $(sort -u $OUT-cw-b1.txt | wc -l)"
grep -E 'split 75|acc64 +[0-9]|cpu ms' $OUT.log | tail -3
grep -E '"timeouts"|"served"|offered_per' $OUT/summary.json
