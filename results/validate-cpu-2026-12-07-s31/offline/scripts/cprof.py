import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
from validate.compute_bench import ComputeConfig, compute_worker
from validate.microbench import (TOPK_FRACTIONS, memory_sizes, model_attention_shapes, model_gemm_shapes,
                                 sweep_gemm_shapes, topk_sizes, worker_threads_env, worker_threads)
from validate.alive_bench import alive_model
from specs.model import load_model
from validate.launch import launch
def main():
    m = load_model("tiny"); tps = [1, 2, 4]
    ms = sorted(set(model_gemm_shapes(m, tps))); ss = sorted(set(sweep_gemm_shapes(1024)) - set(ms))
    print(len(ms), "model shapes", len(ss), "sweep-only shapes", ss)
    mem = memory_sizes(m, tps); attn = model_attention_shapes(m, tps)
    topk = [(n, f) for n in topk_sizes(m, tps) for f in TOPK_FRACTIONS]
    th = worker_threads(4)
    pieces = [("empty (draws only)", ComputeConfig((), (), threads=th, alive_model=alive_model(m))),
              ("model gemm", ComputeConfig(tuple(ms), (), threads=th, alive_model=alive_model(m))),
              ("sweep gemm", ComputeConfig(tuple(ss), (), threads=th, alive_model=alive_model(m))),
              ("memory", ComputeConfig((), tuple(mem), threads=th, alive_model=alive_model(m))),
              ("attn", ComputeConfig((), (), tuple(attn), threads=th, alive_model=alive_model(m))),
              ("topk", ComputeConfig((), (), (), tuple(topk), threads=th, alive_model=alive_model(m)))]
    with worker_threads_env(4):
        for name, cfg in pieces:
            t = time.perf_counter()
            launch(compute_worker, 2, (cfg,), timeout_s=600, backend="gloo")
            print(f"{name:22s} {time.perf_counter()-t:6.1f} s", flush=True)
if __name__ == "__main__":
    main()
