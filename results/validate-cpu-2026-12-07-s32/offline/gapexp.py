"""Throwaway: what a 32 KiB 2-rank all-reduce adds to a round of layer code of about G
seconds, for G in GAPS, interleaved in one launch (several launches). Run from the
repository root with torch installed: python3 results/validate-cpu-2026-12-07-s32/offline/gapexp.py 6"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
GAPS = (0.25e-3, 1e-3, 0.25e-3, 1e-3, 0.25e-3, 1e-3)

def worker(rank, world):
    import torch
    torch.set_num_threads(1)
    from validate.collective_bench import CollectiveConfig
    from validate.contention_bench import after_compute_rows
    out = []
    for g in GAPS:
        cfg = CollectiveConfig(sizes=(), ops=(), group_sizes=(2,), after_compute_sizes=(32768,),
                               after_compute_ops=("all_reduce",), after_compute_calls=50,
                               after_compute_min_calls=50, compute_gap_s=g)
        rows = after_compute_rows(cfg, 2, None, 0, 1 - rank, 1 - rank, torch.device("cpu"), None)
        out.append((g, float(rows[0][3])))
    return out

if __name__ == "__main__":
    from validate.launch import launch
    from validate.microbench import worker_threads_env
    for k in range(int(sys.argv[1])):
        with worker_threads_env(2):
            got = launch(worker, 2, (), timeout_s=120, backend="gloo")
        by = {}
        for g, s in got[0]:
            by.setdefault(g, []).append(s * 1e3)
        print(k, {g * 1e3: [round(x, 2) for x in v] for g, v in by.items()}, flush=True)
