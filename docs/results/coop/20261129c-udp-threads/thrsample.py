#!/usr/bin/env python3
"""Samples the CPU time (utime+stime, ticks) of every thread of `farside backend` processes,
grouped by thread name, at two moments; prints the busy share per group per process."""
import os, sys, time
def snap():
    out = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try:
            cmd = open(f'/proc/{pid}/cmdline','rb').read().split(b'\0')
        except OSError: continue
        if len(cmd) < 2 or b'farside' not in cmd[0] or cmd[1] != b'backend': continue
        try: tasks = os.listdir(f'/proc/{pid}/task')
        except OSError: continue
        for t in tasks:
            try:
                st = open(f'/proc/{pid}/task/{t}/stat').read()
            except OSError: continue
            name = st[st.index('(')+1:st.rindex(')')]
            f = st[st.rindex(')')+2:].split()
            out[(pid, t, name)] = int(f[11]) + int(f[12])
    return out
delay, window = float(sys.argv[1]), float(sys.argv[2])
time.sleep(delay)
a = snap(); t0 = time.time()
time.sleep(window)
b = snap(); dt = time.time() - t0
hz = os.sysconf('SC_CLK_TCK')
agg = {}
for k, v in b.items():
    d = v - a.get(k, v)
    pid, _, name = k
    agg.setdefault((pid, name), [0, 0])
    agg[(pid, name)][0] += d; agg[(pid, name)][1] += 1
for (pid, name), (d, n) in sorted(agg.items()):
    if d > 0: print(f'{pid} {name:16} threads {n:3} busy {d/hz/dt*100:6.1f} % of a CPU')
