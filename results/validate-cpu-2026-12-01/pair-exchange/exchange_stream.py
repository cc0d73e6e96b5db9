"""Experiment: a 32 KiB 2-rank all-reduce after ~1 ms of the runner's layer code,
gloo's dist.all_reduce vs an exchange on a process group per direction."""
import sys, time, statistics, json
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))  # the repository root
from validate.launch import launch

def worker(rank, world, mode, rounds=200):
    import torch, torch.distributed as dist
    torch.set_num_threads(1)
    from validate.collective_bench import gap_layers
    rank = dist.get_rank(); peer = 1 - rank
    g_ab = dist.new_group([0, 1]); g_ba = dist.new_group([0, 1])
    out_g, in_g = (g_ab, g_ba) if rank == 0 else (g_ba, g_ab)
    compute = gap_layers(1e-3, torch.device("cpu"), None)
    t = torch.ones(8192); buf = torch.empty(8192)
    def ar():
        dist.all_reduce(t)
    def ex():
        w = dist.irecv(buf, peer, group=in_g)
        s = dist.isend(t, peer, group=out_g)
        w.wait(); s.wait()
        t.add_(buf)
    nxt = {}
    def ex_pre():
        w = nxt.pop("w", None)
        if w is None:
            w = dist.irecv(buf, peer, group=in_g)
        s = dist.isend(t, peer, group=out_g)
        w.wait(); s.wait()
        t.add_(buf)
        nxt["w"] = dist.irecv(buf, peer, group=in_g)   # the next call's receive, posted now
    call = {"ar": ar, "ex": ex, "expre": ex_pre}[mode]
    def mean_round(c):
        dist.barrier(); t0 = time.perf_counter()
        for _ in range(rounds):
            compute(); c()
        return (time.perf_counter() - t0) / rounds
    base = mean_round(lambda: None)
    got = mean_round(call)
    if "w" in nxt:
        s = dist.isend(t, peer, group=out_g); nxt["w"].wait(); s.wait()
    return (got - base) * 1e6

if __name__ == "__main__":
    res = {m: [] for m in ("ar", "ex", "expre")}
    for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        for m in res:
            r = launch(worker, 2, (m,), timeout_s=120)
            res[m].append(round(max(r), 1))
            print(m, res[m][-1], flush=True)
    for m, v in res.items():
        print(m, "us/call per launch:", v, "median", statistics.median(v))
