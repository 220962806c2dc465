#!/usr/bin/env python3
"""Per metric and variant, every run's figure and their mean, from a run directory made by
run.sh (e.g. `python3 summarize.py r2`): the monitor's CPU per read (and its batching),
the XDP program's ns per READ, the one-sided read's p50 / p99 / p99.9 per transport, and
the softirq rows."""
import glob, json, os, re, statistics, sys

d = sys.argv[1]


def runs(metric):
    out = {}
    for f in sorted(glob.glob(f"{d}/{metric}-*-*.txt")):
        m = re.match(rf".*/{metric}-(.+)-(\d+)\.txt$", f)
        out.setdefault(m.group(1), []).append((int(m.group(2)), f))
    return {v: [f for _, f in sorted(fs)] for v, fs in out.items()}


def show(label, vals, fmt="{:.0f}"):
    if not vals:
        return
    s = " / ".join(fmt.format(v) for v in vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else 0
    print(f"  {label:<28} {s}   mean {fmt.format(statistics.mean(vals))}"
          f" sd {fmt.format(sd)} (min {fmt.format(min(vals))}, max {fmt.format(max(vals))})")


def rows(f):
    lines = [l.split() for l in open(f) if l.strip() and not l.startswith("#")]
    head = next((l for l in lines if l[0] == "backends"), None)
    return head, [l for l in lines if l[0].isdigit()]


print("monitor: bench_monitor --backends 64 --seconds 3 --only unicast:udp")
for v, fs in runs("monitor").items():
    print(f" {v}")
    cols = {"cpu_ns/read": [], "user_ns/rd": [], "sys_ns/rd": [], "reps/recv": [], "waits/period": []}
    for f in fs:
        head, rs = rows(f)
        for c in cols:
            cols[c].append(float(rs[0][head.index(c)]))
    for c, vals in cols.items():
        show(c, vals, "{:.1f}" if "/r" in c and "ns" not in c or "waits" in c else "{:.0f}")

print("xdp: ns per READ of 192 B, one run per call (BPF_PROG_TEST_RUN)")
for v, fs in runs("xdp").items():
    vals = []
    for f in fs:
        m = re.search(r"one run per call: (\d+) ns/op", open(f).read())
        if m:
            vals.append(float(m.group(1)))
    show(v, vals)

print("probe: one-sided read round trip across namespaces (µs)")
for v, fs in runs("probe").items():
    per = {}
    for f in fs:
        sj = f[:-4] + "/points.jsonl"
        if not os.path.exists(sj):
            continue
        for line in open(sj):
            p = json.loads(line)["point"]
            t = p.get("transport")
            for q in ("p50_us", "p99_us", "p999_us"):
                val = p.get(q)
                if t and val is not None:
                    per.setdefault((t, q), []).append(float(val))
    print(f" {v}")
    for (t, q), vals in sorted(per.items()):
        show(f"{t} {q}", vals, "{:.1f}")

print("softirq: bench_monitor --backends 64,1024 --seconds 10 --group --pin")
for v, fs in runs("softirq").items():
    per = {}
    for f in fs:
        head, rs = rows(f)
        for r in rs:
            key = f"{r[0]} {r[1]}"
            for c in ("cpu_ns/read", "sirq_ns/rd", "rx_sirq_ns/rd", "tx_sirq_ns/rd", "net_rx/rd", "cpu_%core"):
                try:
                    per.setdefault((key, c), []).append(float(r[head.index(c)]))
                except ValueError:
                    pass
    print(f" {v}")
    for (k, c), vals in per.items():
        show(f"{k} {c}", vals, "{:.2f}" if c in ("net_rx/rd",) else "{:.1f}" if "%" in c else "{:.0f}")

print("netrx: NET_RX softirq ns per answered read from tracepoints (netrx.sh), CPU 1 = replies' receive, CPU 0 = READs'")
per = {}
for f in sorted(glob.glob(f"{d}/netrx-*-*-*.txt")):
    m = re.match(r".*/netrx-(\d+)-(\w+)-(\d+)\.txt$", f)
    if not m:
        continue
    key = f"{m.group(1)} {m.group(2)}"
    for line in open(f):
        w = line.split()
        if w and w[0] in ("0", "1") and len(w) >= 7:
            per.setdefault((key, f"cpu{w[0]} ns/read"), []).append(float(w[-2]))
        if line.startswith("poller CPU per answered read"):
            per.setdefault((key, "poller ns/read"), []).append(float(line.split(":")[1].split()[0]))
for (k, c), vals in sorted(per.items()):
    show(f"{k} {c}", vals)
