#!/usr/bin/env python3
"""Paired differences (same seed and rate) between two variants: paired.py OUT A B [STEAL_MAX]."""
import json, sys, glob, statistics as st
out, a, b = sys.argv[1:4]
smax = float(sys.argv[4]) if len(sys.argv) > 4 else 1e9
def load(name):
    d = {}
    for f in glob.glob(f"{out}/{name}-seed*/points.jsonl"):
        seed = f.split('-seed')[-1].split('/')[0]
        for l in open(f):
            r = json.loads(l); p = r['point']
            stl = max((r.get('steal') or {}).get('per_cpu_ms') or [0])
            d[(seed, p['rate'], r['run'])] = (p['conn_per_s'], stl)
    return d
A, B = load(a), load(b)
by = {}
for k in sorted(set(A) & set(B)):
    if max(A[k][1], B[k][1]) > smax: continue
    by.setdefault(k[1], []).append(B[k][0] - A[k][0])
for rate, d in sorted(by.items()):
    se = st.stdev(d) / len(d) ** .5 if len(d) > 1 else 0
    print(f"{b}-{a} at {rate}: n={len(d)} mean {st.mean(d):+.1f} ± {se:.1f}  {['%+.1f' % x for x in d]}")
