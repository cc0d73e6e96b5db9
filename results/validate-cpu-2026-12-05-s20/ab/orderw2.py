"""orderw.py with the forward and backward totals of each order's steps (the runner's Recorder)."""
import statistics


def worker(rank, world, steps, layers, micro):
    import torch
    torch.set_num_threads(1)
    from specs.model import load_model
    from sim.schedules import make_schedule
    import validate.compute_bench as cbm
    from validate.timeline import Recorder
    got = []
    orig_end = Recorder.end_step

    def end_step(self):
        d = orig_end(self)
        got.append(d)
        return d
    Recorder.end_step = end_step
    m = load_model("tiny")
    dev = torch.device("cpu")
    fns = {name: cbm.stage_trainer(m, layers, micro, dev, actions=make_schedule(name, 2, micro)[0])[2]
           for name in ("1f1b", "gpipe")}
    for f in fns.values():
        f(); f()
    out = {k: {"wall": [], "forward": [], "backward": []} for k in fns}
    for _ in range(steps):
        for k, f in fns.items():
            got.clear(); f(); d = got[-1]
            out[k]["wall"].append(d["wall_s"]); out[k]["forward"].append(d["detail_s"].get("forward", 0.0))
            out[k]["backward"].append(d["detail_s"].get("backward", 0.0))
    return {k: {q: statistics.median(v) for q, v in d.items()} for k, d in out.items()}
