"""Each process trains tiny's 2-layer stage (both ends) in GPipe's and 1F1B's stage-0 order,
16 microbatches, no communication, interleaved steps; returns the step times and the
per-action compute of the last step of each order."""
import time, statistics


def worker(rank, world, steps, layers):
    import torch
    torch.set_num_threads(1)
    from specs.model import load_model
    from sim.schedules import make_schedule
    from validate.compute_bench import stage_trainer
    m = load_model("tiny")
    dev = torch.device("cpu")
    fns = {}
    for name in ("1f1b", "gpipe"):
        acts = make_schedule(name, 2, 16)[0]
        fns[name] = stage_trainer(m, layers, 16, dev, actions=acts)[2]
    for f in fns.values():
        f(); f()
    out = {k: [] for k in fns}
    for _ in range(steps):
        for k, f in fns.items():
            t0 = time.perf_counter(); f(); out[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in out.items()}
