#!/usr/bin/env python3
"""The anchor table from several kept runs of `farside lab admission` (one run per seed).

Usage: table.py DIR [DIR ...] [-- DIR [DIR ...]] ...
  e.g. table.py docs/results/anchor/table-seed{1,2,3} -- docs/results/anchor/mixed-cost-seed{1,2,3}

Groups separated by `--` are layers: a cell (scenario x load model x system) present in a
later group replaces that cell of the earlier groups (a newer run of some rows over an
older table); the runs within a group are combined.

For every scenario x load model x system it prints goodput/s and p99 ms as the mean over
the runs with their range (min-max), then, for each farside mode, the cells where it
meets the anchor's bar against each HAProxy configuration: goodput >= HAProxy's and
p99 <= HAProxy's, judged on the means and counted per run (k/n runs).
"""
import json
import statistics
import sys
from collections import defaultdict

FARSIDE = ["onesided-ac", "onesided-delay"]
ANCHORS = ["haproxy", "haproxy-divided"]


def load(groups):
    cells = defaultdict(dict)  # (scenario, load) -> system -> [point per run]
    runs = []
    for dirs in groups:
        layer = defaultdict(dict)
        for d in dirs:
            meta = json.load(open(f"{d}/summary.json"))
            runs.append((d, meta.get("commit"), meta.get("commit_dirty"), meta.get("seed"), meta.get("build", "debug (not recorded)")))
            for line in open(f"{d}/points.jsonl"):
                p = json.loads(line)["point"]
                layer[(p["scenario"], p["load_model"])].setdefault(p["system"], []).append(p)
        for cell, by_sys in layer.items():
            cells[cell].update(by_sys)
    return cells, runs


def groups_of(args):
    groups, cur = [], []
    for a in args:
        if a == "--":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    groups.append(cur)
    return [g for g in groups if g]


def stat(xs):
    return statistics.mean(xs), min(xs), max(xs)


def fmt(xs, digits=0):
    m, lo, hi = stat(xs)
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


HOST = [
    ("backend_cpu_busy", "back busy", 100, 1, "%"),
    ("backend_softirq", "back softirq", 100, 1, "%"),
    ("backend_cpu_us_per_served", "back us/served", 1, 0, ""),
    ("backend_conns_per_served", "conns/served", 1, 2, ""),
    ("proxy_cpu_us_per_attempt", "proxy us/attempt", 1, 0, ""),
    ("front_cpu_busy", "front busy", 100, 1, "%"),
]


def host_table(cells, systems):
    """Where the host's CPU and the back-ends' connections went (runs that recorded it)."""
    if not any(p.get(HOST[0][0]) is not None for by in cells.values() for ps in by.values() for p in ps):
        return
    print()
    print("where the CPU went (mean over the runs that recorded it):")
    print(f"{'scenario':16} {'load':6} {'system':16}" + "".join(f" {h[1]:>17}" for h in HOST))
    for (scen, lm), by_sys in sorted(cells.items()):
        for s in systems:
            pts = by_sys.get(s)
            if not pts:
                continue
            cols = []
            for key, _, scale, digits, unit in HOST:
                xs = [p[key] * scale for p in pts if p.get(key) is not None]
                cols.append(f"{statistics.mean(xs):.{digits}f}{unit}" if xs else "-")
            print(f"{scen:16} {lm:6} {s:16}" + "".join(f" {c:>17}" for c in cols))


def main(args):
    cells, runs = load(groups_of(args))
    for d, commit, dirty, seed, build in runs:
        print(f"run {d}: commit {commit} dirty={dirty} seed={seed} build={build}")
    systems = [s for s in FARSIDE + ANCHORS if any(s in c for c in cells.values())]
    print()
    print(f"{'scenario':16} {'load':6} {'system':16} {'n':>2} {'goodput/s mean (min-max)':>26} {'p99 ms mean (min-max)':>26}")
    for (scen, lm), by_sys in sorted(cells.items()):
        for s in systems:
            pts = by_sys.get(s)
            if not pts:
                continue
            g = [p["goodput"] for p in pts]
            q = [p["p99_ms"] for p in pts]
            print(f"{scen:16} {lm:6} {s:16} {len(pts):>2} {fmt(g, 1):>26} {fmt(q):>26}")
    host_table(cells, systems)
    print()
    for mode in FARSIDE:
        for anchor in ANCHORS:
            met = total = 0
            rows = []
            for (scen, lm), by_sys in sorted(cells.items()):
                f, a = by_sys.get(mode), by_sys.get(anchor)
                if not f or not a:
                    continue
                total += 1
                fg, ag = stat([p["goodput"] for p in f])[0], stat([p["goodput"] for p in a])[0]
                fq, aq = stat([p["p99_ms"] for p in f])[0], stat([p["p99_ms"] for p in a])[0]
                ok = fg >= ag and fq <= aq
                per_run = sum(
                    1 for x, y in zip(f, a) if x["goodput"] >= y["goodput"] and x["p99_ms"] <= y["p99_ms"]
                )
                met += ok
                rows.append(
                    f"  {scen:16} {lm:6} goodput {fg:7.1f} vs {ag:7.1f} ({fg / ag if ag else float('inf'):.2f}x)"
                    f"  p99 {fq:6.0f} vs {aq:6.0f} ms  {'MEETS' if ok else 'misses'}  (runs {per_run}/{min(len(f), len(a))})"
                )
            print(f"{mode} vs {anchor}: {met}/{total} cells meet goodput >= and p99 <= (means)")
            print("\n".join(rows))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
