import sys, time, statistics as st, multiprocessing as mp
sys.path.insert(0, '/work/main')
def worker(name, barrier, dur, q):
    import torch, os
    torch.set_num_threads(1)
    if os.environ.get('KEEP')=='1':
        from validate.backend import configure_cpu_heap; print('heap kept', configure_cpu_heap())
    from validate.compute_bench import alive_drawer
    from specs.model import load_model
    draw = alive_drawer(torch, torch.device('cpu'), None, 5, load_model('tiny'))
    rs = []
    t_end = time.time() + dur
    while True:
        if barrier is not None: barrier.wait()
        d = draw(); rs.append(d[3] / d[0])
        if time.time() > t_end: break
    q.put((name, len(rs), st.median(rs), [round(r, 3) for r in rs[:8]]))
if __name__ == '__main__':
    mode = sys.argv[1]; dur = float(sys.argv[2])
    ctx = mp.get_context('fork')
    b = ctx.Barrier(2) if mode == 'sync' else None
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(n, b, dur, q)) for n in 'AB']
    [p.start() for p in ps]
    res = [q.get() for _ in ps]; [p.join() for p in ps]
    for r in res: print(mode, r)
