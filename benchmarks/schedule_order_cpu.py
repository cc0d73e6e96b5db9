"""Compute cost of a pipeline schedule's order alone, on one CPU process.

    python3 benchmarks/schedule_order_cpu.py [--model tiny] [--layers 2] [--microbatches 2 4 8 16]

Runs the runner's own stage code (validate/compute_bench.stage_trainer: a one-stage
pipeline of ``--layers`` layers of the model, with the embedding and the output layer and
loss, validate/dp.GradReducer's buckets) in GPipe order (every forward,
then every backward) and in 1F1B order (each forward followed by its backward), nothing
communicated, the two interleaved step by step, nine steps each. The work is the same;
what differs is how many microbatches' activations are alive when each backward reads
its own: all of them under GPipe, one under 1F1B. Prints the median time per microbatch
of each order and their ratio (docs/validation-cpu.md, Known gaps: GPipe's compute on
CPU hosts).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    import torch
    from specs.model import load_model
    from validate.compute_bench import stage_trainer
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=9)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(a.model)
    for m in a.microbatches:
        if m > model.global_batch_size:
            print(f"{m} microbatches: more than the model's {model.global_batch_size} sequences, skipped")
            continue
        steps = {s: stage_trainer(model, a.layers, m, "cpu", schedule=s)[2] for s in ("1f1b", "gpipe")}
        for f in steps.values():
            f()
        times = {s: [] for s in steps}
        for _ in range(a.steps):
            for s, f in steps.items():
                t0 = time.perf_counter()
                f()
                times[s].append((time.perf_counter() - t0) / m)
        med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
        print(f"{m:3d} microbatches: per microbatch 1F1B {med['1f1b']:.2f} ms, GPipe {med['gpipe']:.2f} ms, "
              f"GPipe / 1F1B {med['gpipe'] / med['1f1b']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
