import sys, re, collections
# per thread: syscalls between getrusage pairs (measured windows); classify thread as source if it has SO_PROTOCOL in window, target if TCP_REPAIR_OPTIONS
lines=open(sys.argv[1]).read().splitlines()
pend={}  # tid -> partial line
calls=collections.defaultdict(list)
for l in lines:
    m=re.match(r'(\d+) \S+ (.*)',l)
    if not m: continue
    tid,rest=m.groups()
    if rest.startswith('<...'):
        name=re.match(r'<\.\.\. (\w+) resumed',rest).group(1)
        continue  # counted at start
    nm=re.match(r'(\w+)\(',rest)
    if not nm: continue
    calls[tid].append((nm.group(1),rest[:90]))
src=[];tgt=[]
for tid,cs in calls.items():
    win=None
    for name,txt in cs:
        if name=='getrusage':
            if win is None: win=[]
            else:
                t=' '.join(x[1] for x in win)
                if 'SO_PROTOCOL' in t: src.append(win)
                elif 'TCP_REPAIR_OPTIONS' in t: tgt.append(win)
                win=[]
        elif win is not None:
            win.append((name,txt))
def summ(ws,label):
    n=[len(w) for w in ws]
    n.sort()
    print(label,'windows',len(ws),'syscalls median',n[len(n)//2] if n else None,'min',n[0] if n else None,'max',n[-1] if n else None)
    c=collections.Counter(x[0] for w in ws for x in w)
    print('  per window:',{k:round(v/len(ws),2) for k,v in c.most_common()})
summ(src,'source'); summ(tgt,'target')
