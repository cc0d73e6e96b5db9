"""dp=4 against dp=2 over every saved run with both (runs.txt): each one's compute phase,
measured and predicted, per session (medians), beside the host's speed probe, dp=2's step
and dp=4's error. The simulator's 4-on-2 slowdown is processor sharing, at most n/c = 2
(sim/core_sharing.py); this shows what the measured ratio did.

    python3 results/validate-cpu-2026-12-08-s36/dp4.py
"""
import json, statistics
from pathlib import Path
rows=[]
for d in open(Path(__file__).parent / 'runs.txt').read().split():
    try: v=json.loads((Path(__file__).resolve().parents[2] / d/'validation.json').read_text())
    except Exception: continue
    P={}
    for p in v['plans']:
        s=p['plan']
        key=('dp2' if s.startswith('tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,precision') else 'dp4' if s.startswith('tp=1,pp=1,dp=4') else None)
        if key:
            ph=p['phases']; P[key]=(ph['compute']['measured_s'] if isinstance(ph['compute'],dict) else None, ph, p['measured_step_time_s'], p['predicted_step_time_s'], (p.get('speed_probe') or {}).get('run_s',0))
    if 'dp2' in P and 'dp4' in P:
        rows.append((d, P))
out=[]
for d,P in rows:
    c2m=P['dp2'][1]['compute']['measured_s']; c2p=P['dp2'][1]['compute']['predicted_s']
    c4m=P['dp4'][1]['compute']['measured_s']; c4p=P['dp4'][1]['compute']['predicted_s']
    if min(c2m,c2p,c4m,c4p)<=0: continue
    out.append((d.split('/')[1][13:], c4m/c2m, c4p/c2p, P['dp2'][4]*1e3, P['dp2'][2]*1e3, P['dp4'][3]/P['dp4'][2]-1))
import collections
by=collections.defaultdict(list)
for o in out: by[o[0]].append(o)
print(f"{'session':14s} {'n':>3} {'meas c4/c2':>10} {'pred c4/c2':>10} {'probe ms':>8} {'dp2 ms':>7} {'dp4 err':>8}")
for k,v in by.items():
    m=lambda i: statistics.median(x[i] for x in v)
    print(f"{k:14s} {len(v):3d} {m(1):10.3f} {m(2):10.3f} {m(3):8.2f} {m(4):7.1f} {100*m(5):+7.1f}%")
