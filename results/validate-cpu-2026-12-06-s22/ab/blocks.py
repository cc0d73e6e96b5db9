"""d1 vs GPipe order of the runner's stage (tiny L layers, mb microbatches), two processes
at once (barrier before each call): alternating calls vs blocks of K calls of one order.
    python3 blocks.py L MB K ROUNDS [positions]
prints the ratio with the first call of a block left out, or with 'positions' each
position's median in the block (ms)."""
import sys, time, statistics as st, multiprocessing as mp
sys.path.insert(0, '/work/main')
def worker(name, barrier, q, L, mb, K, rounds):
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
    res = {}
    for mode, k in (('alternate', 1), (f'blocks of {K}', K)):
        t1, tg = [], []
        for _ in range(rounds // k):
            for f, acc in ((d1, t1), (gp, tg)):
                for j in range(k):
                    barrier.wait(); t0 = time.perf_counter(); f(); dt = time.perf_counter() - t0
                    acc.append((j, dt))
        if POSITIONS:
            res[mode] = {'d1': [round(st.median(d for j, d in t1 if j == i) * 1e3, 1) for i in range(k)],
                         'gp': [round(st.median(d for j, d in tg if j == i) * 1e3, 1) for i in range(k)]}
        else:  # in blocks, the first call after a switch is left out
            a = st.median(d for j, d in t1 if k == 1 or j > 0)
            g = st.median(d for j, d in tg if k == 1 or j > 0)
            res[mode] = (round(g / a, 3), round(a * 1e3, 1), round(g * 1e3, 1))
    q.put((name, res))
POSITIONS = sys.argv[5:6] == ['positions']
if __name__ == '__main__':
    L, mb, K, rounds = (int(x) for x in sys.argv[1:5])
    ctx = mp.get_context('fork')
    b = ctx.Barrier(2); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(n, b, q, L, mb, K, rounds)) for n in 'AB']
    [p.start() for p in ps]
    for _ in ps: print(f"L{L} mb{mb}", q.get(), flush=True)
    [p.join() for p in ps]
