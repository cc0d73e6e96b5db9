"""32 KiB all-reduce cost after gaps of the width-8 chain vs after tiny-shaped GEMM+gelu (tp=2 MLP half)."""
import sys, statistics, gapw
from validate.collective_bench import CollectiveConfig
from validate.launch import launch
from validate.microbench import worker_threads_env

# gapw.worker runs collective_bench.collective_worker with the chain or gapw.gap_mlp as the gap.

def main():
    world = int(sys.argv[1]); reps = int(sys.argv[2]); g = float(sys.argv[3])
    out = {}
    for r in range(reps):
        for kind in ("chain", "mlp"):
            cfg = CollectiveConfig((), (), (2,), repeats=3, threads=1, backend="gloo",
                                   after_compute_sizes=(32768,), after_compute_ops=("all_reduce",),
                                   after_compute_calls=100, compute_gap_s=g * 1e-3)
            with worker_threads_env(world):
                rows = launch(gapw.worker, world, (kind, cfg), timeout_s=300, backend="gloo")
            v = [row[3] for row in rows[0] if row[0].endswith("_after_compute")][0]
            out.setdefault(kind, []).append(v * 1e3)
            print(f"world {world} {kind} gap {g}: {v*1e3:.3f} ms", flush=True)
    for k, v in out.items():
        print(f"world {world} {k}: median {statistics.median(v):.3f} ms draws {['%.3f' % x for x in v]}")

if __name__ == "__main__":
    main()
