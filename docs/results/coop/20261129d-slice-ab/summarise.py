import json,sys,collections
for r in sys.argv[1:]:
    agg=collections.defaultdict(list)
    for l in open(r+'/points.jsonl'):
        d=json.loads(l); p=d['point']
        agg[p['system']].append(p)
    print(r)
    for s,ps in agg.items():
        m=lambda k: sum(p[k] for p in ps)/len(ps)
        print('  %-10s tps %6.0f p50 %.3f p99 %5.1f fetch %5.0f cpu %5.1f host %5.1f busy %.2f thr %.2f %5.0f ref %5.0f' % (s, m('tps'), m('p50_ms'), m('p99_ms'), m('peer_fetch_us'), m('cpu_us_per_req'), m('host_busy_us_per_req'), m('host_busy_frac'), m('throttled_period_frac'), m('throttled_ms_per_s'), m('host_ref_ns_per_op')))
