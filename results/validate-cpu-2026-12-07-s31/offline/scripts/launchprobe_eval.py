"""Offline: probes taken once per shared launch (the first plan's before, the last plan's after)
instead of before and after every plan."""
import sys, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
from validate.probe import DRIFT_MIN, DRIFT_MAX
MODE = sys.argv[1]
_lr = rp.load_run
KEPT = {}
def kept(plans, key):
    by = {}
    for p in plans:
        by.setdefault(int(p["world"]), []).append(p)
    out = {}
    for w, ps in by.items():
        pr = [(p.get(key) or {}) for p in ps]
        if not all(x.get("launches_s") for x in pr):
            return None
        n = len(pr[0]["launches_s"])
        out[w] = ([[pr[0]["launches_s"][l][0], pr[-1]["launches_s"][l][-1]] for l in range(n)], pr[0].get("calibrated_s"))
    return out
def lr(path):
    d = _lr(path)
    if MODE == "launch":
        ks, kc = kept(d["plans"], "speed_probe"), kept(d["plans"], "call_probe")
        KEPT[id(d["plans"])] = ks
        for p in d["plans"]:
            w = int(p["world"])
            if kc and p.get("call_probe"):
                p["call_probe"]["launches_s"] = kc[w][0]
            if ks:
                p["speed_probe"]["launches_s"] = ks[w][0]
                p["_w"] = w
    return d
_rd = rp.run_drift
def run_drift(rows, i):
    ks = KEPT.get(id(rows))
    if MODE != "launch" or not ks:
        return _rd(rows, i)
    ratios = []
    for w, (launches, cal_s) in ks.items():
        ratios += [x / cal_s for pair in launches for x in pair if x > 0]
    f = statistics.median(ratios)
    return f if DRIFT_MIN <= f <= DRIFT_MAX else None
rp.load_run = lr
rp.run_drift = run_drift
rp.main(sys.argv[2:])
