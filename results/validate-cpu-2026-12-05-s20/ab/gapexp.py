"""How the cost a 32 KiB all-reduce adds to a round depends on the compute gap before it."""
import sys, json, statistics
from dataclasses import replace
from validate.collective_bench import CollectiveConfig, collective_worker
from validate.launch import launch
from validate.microbench import worker_threads_env

def main():
    world = int(sys.argv[1]); gaps = [float(x) for x in sys.argv[2].split(",")]; reps = int(sys.argv[3])
    out = {}
    for r in range(reps):
        for g in gaps:
            cfg = CollectiveConfig((), (), (2,), repeats=3, threads=1, backend="gloo",
                                   after_compute_sizes=(32768,), after_compute_ops=("all_reduce",),
                                   after_compute_calls=100, compute_gap_s=g * 1e-3)
            with worker_threads_env(world):
                rows = launch(collective_worker, world, (cfg,), timeout_s=300, backend="gloo")
            v = [row[3] for row in rows[0] if row[0].endswith("_after_compute")][0]
            out.setdefault(g, []).append(v * 1e3)
            print(f"world {world} gap {g} ms: call adds {v*1e3:.3f} ms", flush=True)
    for g in gaps:
        print(f"world {world} gap {g:5.2f} ms: median {statistics.median(out[g]):.3f} ms  draws {['%.3f' % x for x in out[g]]}")

if __name__ == '__main__':
    main()
