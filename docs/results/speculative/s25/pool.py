#!/usr/bin/env python3
"""(stop 25: closed-loop points keyed by their users, compared with the closed-loop single server; per-migration CPU)
Pools `lab speculative` runs per (system, rate) and compares the pair's peak with the
single server's. Usage: pool.py [--steal-max MS] DIR...  (each DIR holds points.jsonl;
a run whose hypervisor steal on either CPU exceeded MS during its point is left out and
listed). Prints, per point: runs, mean conn/s, standard error, connect timeouts and
client timeouts per run, refusals and window closures per run, the nodes' CPU (ms/s)
and the worst steal; then each system's peak of means and the pair / single ratio."""
import json, math, statistics, sys

args = sys.argv[1:]
steal_max = math.inf
if args[:1] == ['--steal-max']:
    steal_max = float(args[1]); args = args[2:]
pts, skipped = {}, []
for d in args:
    for line in open(d + '/points.jsonl'):
        r = json.loads(line); p = r['point']
        steal = max((r.get('steal') or {}).get('per_cpu_ms') or [0])
        x = f"c{p['clients']}" if p.get('clients') else p['rate']
        key = (p['system'] + (' closed' if p.get('clients') else ''), p['split'], x)
        if steal > steal_max:
            skipped.append((d, key, steal)); continue
        pts.setdefault(key, []).append((p, steal))

def mean(xs): return sum(xs) / len(xs)
peaks = {}
for key in sorted(pts, key=lambda k: (k[0], k[1], str(k[2]))):
    runs = pts[key]; c = [p['conn_per_s'] for p, _ in runs]
    m = mean(c); se = statistics.stdev(c) / len(c) ** 0.5 if len(c) > 1 else 0.0
    per = lambda f: mean([p.get(f, 0) for p, _ in runs])
    nodes = {}
    for p, _ in runs:
        for n in p.get('nodes', []):
            nodes.setdefault(n['node'], []).append(n['cpu_ms_per_s'])
    cpu = ' '.join(f"{k} {mean(v):.0f}" for k, v in sorted(nodes.items()))
    print(f"{key[0]:7} {key[1]:6} {key[2]:6}  n={len(c)}  conn/s {m:6.1f} ± {se:3.1f}  "
          f"(min {min(c):6.1f} max {max(c):6.1f})  connect_timeouts {per('connect_timeouts'):5.0f}  "
          f"timeouts {per('timeouts'):4.0f}  refusals {per('refusals'):4.0f}  closures {per('window_closures'):3.0f}  "
          f"cpu {cpu}  mig/run {per('migrations'):5.0f}  cpu/mig src {per('migration_cpu_source_us') if runs[0][0].get('migration_cpu_source_us') else 0:4.0f} "
          f"tgt {per('migration_cpu_target_us') if runs[0][0].get('migration_cpu_target_us') else 0:4.0f}  steal<= {max(s for _, s in runs):.0f}")
    label = (key[0], key[1])
    if label not in peaks or m > peaks[label][0]:
        peaks[label] = (m, se, key[2])
print()
for (system, split), (m, se, rate) in sorted(peaks.items()):
    print(f"peak of means {system} {split}: {m:.1f} ± {se:.1f} at {rate}")
for (system, split), (m, se, rate) in sorted(peaks.items()):
    single = [v for (s, sp), v in peaks.items() if sp == '100' and s.endswith(' closed') == system.endswith(' closed')]
    if split != '100' and single:
        s_m, s_se, _ = max(single)
        r = m / s_m
        r_se = r * math.hypot(se / m, s_se / s_m)
        print(f"{system} {split} / single: {r:.3f} ± {r_se:.3f}")
if skipped:
    print(f"left out (steal > {steal_max} ms on a CPU): {skipped}")
