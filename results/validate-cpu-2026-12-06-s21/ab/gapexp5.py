"""32 KiB 2-rank all-reduce after the width-8 chain or a GEMM+gelu block at several gaps:
total cost a call (with-call round - alone round), the call's own timer (slowest rank), and
the rest (what the call adds to the compute around it). 24 launches, order rotated."""
import sys, statistics, gapw3
from validate.launch import launch
from validate.microbench import worker_threads_env
def main():
    plan = [("chain",0.35),("chain",1.0),("mlp",0.1),("mlp",0.25),("mlp",0.5),("mlp",1.0)]
    res = {}
    W = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    plan = [(k, float(g)) for k, g in (x.split(':') for x in sys.argv[3].split(','))] if len(sys.argv) > 3 else plan
    for r in range(int(sys.argv[1])):
        p = plan[r % len(plan):] + plan[:r % len(plan)]
        with worker_threads_env(W):
            rows = launch(gapw3.worker, W, (p, 100), timeout_s=300, backend="gloo")
        for (kind, g, a, w, tc), r1 in zip(rows[0], rows[1]):
            res.setdefault((kind, g), []).append((a, w - a, max(tc, r1[4])))
    for k in plan:
        v = res[k]
        tot = statistics.median(x[1] for x in v); tcall = statistics.median(x[2] for x in v)
        infl = statistics.median(x[1]-x[2] for x in v)
        q = statistics.quantiles([x[1] for x in v], n=4)
        print(f"{k[0]:5s} {k[1]:4.2f}: gap {statistics.median(x[0] for x in v)*1e3:.3f} ms  total {tot*1e3:.3f} (IQR {q[0]*1e3:.2f}-{q[2]*1e3:.2f})  timed call {tcall*1e3:.3f}  total-timed {infl*1e3:.3f} ms")
if __name__ == "__main__":
    main()
