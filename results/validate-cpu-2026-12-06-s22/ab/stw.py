import time, statistics as st
def worker(rank, world, L, mb, dur, barrier_each):
    import torch, torch.distributed as dist
    from dataclasses import replace
    from validate.compute_bench import stage_trainer
    from sim.schedules import one_f_one_b, gpipe
    from specs.model import load_model
    m = replace(load_model('tiny'), num_layers=L, global_batch_size=mb)
    d1 = stage_trainer(m, L, mb, torch.device('cpu'), actions=one_f_one_b(1, mb)[0])[2]
    gp = stage_trainer(m, L, mb, torch.device('cpu'), actions=gpipe(1, mb)[0])[2]
    d1(); gp(); d1(); gp()
    t1, tg = [], []
    t_end = time.time() + dur
    n = 0
    while True:
        if barrier_each: dist.barrier()
        t0 = time.perf_counter(); d1(); t1.append(time.perf_counter() - t0)
        if barrier_each: dist.barrier()
        t0 = time.perf_counter(); gp(); tg.append(time.perf_counter() - t0)
        n += 1
        flag = torch.tensor([1.0 if time.time() > t_end else 0.0]); dist.all_reduce(flag)
        if flag.item() > 0: break
    return (len(t1), round(st.median(tg) / st.median(t1), 3), round(st.median(t1) * 1e3, 1), round(st.median(tg) * 1e3, 1))
