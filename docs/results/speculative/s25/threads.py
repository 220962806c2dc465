#!/usr/bin/env python3
# Per-thread-name CPU (schedstat, ns) of the given processes between two instants. Usage: threads.py SECONDS PID...
import sys, os, re, time, collections
def snap(pids):
    d = {}
    for p in pids:
        for t in os.listdir(f'/proc/{p}/task'):
            try:
                comm = open(f'/proc/{p}/task/{t}/comm').read().strip()
                ns = int(open(f'/proc/{p}/task/{t}/schedstat').read().split()[0])
                sw = open(f'/proc/{p}/task/{t}/status').read()
                v = int(re.search(r'voluntary_ctxt_switches:\s+(\d+)', sw).group(1))
                d[(p, t)] = (comm, ns, v)
            except OSError:
                pass
    return d
secs = float(sys.argv[1]); pids = sys.argv[2:]
a = snap(pids); time.sleep(secs); b = snap(pids)
agg = collections.defaultdict(lambda: [0, 0])
for k, (comm, ns, v) in b.items():
    ns0, v0 = (a[k][1], a[k][2]) if k in a else (0, 0)
    agg[(k[0], re.sub(r'\d+$', '', comm))][0] += ns - ns0
    agg[(k[0], re.sub(r'\d+$', '', comm))][1] += v - v0
for k in sorted(agg):
    print('%-8s %-16s %8.2f ms/s  %7.1f wakeups/s' % (k[0], k[1], agg[k][0] / 1e6 / secs, agg[k][1] / secs))
