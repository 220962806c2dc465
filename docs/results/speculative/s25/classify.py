import sys, subprocess, collections
# perf script -> per process (pid) of backend/specd threads: samples in burn_cpu vs other, other's top leaf symbols
data = sys.argv[1]
out = subprocess.run(['perf','script','-i',data,'-F','comm,pid,tid,ip,sym'], capture_output=True, text=True).stdout
cnt = collections.Counter(); leaf = collections.defaultdict(collections.Counter); chains = collections.defaultdict(collections.Counter)
for block in out.split('\n\n'):
    lines = [l for l in block.strip().split('\n') if l.strip()]
    if not lines: continue
    head = lines[0].split()
    comm = head[0]; pid = head[1].split('/')[0]
    key = None
    for pre in ('backend-w','specd','gatherd','farside','rmem'):
        if comm.startswith(pre): key = pre
    if key is None: continue
    syms = [l.split(None,1)[1] if len(l.split(None,1))>1 else '?' for l in lines[1:]]
    burn = any('burn_cpu' in s for s in syms)
    k = (key, pid, 'burn' if burn else 'other')
    cnt[k] += 1
    if not burn:
        leaf[(key,pid)][syms[0][:60] if syms else '?'] += 1
        # first "interesting" frame: syscall entry name
        sc = next((s for s in syms if '__x64_sys_' in s or 'handle_softirqs' in s or 'asm_sysvec' in s), None)
        chains[(key,pid)][sc.split('+')[0][:50] if sc else 'user/' + (syms[0][:40] if syms else '?')] += 1
for k in sorted(cnt): print(k, cnt[k])
for kp in sorted(chains):
    print('==', kp, sum(chains[kp].values()))
    for s, n in chains[kp].most_common(14): print('   %6d %s' % (n, s))
