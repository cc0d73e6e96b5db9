"""Offline: refit saved runs keeping only the FIRST alive (and split) draw of each compute worker
(records hold 2 per worker); combined with the after-compute 2-launch and 4 MiB emulation if ARG2."""
import sys, statistics
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
import validate.bench_record as br
from validate.microbench import with_launch_aggregate
MODE = sys.argv[1]
_lb = br.load_bench
def lb(*a, **k):
    r = replace(_lb(*a, **k))
    if "alive" in MODE:
        r.alive_draws = r.alive_draws[:1]
    if "ac2" in MODE:
        MAX = 4 << 20
        r.collectives = [c for c in r.collectives if c.nbytes <= MAX]
        r.launch_samples = [[op, n, b, (ss[:2] if len(ss) == 3 else ss)] for op, n, b, ss in r.launch_samples if b <= MAX]
        r = with_launch_aggregate(r, statistics.median)
    return r
br.load_bench = lb
rp.main(["--refit", "--pool"] + sys.argv[2:])
