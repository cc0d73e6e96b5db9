"""How long a top-k selection takes depending on what ran before it (docs/validation-cpu.md,
mechanism 56).

Two processes (forked; no process group, a multiprocessing barrier) select the same bucket
size at once, as a dp=2 plan's replicas do, in a stream of error-feedback steps. Before
each selection a process does one of:

  none         nothing (the calibration's stream before mechanism 56: back to back)
  gemm:MS      MS milliseconds of the calibration's gap GEMMs (validate/compute_bench.gemm_gap;
               the stream since, at 20 ms)
  sleep:MS     sleeps MS milliseconds
  spin:MS      a Python loop for MS milliseconds (touches next to no memory)
  chain:MS     trains the calibration's small GPT (validate/host_draws' chain) for MS ms

and prints, per mode, each process's median selection time and the median split into the
selection's steps (validate/topk.select's own, timed through its ``lap`` callback: residual
add, abs, torch.topk, index gather, zeroing the kept entries).

  PYTHONPATH=. python3 benchmarks/topk_gap.py [--elems N] [--fraction F] [--grads FILE] none gemm:20 sleep:20

--grads FILE: a saved 1-D fp32 tensor (torch.save) to draw the gradients from, scaled per
element by 1 + 0.3 x a normal draw, instead of normal draws (torch.topk's time on a CPU
depends on the data).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

from process_pair import run_pair

WARMUP, STEPS, GRADS = 4, 16, 4


def _worker(rank: int, barrier, queue, mode: str, elems: int, fraction: float, grads_file: str | None):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    kind, _, ms = mode.partition(":")
    gap_s = float(ms or 0) / 1e3
    if grads_file:
        base = torch.load(grads_file).flatten().float()[:elems]
        grads = [base * (1 + 0.3 * torch.randn(base.numel())) for _ in range(GRADS)]
    else:
        grads = [torch.randn(elems) for _ in range(GRADS)]
    from validate.compute_bench import gemm_gap
    from validate.topk import SelectBuffers, select
    k = max(1, math.ceil(fraction * grads[0].numel()))
    bufs = SelectBuffers.like(grads[0], k)
    gemms = gemm_gap(torch, torch.device("cpu"), gap_s) if kind == "gemm" else None
    train = None
    if kind == "chain":
        from validate.host_draws import _chain_trainer
        train = _chain_trainer(torch.device("cpu"))[2]
    residual, rows = None, []
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        if kind == "sleep":
            time.sleep(gap_s)
        elif kind == "gemm":
            gemms()  # the calibration's own gap (validate/compute_bench.gemm_gap)
        elif kind in ("spin", "chain"):
            while time.perf_counter() - t0 < gap_s:
                if kind == "chain":
                    train()
        elif kind != "none":
            raise SystemExit(f"unknown mode {mode!r}: none, gemm:MS, sleep:MS, spin:MS or chain:MS")
        barrier.wait()
        marks = [time.perf_counter()]
        residual = select(grads[i % GRADS], residual, k, bufs, lap=lambda: marks.append(time.perf_counter()))[2]
        if i >= WARMUP:
            rows.append([b - a for a, b in zip(marks, marks[1:])])
    queue.put((rank, (statistics.median(sum(r) for r in rows), [statistics.median(c) for c in zip(*rows)])))


def main() -> None:
    from validate.topk import SELECT_STEPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modes", nargs="+")
    ap.add_argument("--elems", type=int, default=867_072, help="bucket size (default: tiny's one dp=2 bucket)")
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--grads", default=None)
    args = ap.parse_args()
    print(f"{args.elems} elements x {args.fraction:g}, 2 processes at once, medians of {STEPS} selections (ms)")
    print(f"{'mode':<12} {'rank 0':>8} {'rank 1':>8}   " + " ".join(f"{o:>7}" for o in SELECT_STEPS) + "  (rank 0)")
    for mode in args.modes:
        out = run_pair(_worker, mode, args.elems, args.fraction, args.grads)
        print(f"{mode:<12} {out[0][0] * 1e3:8.2f} {out[1][0] * 1e3:8.2f}   "
              + " ".join(f"{x * 1e3:7.2f}" for x in out[0][1]), flush=True)


if __name__ == "__main__":
    main()
