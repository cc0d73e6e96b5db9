"""Would the validator lose anything by probing less? Each saved run re-predicted
(benchmarks/repredict.py --refit --pool) with its probes replaced as if:
- SHARE=speed|call|both: every plan after the first of its process count took, in each
  launch, the previous plan's after-steps speed probe, call probe or both as its own
  before-steps one (a probe pair a plan saved);
- SHARE=after-speed|after-call|after-both: every plan probed only after its steps (its
  after-steps reading stands for both).

    SHARE=speed python3 results/validate-cpu-2026-12-08-s36/probe_share.py RUN_DIR ...
"""
import copy
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import repredict  # noqa: E402

MODE = os.environ["SHARE"]
KEYS = {"speed": ["speed_probe"], "call": ["call_probe"], "both": ["speed_probe", "call_probe"]}[MODE.removeprefix("after-")]
plain_load = repredict.load_run


def shared_load(path):
    run = copy.deepcopy(plain_load(path))
    for world in sorted({int(p["world"]) for p in run["plans"]}):
        plans = [p for p in run["plans"] if int(p["world"]) == world]  # in launch order
        for key in KEYS:
            if MODE.startswith("after-"):
                for p in plans:
                    for pair in (p.get(key) or {}).get("launches_s") or []:
                        pair[0] = pair[1]
                continue
            for prev, nxt in zip(plans, plans[1:]):
                for a, b in zip((prev.get(key) or {}).get("launches_s") or [], (nxt.get(key) or {}).get("launches_s") or []):
                    b[0] = a[1]
    return run


repredict.load_run = shared_load
sys.exit(repredict.main(["--refit", "--pool", *sys.argv[1:]]))
