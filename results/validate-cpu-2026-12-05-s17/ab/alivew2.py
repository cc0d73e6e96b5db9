def worker(rank, world, before, reps):
    import torch
    from specs.model import load_model
    from validate.compute_bench import stage_trainer, _interleaved_drawer, fsdp_drawer, recompute_drawer, ALIVE_LAYERS, ALIVE_MICROBATCHES, ALIVE_DEPTHS
    from sim.schedules import one_f_one_b
    m = load_model("tiny")
    dev = torch.device("cpu")
    fns = [stage_trainer(m, ALIVE_LAYERS, ALIVE_MICROBATCHES, dev, actions=one_f_one_b(d, ALIVE_MICROBATCHES)[0])[2] for d in ALIVE_DEPTHS]
    draw = _interleaved_drawer(torch, fns, 5, None)
    others = [recompute_drawer(torch, dev, None, 5), fsdp_drawer(torch, dev, None, 5)] if before else []
    out = []
    for _ in range(reps):
        for o in others:
            o()
        t = draw()
        out.append(round(t[-1] / t[0], 3))
    return out
