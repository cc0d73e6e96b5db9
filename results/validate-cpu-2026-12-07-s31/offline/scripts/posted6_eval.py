"""Offline: refit saved runs as if calibration had N_LAUNCH collective launches instead of 8
(the last launches' samples and probe/overhead draws dropped); with the other session-31 cuts."""
import sys, statistics
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
import benchmarks.repredict as rp
import validate.bench_record as br
from validate.microbench import with_launch_aggregate, WORKER_CHAIN_DRAWS
N = int(sys.argv[1])
_lb = br.load_bench
def lb(*a, **k):
    r = replace(_lb(*a, **k))
    r.alive_draws = r.alive_draws[:1]
    MAX = 4 << 20
    r.collectives = [c for c in r.collectives if c.nbytes <= MAX]
    ls = []
    for op, n, b, ss in r.launch_samples:
        if b > MAX:
            continue
        if len(ss) == 3:
            ss = ss[:2]
        elif len(ss) == 8:
            ss = ss[:N]
        ls.append([op, n, b, ss])
    r.launch_samples = ls
    # probe draws: the compute worker's first, then one per collective launch
    r.probe_draws_s = r.probe_draws_s[:1 + N]
    r.overhead_draws = r.overhead_draws[:WORKER_CHAIN_DRAWS + N]
    r.overhead = [replace(o, seconds=float(statistics.median(d[i] for d in r.overhead_draws))) for i, o in enumerate(r.overhead)]
    r.probe_s = float(statistics.median(r.probe_draws_s))
    return with_launch_aggregate(r, statistics.median)
br.load_bench = lb
rp.main(["--refit", "--pool"] + sys.argv[2:])
