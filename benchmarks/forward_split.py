"""The runner's forward timed apart from its training step (docs/validation-cpu.md, Known
gaps, the first entry).

Two processes (forked, a multiprocessing barrier, no process group) each build a one-rank
stage of LAYERS layers of MODEL with both ends, as the calibration's alive and microbatch
draws do (validate/host_draws.stage_trainer), and time, interleaved, medians of REPS:

  plain     the forward of every microbatch under torch.no_grad()
  recorded  the same forward with autograd recording (the graph dropped unused)
  train     one training step over the microbatches (the runner's stage, 1F1B)

and print each per microbatch (ms) and recorded / plain.

  PYTHONPATH=. python3 benchmarks/forward_split.py [--model tiny] [--layers 4] [--microbatches 8] [--reps 12]
"""
from __future__ import annotations

import argparse
import statistics
import time

from process_pair import run_pair

KINDS = ("plain", "recorded", "train")


def _worker(rank: int, barrier, queue, model_name: str, layers: int, microbatches: int, reps: int) -> None:
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    from specs.model import load_model
    from validate.host_draws import stage_trainer
    chunk, mbs, train = stage_trainer(load_model(model_name), layers, microbatches, torch.device("cpu"))

    def plain():
        with torch.no_grad():
            for mb in mbs:
                chunk.forward(*mb)

    def recorded():
        for mb in mbs:
            chunk.forward(*mb)

    fns = {"plain": plain, "recorded": recorded, "train": train}
    for f in fns.values():  # warm-up: two of each
        f()
        f()
    times = {k: [] for k in fns}
    barrier.wait()
    for _ in range(reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    queue.put((rank, {k: statistics.median(v) / microbatches for k, v in times.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--reps", type=int, default=12)
    args = ap.parse_args()
    out = run_pair(_worker, args.model, args.layers, args.microbatches, args.reps)
    print(f"{args.model}, {args.layers} layers with both ends, {args.microbatches} microbatches, 2 processes at once, "
          f"medians of {args.reps} (ms a microbatch)")
    for rank, d in enumerate(out):
        print(f"rank {rank}: " + ", ".join(f"{k} {d[k] * 1e3:.3f}" for k in KINDS)
              + f"; recorded / plain {d['recorded'] / d['plain']:.3f}")


if __name__ == "__main__":
    main()
