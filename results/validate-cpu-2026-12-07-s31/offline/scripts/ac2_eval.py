"""Offline: refit saved runs as if the after-compute rows (and straggler) had 2 launches, not 3;
optionally with the collective sweep cut at MAX bytes."""
import sys, statistics
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
import validate.bench_record as br
from validate.microbench import with_launch_aggregate
MAX = int(sys.argv[1])
_lb = br.load_bench
def lb(*a, **k):
    r = replace(_lb(*a, **k))
    r.collectives = [c for c in r.collectives if c.nbytes <= MAX]
    r.launch_samples = [[op, n, b, (ss[:2] if len(ss) == 3 else ss)] for op, n, b, ss in r.launch_samples if b <= MAX]
    return with_launch_aggregate(r, statistics.median)
br.load_bench = lb
rp.main(["--refit", "--pool"] + sys.argv[2:])
