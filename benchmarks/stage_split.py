"""The split draws' stage timed with and without the Adam that closes each of its steps
(docs/validation-cpu.md, mechanism 57): whether the optimizer's passes over the weights
change what the next step's forward and backward cost.

Two processes (forked, a multiprocessing barrier, no process group) each build the
calibration's split stage (validate/alive_bench.split_drawer: ALIVE_LAYERS layers of
MODEL with both ends, ALIVE_MICROBATCHES microbatches, one in flight) twice, one whose
steps end with the runner's Adam and one whose steps do not, and time them in alternating
blocks of BLOCK steps (the first of each block left out: it follows the other stage),
REPS blocks each. Printed per rank: the median forward and backward span a microbatch
(ms) of each, and the ratio.

  PYTHONPATH=. python3 benchmarks/stage_split.py [--model tiny] [--reps 8] [--block 4]
"""
from __future__ import annotations

import argparse
import statistics

from process_pair import run_pair

KINDS = ("with_adam", "without")


def _worker(rank: int, barrier, queue, model_name: str, reps: int, block: int) -> None:
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    from sim.schedules import one_f_one_b
    from specs.model import load_model
    from validate.alive_bench import ALIVE_DEPTHS, ALIVE_LAYERS, ALIVE_MICROBATCHES
    from validate.host_draws import stage_trainer
    model = load_model(model_name)
    order = one_f_one_b(ALIVE_DEPTHS[0], ALIVE_MICROBATCHES)[0]
    fns = {k: stage_trainer(model, ALIVE_LAYERS, ALIVE_MICROBATCHES, torch.device("cpu"), actions=order,
                            optimizer=(k == "with_adam"))[2] for k in KINDS}
    for f in fns.values():
        f()
    spans = {k: {"forward": [], "backward": [], "optimizer": []} for k in KINDS}
    barrier.wait()
    for _ in range(reps):
        for k, f in fns.items():
            f()  # right after the other stage: not kept
            for _ in range(block - 1):
                detail = f()["detail_s"]
                for s in spans[k]:
                    spans[k][s].append(detail.get(s, 0.0))
    queue.put((rank, {k: {s: statistics.median(v) for s, v in d.items()} for k, d in spans.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--block", type=int, default=4)
    args = ap.parse_args()
    from validate.alive_bench import ALIVE_MICROBATCHES
    out = run_pair(_worker, args.model, args.reps, args.block)
    print(f"{args.model}, the split draws' stage ({ALIVE_MICROBATCHES} microbatches), 2 processes at once, "
          f"{args.reps} blocks of {args.block - 1} kept steps each (ms a microbatch; Adam ms a step)")
    for rank, d in enumerate(out):
        w, wo = d["with_adam"], d["without"]
        print(f"rank {rank}: with Adam forward {w['forward'] / ALIVE_MICROBATCHES * 1e3:.3f}, backward "
              f"{w['backward'] / ALIVE_MICROBATCHES * 1e3:.3f}, Adam {w['optimizer'] * 1e3:.3f}; without forward "
              f"{wo['forward'] / ALIVE_MICROBATCHES * 1e3:.3f}, backward {wo['backward'] / ALIVE_MICROBATCHES * 1e3:.3f}; "
              f"with / without: forward {w['forward'] / wo['forward']:.3f}, backward {w['backward'] / wo['backward']:.3f}")


if __name__ == "__main__":
    main()
