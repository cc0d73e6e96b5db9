"""Offline: the call factor applied as f**ALPHA (ALPHA=1: mechanism 59 as is; 0: off)."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
import validate.probe as pr
ALPHA = float(sys.argv[1])
_cd = pr.call_drift
pr.call_drift = lambda plans: [f ** ALPHA if f else f for f in _cd(plans)]
rp.main(sys.argv[2:])
