"""tp=2 per-call cost: the runner's tp=2 step with real all-reduces vs no-op all-reduces,
and the calibration's after-compute stream, in the same launch, alternating."""
import sys, statistics, time
sys.path.insert(0, '/work/main')
from validate.launch import launch
from validate.runner import _worker, RunConfig
from validate.collective_bench import CollectiveConfig, after_compute_rows, _collective_call
from specs.model import load_model
from specs.plan import resolve_plan

def worker(rank, world, reps, steps):
    import torch, torch.distributed as dist
    model = load_model("tiny")
    plan = resolve_plan("tp=2", model, 2)
    from validate.comm import Comm
    real_ar = Comm.all_reduce
    calls = [0]
    def counting(self, t, *a, **k):
        calls[0] += 1
        return real_ar(self, t, *a, **k)
    def noop(self, t, *a, **k):
        calls[0] += 1
        return t
    cfg = RunConfig(steps=steps, warmup=2, seed=0, backend="gloo")
    ccfg = CollectiveConfig(sizes=(), ops=(), after_compute_sizes=(32768,), after_compute_ops=("all_reduce",))
    out = []
    for r in range(reps):
        for mode in ("real", "noop", "stream"):
            if mode == "stream":
                dsync = None
                row = after_compute_rows(ccfg, 2, None, 0, (rank+1)%2, (rank+1)%2, torch.device("cpu"), dsync)
                out.append((mode, row[0][3]))
                continue
            Comm.all_reduce = counting if mode == "real" else noop
            calls[0] = 0
            res = _worker(rank, world, model, plan, cfg)
            Comm.all_reduce = real_ar
            ts = [s["wall_s"] for s in res["steps"][2:]]
            out.append((mode, ts, calls[0] / (steps + 2)))
    return out

if __name__ == "__main__":
    res = launch(worker, 2, (3, 10), timeout_s=600, backend="gloo")
    for rank, o in enumerate(res):
        print("rank", rank)
        for x in o:
            print(x)
