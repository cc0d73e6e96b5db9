import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
from validate.host_draws import chain_drawer, recompute_drawer, fsdp_drawer, microbatch_drawer
from validate.alive_bench import alive_drawer, split_drawer, alive_model
from validate.microbench import worker_threads_env
from specs.model import load_model
from validate.launch import launch
def w(rank, world):
    import torch, torch.distributed as dist
    from validate.bench_timing import worker_device
    torch.set_num_threads(1)
    dev, dsync = worker_device("gloo")
    m = alive_model(load_model("tiny"))
    out = {}
    t = time.perf_counter()
    ds = {"chain": chain_drawer(torch, dev, dsync, 5), "recompute": recompute_drawer(torch, dev, dsync, 5),
          "fsdp": fsdp_drawer(torch, dev, dsync, 5), "microbatch": microbatch_drawer(torch, dev, dsync, 5),
          "alive": alive_drawer(torch, dev, dsync, 5, m), "split": split_drawer(torch, dev, 5, m)}
    out["setup"] = time.perf_counter() - t
    for k, d in ds.items():
        dist.barrier(); t = time.perf_counter(); d(); out[k] = time.perf_counter() - t
    return out
def main():
    with worker_threads_env(4):
        t = time.perf_counter()
        r = launch(w, 2, (), timeout_s=600, backend="gloo")
        print("total", round(time.perf_counter() - t, 1))
        for k in r[0]: print(k, [round(x[k], 2) for x in r])
if __name__ == "__main__":
    main()
