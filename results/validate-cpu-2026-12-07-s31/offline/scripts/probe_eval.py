"""Offline: the saved runs re-predicted with only one of each launch's two call probes (before: index 0)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
WHICH = sys.argv[1]
_lr = rp.load_run
def lr(path):
    d = _lr(path)
    for p in d["plans"]:
        cp = p.get("call_probe") or {}
        if cp.get("launches_s") and WHICH != "both":
            cp["launches_s"] = [[l[0]] if WHICH == "before" else [l[-1]] for l in cp["launches_s"]]
    return d
rp.load_run = lr
rp.main(sys.argv[2:])
