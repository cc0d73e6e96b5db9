"""Offline: refit saved runs with the collective sweep cut at MAX bytes (rows above dropped)."""
import sys
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
MAX = int(sys.argv[1])
import validate.bench_record as br
_lb = br.load_bench
def lb(*a, **k):
    r = _lb(*a, **k)
    r = replace(r)
    r.collectives = [c for c in r.collectives if c.nbytes <= MAX]
    r.launch_samples = [s for s in r.launch_samples if s[2] <= MAX]
    return r
br.load_bench = lb
rp.main(["--refit", "--pool"] + sys.argv[2:])
