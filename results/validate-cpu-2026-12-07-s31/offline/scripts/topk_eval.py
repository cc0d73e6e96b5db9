"""Offline: refit with the top-k samples at the model's own sizes only (power-of-4 sizes dropped)."""
import sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
import validate.bench_record as br
KEEP = {216768, 433536, 867072}
_lb = br.load_bench
def lb(*a, **k):
    r = replace(_lb(*a, **k))
    if sys.argv[1] == "model":
        r.topk = [t for t in r.topk if t.elems in KEEP]
    return r
br.load_bench = lb
rp.main(["--refit", "--pool"] + sys.argv[2:])
