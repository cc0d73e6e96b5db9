"""Consecutive plans of one shared launch: plan k+1's probes before its steps against plan k's after its steps."""
import json, statistics, sys
from pathlib import Path
rat = {"speed_probe": [], "call_probe": []}
own = {"speed_probe": [], "call_probe": []}
for d in sys.argv[1:]:
    f = Path(d) / "validation.json"
    if not f.exists(): continue
    plans = json.loads(f.read_text())["plans"]
    for w in (2, 4):
        ps = [p for p in plans if int(p["world"]) == w]
        for key in rat:
            for a, b in zip(ps, ps[1:]):
                la, lb = (a.get(key) or {}).get("launches_s") or [], (b.get(key) or {}).get("launches_s") or []
                for x, y in zip(la, lb):
                    if x[1] > 0 and y[0] > 0:
                        rat[key].append(y[0] / x[1])
            for p in ps:
                for x in (p.get(key) or {}).get("launches_s") or []:
                    if x[0] > 0 and x[1] > 0:
                        own[key].append(x[1] / x[0])
for key in rat:
    r, o = rat[key], own[key]
    if not r: continue
    q = lambda v: statistics.quantiles(v, n=10)
    print(f"{key}: next before / prev after: n={len(r)} median {statistics.median(r):.3f} p10 {q(r)[0]:.3f} p90 {q(r)[-1]:.3f}; "
          f"own after / own before: n={len(o)} median {statistics.median(o):.3f} p10 {q(o)[0]:.3f} p90 {q(o)[-1]:.3f}")
