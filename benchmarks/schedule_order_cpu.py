"""Compute cost of a pipeline schedule's order alone, on one CPU process.

    python3 benchmarks/schedule_order_cpu.py [--model tiny] [--layers 2] [--microbatches 2 4 8 16]
    python3 benchmarks/schedule_order_cpu.py --depths 1 2 4 8 16 [--microbatches 16]

Runs the runner's own stage code (validate/host_draws.stage_trainer: a one-stage
pipeline of ``--layers`` layers of the model, with the embedding and the output layer and
loss, validate/dp.GradReducer's buckets) in GPipe order (every forward,
then every backward) and in 1F1B order (each forward followed by its backward), nothing
communicated, the two interleaved step by step, nine steps each. The work is the same;
what differs is how many microbatches' activations are alive when each backward reads
its own: all of them under GPipe, one under 1F1B. Prints the median time per microbatch
of each order and their ratio (docs/validation-cpu.md, Known gaps: GPipe's compute on
CPU hosts).

With ``--depths``, the order is stage 0's of a d-stage 1F1B pipeline instead (sim/schedules.py:
d forwards before the first backward, so d microbatches alive at the peak; d >= the
microbatch count is GPipe's forwards-first with 1F1B's backward order): the time per
microbatch at each depth against depth 1, and the activation bytes alive at the peak as
costmodel/memory.py counts them for this runner (fp32, fused attention, no dropout).
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
    from validate.host_draws import stage_trainer
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--depths", type=int, nargs="+", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(a.model)
    if a.depths:
        return _depths(torch, model, a)
    for m in a.microbatches:
        if m > model.global_batch_size:
            print(f"{m} microbatches: more than the model's {model.global_batch_size} sequences, skipped")
            continue
        med = _per_microbatch_ms({s: stage_trainer(model, a.layers, m, "cpu", schedule=s)[2] for s in ("1f1b", "gpipe")},
                                 m, a.steps)
        print(f"{m:3d} microbatches: per microbatch 1F1B {med['1f1b']:.2f} ms, GPipe {med['gpipe']:.2f} ms, "
              f"GPipe / 1F1B {med['gpipe'] / med['1f1b']:.3f}", flush=True)
    return 0


def _per_microbatch_ms(steps: dict, m: int, rounds: int) -> dict:
    """{key: median ms per microbatch} of each training step in ``steps`` ({key: step of m
    microbatches}), warmed up once, then timed ``rounds`` times interleaved."""
    for f in steps.values():
        f()
    times = {k: [] for k in steps}
    for _ in range(rounds):
        for k, f in steps.items():
            t0 = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t0) / m)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _depths(torch, model, a) -> int:
    from costmodel.memory import activation_bytes_per_layer, head_activation_bytes
    from sim.schedules import one_f_one_b
    from validate.host_draws import stage_trainer
    per_mb = (a.layers * activation_bytes_per_layer(model, 1, 1, False, "none", bytes_per_elem=4,
                                                    flash_attention=True, dropout=False)
              + head_activation_bytes(model, 1, 1, False, bytes_per_elem=4))
    for m in a.microbatches:
        med = _per_microbatch_ms({d: stage_trainer(model, a.layers, m, "cpu", actions=one_f_one_b(d, m)[0])[2]
                                  for d in a.depths}, m, a.steps)
        base = med[a.depths[0]]
        for d in a.depths:
            alive = min(d, m) * per_mb / 2**20
            print(f"{m:3d} microbatches, depth {d:2d}: {alive:6.1f} MiB alive at the peak, per microbatch "
                  f"{med[d]:.2f} ms, {med[d] / base:.3f} x depth {a.depths[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
