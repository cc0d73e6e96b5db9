"""pp=2 against dp=2 over every saved run with both (runs.txt), per session (medians):
1F1B's and GPipe's compute, predicted / measured, over dp=2's; 1F1B's bubble phase measured
and predicted; 1F1B's error; dp=2's step (the host's speed).

    python3 results/validate-cpu-2026-12-08-s36/pp.py
"""
import json, statistics, collections
from pathlib import Path
by=collections.defaultdict(list)
for d in open(Path(__file__).parent / 'runs.txt').read().split():
    try: v=json.loads((Path(__file__).resolve().parents[2] / d/'validation.json').read_text())
    except Exception: continue
    P={}
    for p in v['plans']:
        s=p['plan']
        if s.startswith('tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,precision'): P['dp2']=p
        if s.startswith('tp=1,pp=2,dp=1,mbs=1,schedule=1f1b'): P['1f1b']=p
        if s.startswith('tp=1,pp=2,dp=1,mbs=1,schedule=gpipe'): P['gpipe']=p
    if len(P)<3: continue
    ph=lambda k,f,w: P[k]['phases'][f][w+'_s']
    try:
        r=(ph('1f1b','compute','predicted')/ph('1f1b','compute','measured'))/(ph('dp2','compute','predicted')/ph('dp2','compute','measured'))
        g=(ph('gpipe','compute','predicted')/ph('gpipe','compute','measured'))/(ph('dp2','compute','predicted')/ph('dp2','compute','measured'))
        b=ph('1f1b','bubble','measured')*1e3; bp=ph('1f1b','bubble','predicted')*1e3
        e=P['1f1b']['predicted_step_time_s']/P['1f1b']['measured_step_time_s']-1
        by[d.split('/')[1][13:]].append((r,g,b,bp,e,P['dp2']['measured_step_time_s']*1e3))
    except (KeyError, ZeroDivisionError): pass
print(f"{'session':14s} {'n':>3} {'1f1b c p/m over dp2':>19} {'gpipe c p/m over dp2':>20} {'1f1b bubble m/p ms':>18} {'1f1b err':>8} {'dp2 ms':>7}")
for k,v in by.items():
    m=lambda i: statistics.median(x[i] for x in v)
    print(f"{k:14s} {len(v):3d} {m(0):19.3f} {m(1):20.3f} {m(2):8.1f} / {m(3):6.1f} {100*m(4):+7.1f}% {m(5):7.1f}")
