import sys, time, statistics as st, multiprocessing as mp
sys.path.insert(0, '/work/main')
def worker(name, barrier, dur, q, L, mb, mode):
    import torch
    torch.set_num_threads(1)
    from dataclasses import replace
    from validate.backend import configure_cpu_heap; configure_cpu_heap()
    from validate.compute_bench import stage_trainer
    from sim.schedules import one_f_one_b, gpipe
    from specs.model import load_model
    m = replace(load_model('tiny'), num_layers=L, global_batch_size=mb)
    d1 = stage_trainer(m, L, mb, torch.device('cpu'), actions=one_f_one_b(1, mb)[0])[2]
    gp = stage_trainer(m, L, mb, torch.device('cpu'), actions=gpipe(1, mb)[0])[2]
    d1(); gp(); d1(); gp()
    # same: both processes run the same order at once; cross: one runs d1 while the other runs gp
    fa, fb = (d1, gp) if (mode == 'same' or name == 'A') else (gp, d1)
    ta, tb = [], []
    t_end = time.time() + dur
    while time.time() < t_end:
        barrier.wait(); t0 = time.perf_counter(); fa(); ta.append(time.perf_counter() - t0)
        barrier.wait(); t0 = time.perf_counter(); fb(); tb.append(time.perf_counter() - t0)
    if fa is d1: t1, tg = ta, tb
    else: t1, tg = tb, ta
    q.put((name, mode, len(t1), round(st.median(tg) / st.median(t1), 3), round(st.median(t1) * 1e3, 1), round(st.median(tg) * 1e3, 1)))
if __name__ == '__main__':
    L, mb, dur = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    ctx = mp.get_context('fork')
    for mode in ('same', 'cross'):
        b = ctx.Barrier(2); q = ctx.Queue()
        ps = [ctx.Process(target=worker, args=(n, b, dur, q, L, mb, mode)) for n in 'AB']
        [p.start() for p in ps]
        res = [q.get() for _ in ps]; [p.join() for p in ps]
        for r in res: print(f"L{L} mb{mb}", r, flush=True)
