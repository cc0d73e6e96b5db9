"""Chain step time against (layers, microbatches): per-op and per-microbatch host costs.
Fits t = a * ops + F * mb + c over the configs (least squares), ops as the cost model
counts them (compute_bench.chain_op_counts generalised)."""
import sys, statistics
import numpy as np
from dataclasses import replace
import chainw
from validate.launch import launch
from validate.microbench import worker_threads_env
from validate.compute_bench import CHAIN_MODEL
from costmodel import flops as fl
from costmodel.efficiency import transform_ops
from sim.program import grad_accumulation_ops

def ops(L, mb, rt):
    m = replace(CHAIN_MODEL, num_layers=L)
    f = (len(transform_ops(fl.layer_forward_ops(m, 1, 1, False, 4), rt)) * L
         + len(transform_ops(fl.embedding_ops(m, 1, 1, 4), rt)) + len(transform_ops(fl.head_forward_ops(m, 1, 1, 4), rt)))
    b = (len(transform_ops(fl.layer_backward_ops(m, 1, 1, False, 4), rt)) * L
         + len(transform_ops(fl.embedding_backward_ops(m, 1, 1, 4), rt))
         + len(transform_ops(fl.head_backward_ops(m, 1, 1, 4), rt))
         + len(transform_ops(grad_accumulation_ops(m, L, 1, True, True, "fp32", rt), rt)))
    return mb * (f + b)

def main():
    from costmodel.profile import load_profile
    rt = load_profile(sys.argv[2]).runtime
    configs = [(4, 2), (1, 8), (4, 8), (1, 2), (2, 4)]
    res = {c: [] for c in configs}
    for r in range(int(sys.argv[1])):
        with worker_threads_env(2):
            rows = launch(chainw.worker, 2, (configs, 12), timeout_s=600, backend="gloo")
        for c, a, b in zip(configs, rows[0], rows[1]):
            res[c].append((a + b) / 2)
    t = np.array([statistics.median(res[c]) for c in configs])
    n = np.array([ops(L, mb, rt) for L, mb in configs], dtype=float)
    mbv = np.array([mb for _, mb in configs], dtype=float)
    for c, ti, ni in zip(configs, t, n):
        print(f"L={c[0]} mb={c[1]}: {ti*1e3:.3f} ms, {int(ni)} ops, {ti/ni*1e6:.2f} us/op")
    A = np.stack([n, mbv, np.ones_like(n)], 1)
    x, *_ = np.linalg.lstsq(A, t, rcond=None)
    print(f"fit: {x[0]*1e6:.2f} us/op, {x[1]*1e6:.1f} us per microbatch (forward + backward), {x[2]*1e6:.1f} us per step")
    A2 = np.stack([n, np.ones_like(n)], 1)
    x2, *_ = np.linalg.lstsq(A2, t, rcond=None)
    print(f"without the per-microbatch term: {x2[0]*1e6:.2f} us/op, {x2[1]*1e6:.1f} us per step; residuals {(A2@x2/t-1)*100}")
    print(f"with it: residuals {(A@x/t-1)*100}")
if __name__ == "__main__":
    main()
