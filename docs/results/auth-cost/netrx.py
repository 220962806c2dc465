#!/usr/bin/env python3
"""Sum each CPU's NET_RX softirq time from `perf script -F cpu,time,event` lines of
irq:softirq_entry / irq:softirq_exit (vec 3), and divide by the reads the bench answered
in that window (its answered share of N reads per period). Usage: netrx.py SCRIPT BENCH WINDOW_S"""
import re, sys

script, bench, window = sys.argv[1], sys.argv[2], float(sys.argv[3])
open_at, total, runs, t0, t1 = {}, {}, {}, None, None
for line in open(script):
    m = re.match(r"\s*\[(\d+)\]\s+([\d.]+):\s+irq:softirq_(entry|exit)", line)
    if not m:
        continue
    cpu, t, ev = int(m.group(1)), float(m.group(2)), m.group(3)
    t0 = t if t0 is None else t0
    t1 = t
    if ev == "entry":
        open_at[cpu] = t
    elif cpu in open_at:
        total[cpu] = total.get(cpu, 0.0) + t - open_at.pop(cpu)
        runs[cpu] = runs.get(cpu, 0) + 1
lines = [l.split() for l in open(bench) if l.strip() and not l.startswith("#")]
head = next(l for l in lines if l[0] == "backends")
row = next(l for l in lines if l[0].isdigit())
n = int(row[0])
period_us = 1000.0
answered = float(row[head.index("answered%")]) / 100
cpu_ns = float(row[head.index("cpu_ns/read")])
span = (t1 - t0) if t0 is not None else window
reads = n * answered * span * 1e6 / period_us
print(f"# {' '.join(row[:2])}: NET_RX softirq time per CPU over {span:.2f} s (tracepoints), "
      f"{reads:.0f} reads answered in that time (N x answered% x periods)")
print(f"{'cpu':>4} {'role':>26} {'runs':>9} {'ms':>9} {'%cpu':>6} {'ns/read':>8} {'runs/read':>9}")
for cpu in sorted(total):
    role = {0: "pollers (READs' receive)", 1: "responders (replies' rx)"}.get(cpu, "other")
    print(f"{cpu:>4} {role:>26} {runs[cpu]:>9} {total[cpu]*1e3:>9.1f} {100*total[cpu]/span:>6.2f} "
          f"{total[cpu]*1e9/reads:>8.0f} {runs[cpu]/reads:>9.2f}")
print(f"poller CPU per answered read (bench, same run): {cpu_ns:.0f} ns")
