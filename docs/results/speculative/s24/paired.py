#!/usr/bin/env python3
"""paired.py OUT A B: per rate, mean conn/s of A and B, and the paired difference B-A per seed."""
import json, glob, statistics, sys, re
out, a, b = sys.argv[1:4]
def load(name):
    d = {}
    for f in glob.glob(f"{out}/{name}-seed*/points.jsonl"):
        seed = re.search(r"seed(\d+)", f).group(1)
        for l in open(f):
            p = json.loads(l)['point']
            nodes = {n['node']: n for n in p.get('nodes', [])}
            d[(p['rate'], seed)] = (p['conn_per_s'], sum(n.get('specd_ms_per_s', 0) for n in nodes.values()) / max(len(nodes), 1),
                                    p.get('migrations', 0), p.get('refusals', 0), p.get('connect_timeouts', 0))
    return d
A, B = load(a), load(b)
for rate in sorted({r for r, _ in A}):
    for name, D in ((a, A), (b, B)):
        v = [x for (r, s), x in D.items() if r == rate]
        if not v: continue
        c = [x[0] for x in v]
        se = statistics.stdev(c) / len(c) ** .5 if len(c) > 1 else 0
        print(f"{name:8} {rate:6} n={len(c)} conn/s {statistics.mean(c):6.1f} ± {se:.1f}  specd/node {statistics.mean(x[1] for x in v):5.1f}  migr {statistics.mean(x[2] for x in v):5.0f}  refusals {statistics.mean(x[3] for x in v):4.0f}  ct {statistics.mean(x[4] for x in v):4.0f}")
    diffs = [B[k][0] - A[k][0] for k in A if k[0] == rate and k in B]
    if diffs:
        se = statistics.stdev(diffs) / len(diffs) ** .5 if len(diffs) > 1 else 0
        print(f"  {b}-{a} at {rate}: n={len(diffs)} {statistics.mean(diffs):+.1f} ± {se:.1f}  {[f'{d:+.1f}' for d in diffs]}")
