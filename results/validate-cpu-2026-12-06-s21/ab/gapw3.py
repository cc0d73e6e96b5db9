"""Worker: mean round time of (gap compute) alone and (gap compute + 32 KiB all-reduce),
slowest rank, for gap kinds chain (width-8 GPT chain) / mlp (tiny tp=2 MLP half) at several gaps."""
import time, torch, torch.distributed as dist
import validate.collective_bench as cb

def gap_fn(kind, gap_s):
    if kind == "chain":
        return cb.gap_layers(gap_s, torch.device("cpu"), None)
    x = torch.randn(64, 128); w1 = torch.randn(256, 128); w2 = torch.randn(128, 256)
    unit = lambda: torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1)), w2)
    j = cb.units_in_gap(unit, gap_s, torch.device("cpu"), None)
    def run():
        for _ in range(j):
            unit()
    return run

def worker(rank, world, plan, calls):
    torch.set_num_threads(1)
    grp = None
    if world == 4:
        gs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        grp = gs[rank // 2]
    t = torch.zeros(8192)
    mx = torch.zeros(1, dtype=torch.float64)
    out = []
    def mean_round(comp, call):
        dist.barrier(); t0 = time.perf_counter()
        tc = 0.0
        for _ in range(calls):
            comp(); b = time.perf_counter(); call(); tc += time.perf_counter() - b
        mx[0] = (time.perf_counter() - t0) / calls
        dist.all_reduce(mx, op=dist.ReduceOp.MAX)
        return float(mx[0]), tc / calls
    call = lambda: dist.all_reduce(t, group=grp)
    call()
    for kind, g in plan:
        comp = gap_fn(kind, g * 1e-3)
        a, _ = mean_round(comp, lambda: None)
        w, tc = mean_round(comp, call)
        out.append((kind, g, a, w, tc))
    return out
