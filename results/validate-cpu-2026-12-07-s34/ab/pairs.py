"""4 gloo processes on 2 cores: the cost a 32 KiB 2-rank all-reduce adds to rounds of ~0.8 ms of
small-op compute in pair (0,1), while pair (2,3): runs the same stream in step (lockstep),
computes without calls (busy), runs its own stream of calls after shorter compute so that it
drifts in and out of step (drift), or sleeps (sleep). Modes rotate with the launch; a warm-up
stream of calls runs first. Cost = mean round with call - mean round alone (100 rounds),
median of 3 repeats, rank 0's figure.

    [LAYOUT=same|split] python3 pairs.py LAUNCH [MODE,MODE,...]

LAYOUT pins the processes before the group starts (same: each pair on one vCPU; split: each
pair across the vCPUs; unset: left to the scheduler). pairs2.txt ran it with the modes
lockstep,busy,drift,sleep; pairs3.txt with lockstep,busy (the default) under each layout.
pairs.txt ran an earlier version of this file (commit 39a9c76: no warm-up stream, a fixed
busy window, a "half" mode with one of the other pair computing)."""
import os, sys, time, statistics as st
import torch, torch.distributed as dist, torch.multiprocessing as mp

def compute_fn(scale=1.0):
    torch.manual_seed(0)
    xs = [torch.randn(64, 128) for _ in range(max(1, round(4 * scale)))]
    ws = [torch.randn(128, 128) for _ in range(4)]
    def f():
        for x in xs:
            h = x
            for w in ws:
                h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w)) + h
                h = torch.nn.functional.layer_norm(h, (128,))
    return f

MODES = ['lockstep', 'busy']

def worker(rank, modes, budget, q):
    os.environ['MASTER_ADDR'] = '127.0.0.1'; os.environ['MASTER_PORT'] = '29541'
    torch.set_num_threads(1)
    lay = os.environ.get('LAYOUT')
    if lay == 'same':      # each pair on one vCPU: 0,1 -> cpu0; 2,3 -> cpu1
        os.sched_setaffinity(0, {rank // 2})
    elif lay == 'split':   # each pair across the vCPUs: 0,2 -> cpu0; 1,3 -> cpu1
        os.sched_setaffinity(0, {rank % 2})
    dist.init_process_group('gloo', rank=rank, world_size=4)
    g01 = dist.new_group([0, 1]); g23 = dist.new_group([2, 3])
    my = g01 if rank < 2 else g23
    f = compute_fn(); fshort = compute_fn(0.5)
    t = torch.randn(8192)
    for _ in range(50):
        f(); dist.all_reduce(t, group=my)
    res = {}
    for mode in modes:
        out = []
        for rep in range(3):
            for kind in ('alone', 'call'):
                dist.barrier()
                n = 100
                if rank < 2 or mode == 'lockstep':
                    t0 = time.perf_counter()
                    for _ in range(n):
                        f()
                        if kind == 'call':
                            dist.all_reduce(t, group=my)
                    out.append((kind, (time.perf_counter() - t0) / n))
                else:
                    if mode == 'drift':  # a fixed count both ranks agree on, longer than pair (0,1)'s stream
                        for _ in range(budget[kind + '_rounds']):
                            fshort(); dist.all_reduce(t, group=my)
                    else:
                        t0 = time.perf_counter()
                        while time.perf_counter() - t0 < budget[kind]:
                            if mode == 'busy':
                                f()
                            else:
                                time.sleep(0.01)
        if rank == 0:
            a = [e for k, e in out if k == 'alone']; c = [e for k, e in out if k == 'call']
            res[mode] = (st.median(a) * 1e3, st.median(c) * 1e3, (st.median(c) - st.median(a)) * 1e3)
    if rank == 0:
        q.put(res)
    dist.barrier()

if __name__ == '__main__':
    launch = int(sys.argv[1])
    if len(sys.argv) > 2:
        MODES[:] = sys.argv[2].split(',')
    modes = MODES[launch % len(MODES):] + MODES[:launch % len(MODES)]
    budget = {'alone': 0.4, 'call': 0.6, 'alone_rounds': 250, 'call_rounds': 400}
    ctx = mp.get_context('fork'); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, modes, budget, q)) for r in range(4)]
    [p.start() for p in ps]; res = q.get(); [p.join() for p in ps]
    print(f"{os.environ.get('LAYOUT','free')} launch {launch}: " + "; ".join(f"{k} {res[k][2]:.2f} ms (rounds {res[k][0]:.2f} / {res[k][1]:.2f})" for k in modes))
