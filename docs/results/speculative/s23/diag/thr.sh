#!/bin/bash
# One point; per-thread-name CPU of every specd between t=6 and t=16 s (schedstat, ns).
BIN=${BIN:-/work/bin-s23/farside-bc98b06}
OUT=${1:-thr}; shift
$BIN lab speculative --out $OUT "$@" --duration-s 20 --repeat 1 > $OUT.log 2>&1 &
LP=$!
for i in $(seq 1 300); do n=$(pgrep -f "farside.* specd" | wc -l); [ "$n" -ge 2 ] && break; sleep 0.2; done
sleep 8
snap() { for p in $(pgrep -f "farside.* specd"); do ns=$(ip netns identify $p); for t in /proc/$p/task/*; do echo "$ns:$(basename $t) $(cat $t/comm) $(awk '{print $1}' $t/schedstat)"; done; done; }
snap > $OUT-t1.txt; sleep 10; snap > $OUT-t2.txt
wait $LP
python3 - $OUT <<'PY'
import sys,collections
o=sys.argv[1]
def rd(f):
  d={}
  for l in open(f):
    k,c,ns=l.split(); d[k]=(c,int(ns))
  return d
a,b=rd(o+'-t1.txt'),rd(o+'-t2.txt')
agg=collections.defaultdict(lambda:[0,0])
for k,(c,ns) in b.items():
  node=k.split(':')[0].rsplit('-',1)[-1]
  prev=a.get(k,(c,0))[1]
  agg[(node,c)][0]+=(ns-prev)/1e7; agg[(node,c)][1]+=1
for k in sorted(agg): print(k[0], f"{k[1]:16}", f"{agg[k][0]:6.2f} ms/s", agg[k][1], "threads")
PY
grep -E "spec32  |cpu ms" $OUT.log | tail -2
