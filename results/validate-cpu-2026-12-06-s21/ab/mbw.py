"""Worker: tiny's one-rank training step (stage_trainer: embedding, L layers, head, mb
microbatches in 1F1B order of one stage), for several (L, mb) of equal layer-microbatches;
median of interleaved draws. Two such processes run at once (as calibration times compute)."""
import time, statistics, torch
from specs.model import load_model
from validate.compute_bench import stage_trainer

def worker(rank, world, configs, reps):
    torch.set_num_threads(1)
    m = load_model("tiny")
    dev = torch.device("cpu")
    fns = [stage_trainer(m, L, mb, dev)[2] for L, mb in configs]
    for f in fns:
        f(); f()
    draws = [[] for _ in fns]
    for r in range(reps):
        for i, f in enumerate(fns):
            t = time.perf_counter(); f(); draws[i].append(time.perf_counter() - t)
    return [statistics.median(d) for d in draws]
