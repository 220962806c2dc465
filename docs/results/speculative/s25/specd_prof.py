#!/usr/bin/env python3
"""specd's profile by thread kind: share of samples per outermost system call (and whether a
softirq ran inside it), and the leaf symbols of samples outside any system call.
Usage: specd_prof.py PERF_DATA (perf record -g -p <both specds>)."""
import collections, re, subprocess, sys
txt = subprocess.run(['perf', 'script', '-i', sys.argv[1], '-F', 'comm,pid,tid,ip,sym'],
                     capture_output=True, text=True).stdout
tot = collections.Counter(); sc = collections.defaultdict(collections.Counter)
leaf = collections.defaultdict(collections.Counter)
for block in txt.split('\n\n'):
    lines = [l for l in block.strip().split('\n') if l.strip()]
    if not lines:
        continue
    comm = re.sub(r'\d+$', '', lines[0].split()[0])
    syms = [(l.split(None, 1)[1] if len(l.split(None, 1)) > 1 else '?').split('+')[0] for l in lines[1:]]
    tot[comm] += 1
    sysn = [s for s in syms if s.startswith('__x64_sys_') or s.startswith('__sys_')]
    top = sysn[-1] if sysn else 'outside a system call'
    soft = ' [softirq inside]' if 'handle_softirqs' in syms else ''
    sc[comm][top + soft] += 1
    if not sysn:
        leaf[comm][syms[0][:70] if syms else '?'] += 1
for c in sorted(tot, key=lambda c: -tot[c]):
    if tot[c] < 50:
        continue
    print(f'== {c}: {tot[c]} samples')
    for k, v in sc[c].most_common(16):
        print(f'  {100 * v / tot[c]:5.1f}% {k}')
    print('  outside a system call, leaf symbols:')
    for k, v in leaf[c].most_common(8):
        print(f'    {100 * v / tot[c]:5.1f}% {k}')
