import statistics
def worker(rank, world, layers, mbs, depths, reps):
    import torch
    from specs.model import load_model
    from validate.compute_bench import stage_trainer, _interleaved_drawer
    from sim.schedules import one_f_one_b
    m = load_model("tiny")
    dev = torch.device("cpu")
    fns = [stage_trainer(m, layers, mbs, dev, actions=one_f_one_b(d, mbs)[0])[2] for d in depths]
    draw = _interleaved_drawer(torch, fns, 5, None)
    out = []
    for _ in range(reps):
        t = draw()
        out.append([x / t[0] for x in t])
    return out
