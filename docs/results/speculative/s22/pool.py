#!/usr/bin/env python3
"""Pools the runs of several `lab speculative` output dirs per (system, rate): the mean
conn/s over every run of a point, its spread, and the peak of the means.
Usage: pool.py LABEL:DIR[,DIR...] ...   (each DIR holds points.jsonl)"""
import json, statistics, sys
for arg in sys.argv[1:]:
    label, dirs = arg.split(':', 1)
    pts = {}
    extra = {'src': [], 'tgt': [], 'p50': [], 'p99': [], 'mig': 0, 'lost': 0, 'refus': 0, 'clos': 0}
    for d in dirs.split(','):
        for line in open(d + '/points.jsonl'):
            r = json.loads(line); p = r['point']
            pts.setdefault((p['system'], p['rate']), []).append(p['conn_per_s'])
            if p.get('migrations'):
                extra['src'].append(p['migration_cpu_source_us']); extra['tgt'].append(p['migration_cpu_target_us'])
                extra['p50'].append(p['migration_p50_us']); extra['p99'].append(p['migration_p99_us'])
                extra['mig'] += p['migrations']; extra['lost'] += p.get('migration_lost', 0)
                extra['refus'] += p.get('refusals', 0); extra['clos'] += p.get('window_closures', 0)
    print(f'== {label}')
    best = None
    for (sysname, rate), v in sorted(pts.items()):
        m = statistics.mean(v); sd = statistics.stdev(v) if len(v) > 1 else 0
        print(f'  {sysname:7} {rate:6}  n={len(v)}  mean {m:6.1f}  sd {sd:4.1f}  min {min(v):6.1f}  max {max(v):6.1f}')
        if best is None or m > best[0]:
            best = (m, rate, sd / len(v) ** 0.5)
    print(f'  peak of means {best[0]:.1f} at {best[1]} (standard error {best[2]:.1f})')
    if extra['src']:
        print(f"  migrations {extra['mig']}, lost {extra['lost']}, refusals {extra['refus']}, closures {extra['clos']}; "
              f"per point: source CPU {min(extra['src']):.0f}-{max(extra['src']):.0f} us (median {statistics.median(extra['src']):.0f}), "
              f"target {min(extra['tgt']):.0f}-{max(extra['tgt']):.0f} us (median {statistics.median(extra['tgt']):.0f}), "
              f"latency p50 {min(extra['p50'])/1000:.0f}-{max(extra['p50'])/1000:.0f} ms, p99 {min(extra['p99'])/1000:.0f}-{max(extra['p99'])/1000:.0f} ms")
