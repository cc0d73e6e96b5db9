"""Alive draws variants vs GPipe-order stage, same launch, 2 processes at once."""
import sys, statistics
sys.path.insert(0, '/work/main')
from validate.launch import launch
from specs.model import load_model

def worker(rank, world, reps):
    import torch, torch.distributed as dist
    from validate.compute_bench import stage_trainer, _interleaved_drawer, alive_drawer
    from sim.schedules import one_f_one_b
    dev = torch.device("cpu")
    m = load_model("tiny")
    def drawer(layers, mbs, depths):
        fns = [stage_trainer(m, layers, mbs, dev, actions=one_f_one_b(d, mbs)[0])[2] for d in depths]
        return _interleaved_drawer(torch, fns, 5, None)
    variants = {"cal(3L,12mb)": alive_drawer(torch, dev, None, 5, m),
                "3L,16mb": drawer(3, 16, (1, 16)),
                "2L,16mb": drawer(2, 16, (1, 16)),
                "2L,12mb": drawer(2, 12, (1, 12))}
    out = []
    for r in range(reps):
        for k, dr in variants.items():
            dist.barrier()
            t = dr()
            out.append((k, [round(x / t[0], 3) for x in t], round(t[0]*1e3, 2)))
    return out

if __name__ == "__main__":
    res = launch(worker, 2, (int(sys.argv[1]),), timeout_s=900, backend="gloo")
    for rk in res:
        agg = {}
        for k, rat, t0 in rk:
            agg.setdefault(k, []).append(rat[-1])
        print({k: (sorted(v), round(statistics.median(v), 3)) for k, v in agg.items()})
