"""Offline: the speed drift factor damped, f**a (a=1: as now). Run from the repository root:
python3 results/validate-cpu-2026-12-07-s32/offline/damp.py A RESULTS_DIR..."""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import benchmarks.repredict as rp
A = float(sys.argv[1])
_rd = rp.run_drift
def rd(rows, i):
    f = _rd(rows, i)
    return None if f is None else f ** A
rp.run_drift = rd
rp.main(sys.argv[2:])
