#!/usr/bin/env python3
"""Pools points.jsonl of OUT/NAME-seed*/ per variant and rate."""
import json, sys, glob, collections, statistics as st
out = sys.argv[1]
rows = collections.defaultdict(list)
STEAL_MAX = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
skipped = []
for f in glob.glob(f"{out}/*-seed*/points.jsonl"):
    name = f.split('/')[-2].rsplit('-seed', 1)[0]
    for l in open(f):
        r = json.loads(l); p = r['point']
        st_ = max((r.get('steal') or {}).get('per_cpu_ms') or [0])
        if st_ > STEAL_MAX:
            skipped.append((name, p['rate'], st_)); continue
        n = {x['node']: x for x in p.get('nodes', [])}
        rows[(name, p['rate'])].append((p['conn_per_s'], p['offered_per_s'], p['timeouts'], p['refusals'], p['window_closures'], p['migrations'],
            n.get('b0', {}).get('cpu_ms_per_s', 0), n.get('b1', {}).get('cpu_ms_per_s', 0), p['specd_cpu_ms_per_s'], p['migration_p50_us'] / 1000))
for k in sorted(rows):
    v = rows[k]; c = [x[0] for x in v]
    m = lambda i: sum(x[i] for x in v) / len(v)
    se = st.stdev(c) / len(c) ** .5 if len(c) > 1 else 0
    print(f"{k[0]:6} {k[1]:6} n={len(v)} conn {m(0):6.1f}±{se:3.1f} offered {m(1):6.1f} to {m(2):5.0f} ref {m(3):4.0f} clo {m(4):3.0f} mig {m(5):4.0f} b0 {m(6):5.1f} b1 {m(7):5.1f} specd {m(8):4.1f} migp50 {m(9):5.1f}ms")
if skipped: print('skipped (steal ms per CPU >', STEAL_MAX, '):', skipped)
