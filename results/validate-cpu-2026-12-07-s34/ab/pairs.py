"""4 gloo processes on 2 cores: the cost a 32 KiB 2-rank all-reduce adds to rounds of ~1 ms of
small-op compute, in pair (0,1), while pair (2,3) (a) runs the same stream at once, (b) computes
without calls, (c) sleeps. Rounds: mean of 100; cost = with-call round - alone round."""
import os, sys, time, statistics as st
import torch, torch.distributed as dist, torch.multiprocessing as mp

def compute_fn():
    torch.manual_seed(0)
    xs = [torch.randn(64, 128) for _ in range(4)]
    ws = [torch.randn(128, 128) for _ in range(8)]
    def f():
        for x in xs:
            h = x
            for w in ws[:4]:
                h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w)) + h
                h = torch.nn.functional.layer_norm(h, (128,))
    return f

def worker(rank, mode_list, q):
    os.environ['MASTER_ADDR'] = '127.0.0.1'; os.environ['MASTER_PORT'] = '29533'
    torch.set_num_threads(1)
    dist.init_process_group('gloo', rank=rank, world_size=4)
    g01 = dist.new_group([0, 1]); g23 = dist.new_group([2, 3])
    my = g01 if rank < 2 else g23
    f = compute_fn()
    t = torch.randn(8192)
    for _ in range(20): f()
    res = {}
    for mode in mode_list:
        out = []
        for rep in range(3):
            for kind in ('alone', 'call'):
                dist.barrier()
                n = 100
                if rank < 2 or mode.startswith('lockstep'):
                    t0 = time.perf_counter()
                    for _ in range(n):
                        f()
                        if kind == 'call':
                            dist.all_reduce(t, group=my)
                    el = (time.perf_counter() - t0) / n
                elif mode == 'busy' or (mode == 'half' and rank == 2):
                    # keep computing until pair (0,1) is done: poll a flag via a non-blocking recv? use time budget
                    t0 = time.perf_counter(); el = 0
                    while time.perf_counter() - t0 < BUSY_S[kind]:
                        f()
                else:
                    time.sleep(BUSY_S[kind]); el = 0
                out.append((kind, el))
        if rank == 0:
            a = [e for k, e in out if k == 'alone']; c = [e for k, e in out if k == 'call']
            res[mode] = (st.median(a) * 1e3, st.median(c) * 1e3, (st.median(c) - st.median(a)) * 1e3)
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()

BUSY_S = {'alone': 0.0, 'call': 0.0}
if __name__ == '__main__':
    # size the busy window from a calibration of pair timing: generous, 100 rounds of ~4 ms
    BUSY_S['alone'] = float(sys.argv[1]) if len(sys.argv) > 1 else 0.35
    BUSY_S['call'] = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    ctx = mp.get_context('fork'); q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, ['lockstep', 'busy', 'half', 'sleep', 'lockstep2'], q)) for r in range(4)]
    [p.start() for p in ps]; res = q.get(); [p.join() for p in ps]
    for k, v in res.items():
        print(f"{k:9s} round alone {v[0]:.3f} ms, with call {v[1]:.3f} ms, call adds {v[2]:.3f} ms")
