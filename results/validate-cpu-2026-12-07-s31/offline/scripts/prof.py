"""Time pieces of the world-4 collective launch 1, each in its own launch."""
import sys, time
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repository root
from validate.collective_bench import CollectiveConfig, collective_worker, sizes_bytes, COLLECTIVES
from validate.microbench import AFTER_COMPUTE_SIZES, BUSY_CALLS, STRAGGLER_REPS, worker_threads_env, worker_threads
from validate.launch import launch
W = int(sys.argv[1]) if len(sys.argv) > 1 else 4
ns = tuple(n for n in range(2, W + 1) if W % n == 0)
base = CollectiveConfig(tuple(sizes_bytes()), COLLECTIVES, ns, repeats=5, threads=worker_threads(W), backend="gloo")
pieces = [
  ("empty", replace(base, sizes=(), ops=())),
  ("probe+chain", replace(base, sizes=(), ops=(), probe=True, overhead_chain=True)),
]
for op in COLLECTIVES:
  pieces.append((f"sweep {op} <=1MiB", replace(base, ops=(op,), sizes=tuple(sizes_bytes(4096, 1 << 20)))))
  pieces.append((f"sweep {op} 2..64MiB", replace(base, ops=(op,), sizes=tuple(sizes_bytes(2 << 20, 64 << 20)))))
pieces += [
  ("after compute", replace(base, sizes=(), ops=(), after_compute_sizes=AFTER_COMPUTE_SIZES)),
  ("straggler", replace(base, sizes=(), ops=(), after_compute_sizes=AFTER_COMPUTE_SIZES, straggler_reps=STRAGGLER_REPS)),
  ("posted", replace(base, sizes=(), ops=(), posted=True, after_compute_sizes=())),
  ("busy", replace(base, sizes=(), ops=(), busy_calls=BUSY_CALLS)),
]
def main():
  with worker_threads_env(W):
    for name, cfg in pieces:
      t = time.perf_counter()
      launch(collective_worker, W, (cfg,), timeout_s=600, backend="gloo")
      print(f"{name:30s} {time.perf_counter()-t:6.1f} s", flush=True)
if __name__ == '__main__':
  main()
