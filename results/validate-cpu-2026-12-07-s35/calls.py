"""Does compute interleaved with 2-rank gloo all-reduces (as tp=2's forward runs) run faster,
per op, than the same compute back to back? Two gloo processes; each round times a burst of
8 pieces (GEMM + GELU + layer norm each) twice, modes interleaved: 'plain' pieces back to
back, 'calls' a 32 KiB all-reduce after each piece. Only the pieces are timed (the calls are
left out). Prints per mode the median over rounds of the summed piece time (ms), rank 0/1."""
import os, statistics, sys, time
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, rounds, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1); torch.manual_seed(rank)
    a = torch.randn(128, 512); b = torch.randn(512, 128); x = torch.randn(64, 4096)
    buf = torch.zeros(8192)
    def burst(calls):
        t = 0.0
        for _ in range(8):
            t0 = time.perf_counter()
            a @ b; torch.nn.functional.gelu(x); torch.nn.functional.layer_norm(x, (4096,))  # results unused: only their time
            t += time.perf_counter() - t0
            if calls:
                dist.all_reduce(buf)
        return t
    for _ in range(10):
        burst(True)
    res = {"plain": [], "calls": []}
    for r in range(rounds):
        for m in (("plain", "calls") if r % 2 == 0 else ("calls", "plain")):
            dist.barrier()
            res[m].append(burst(m == "calls") * 1e3)
    out = [None, None]
    dist.all_gather_object(out, res)
    if rank == 0:
        for m in ("plain", "calls"):
            print(f"{m}: median {statistics.median(out[0][m]):.3f} / {statistics.median(out[1][m]):.3f} ms")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]) if len(sys.argv) > 1 else 40, 29531 + int(time.time()) % 1000), nprocs=2)
