#!/usr/bin/env python3
"""Prints the table of a bench/lockout.sh result file (lockout.jsonl): one row per phase.

Goodput is served (non-5xx) completions per second of the measured window; "of cap" is
goodput over the capacity phase's goodput (closed loop, 32 clients = the back-ends'
workers, admission off). "stole" is the largest share of one CPU's time the hypervisor
took during the phase (/proc/stat steal; files from before it was kept show "-"); above
1% the phase is marked "!": not comparable with the others."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
cap = next(r["tps"] for r in rows if r.get("phase") == "capacity")
for r in rows:
    if r["phase"] == "meta":
        print(f"commit {r['commit'][:12]}{' (dirty)' if r['dirty'] else ''}, kernel {r['kernel']}, "
              f"{r['cpus']} x {r['cpu_model']}; {r['duration_s']:g} s after {r['warmup_s']:g} s warm-up; "
              f"metric: {r.get('metric', 'backlog')}, limit: {r['limit']}")
        if r.get("note"):
            print(f"note: {r['note']}")
    if r["phase"] == "proxy":
        print(f"the admission proxy used: metric {r['metric']}, limit {r['limit']}")
print(f"{'phase':<12}{'offered/s':>10}{'goodput/s':>10}{'of cap':>8}{'drop':>8}{'avg ms':>9}{'p99 ms':>9}{'stole':>8}")
for r in rows:
    if r["phase"] in ("meta", "proxy"):
        continue
    if r["phase"] == "recovery":
        print(f"recovery: status {r['status']} after {r['ms_to_admit']} ms")
        continue
    offered = r.get("offered_rps", r["attempts"] / r["duration_s"])
    stole = "-"
    if r.get("steal_ms"):
        share = max(r["steal_ms"]) / 1000.0 / (r["duration_s"] + r.get("warmup_s", 0))
        stole = f"{share * 100:.1f}%{'!' if share > 0.01 else ''}"
    print(f"{r['phase']:<12}{offered:>10.0f}{r['tps']:>10.0f}{r['tps'] / cap:>8.2f}"
          f"{r['drop_rate']:>8.3f}{r['avg_ms']:>9.1f}{r['p99_ms']:>9.1f}{stole:>8}")
