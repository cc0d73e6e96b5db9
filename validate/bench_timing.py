"""The timing harness every compute microbenchmark shares: the worker's device, windows of
back-to-back calls long enough to include the scheduler's time-sharing, and interleaved
draws of several functions so that all see the same moment of the host.

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

import statistics
import time


def interleaved_drawer(torch, fns, windows: int, dsync, settle: bool = False):
    """A function that times ``fns`` in ``windows`` rounds of one window of about
    COMPUTE_WINDOW_S each, interleaved (f0, f1, .., f0, ..) so that all see the same host,
    and returns each one's median seconds per call, in order.

    ``settle``: each window follows one untimed call of its own function (f0, f0, f1, f1,
    ..), for functions that leave the process in different states, as the alive orders do
    (the deepest holds 20 MiB of tiny's activations where the shallowest holds 2): the
    call right after a switch pays for what the previous function left behind, and a
    plan never switches. Measured here (2026-12-06, two processes at once, tiny's three
    layers at 12 microbatches, medians of 12 blocks of six calls): the shallowest order
    59.1-59.9 ms right after the deepest, 56.3-57.5 ms on the calls after; the deepest
    63.0-63.9 and 62.1-63.1. Unsettled windows of one call each put the deepest order at
    1.05-1.06 x the shallowest; settled, 1.10-1.11 x, what the runner's own plans pay for
    GPipe's order over 1F1B's (tiny's dp=2 in either order: 1.06-1.18 x;
    docs/validation-cpu.md, mechanism 55). The rounds still interleave the functions: one
    block of each in turn over a whole draw let a slow second of the host put one
    depth's figure 26 % high."""
    inner = []
    for f in fns:
        f()
        t0 = time.perf_counter()
        f()
        inner.append(inner_for(time.perf_counter() - t0))

    def draw() -> list[float]:
        times = [[] for _ in fns]
        with torch.enable_grad():  # some draws are taken inside the rates' no_grad block
            for _ in range(windows):
                for i, f in enumerate(fns):
                    if settle:
                        f()  # right after the previous function: not timed
                        if dsync:
                            dsync()
                    times[i].append(median_time(f, 1, inner[i], dsync))
        return [statistics.median(t) for t in times]
    return draw


def worker_device(backend_name: str):
    """(torch device, synchronize) of this worker: its CUDA device under NCCL (asynchronous
    kernels: the clock stops only after synchronising), else the CPU (nothing to wait for)."""
    import torch
    from validate.backend import pick_backend
    from validate.launch import local_rank
    be = pick_backend(backend_name)
    dev = be.device_for(local_rank())
    if be.kind == "cuda":
        torch.cuda.set_device(dev)
        return dev, torch.cuda.synchronize
    return dev, None


def median_time(fn, repeats: int, inner: int, sync=None) -> float:
    """Median over ``repeats`` of the mean time of ``inner`` back-to-back calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


# A timed compute repeat lasts this long: many scheduler time slices (Linux EEVDF's base
# slice is 0.75 ms x (1 + log2 CPUs), kernel/sched/fair.c sysctl_sched_base_slice), so that
# the share of a core a worker gets while more processes than cores run (4 workers on 2
# cores, or other programs) is in the figure, as it is in a plan's step. Measured here with
# 4 workers on 2 cores: a 64x512x128 GEMM took 81 us per call in the median 2 ms window (one
# that no other process interrupted) and 317 us in 30 ms windows; alone, 81 us in both.
COMPUTE_WINDOW_S = 0.03


def inner_for(est_s: float, target_s: float = COMPUTE_WINDOW_S) -> int:
    """Back-to-back calls per timed repeat so that one repeat lasts about target_s."""
    return max(1, min(100_000, int(target_s / max(est_s, 1e-7))))
