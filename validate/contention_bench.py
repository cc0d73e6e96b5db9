"""Collectives as a plan's ranks meet them beside compute, timed by calibration's collective
workers (validate/collective_bench.collective_worker runs these rows): the cost a call adds
right after the runner's layer code (after_compute_rows), the extra wait of a collective
closing a long compute phase (straggler_row), and the CPU a stream of small collectives
keeps busy (busy_fraction_row). The compute between calls is sized per rank to a time
(units_in_gap, gap_gemms, gap_layers) and agreed over the ranks. torch is imported inside
the functions only.
"""
from __future__ import annotations

import statistics
import time

from validate.collective_bench import AFTER_COMPUTE_SUFFIX, CollectiveConfig, collective_call


BUSY_OP = "busy_fraction"  # the row's op; its 'seconds' field holds the fraction
BUSY_BYTES = 32 * 1024  # a tensor-parallel activation of a small model


def busy_fraction_row(cfg: CollectiveConfig, n: int, group, first: int, nxt: int, prv: int, dev, world: int) -> list:
    """[BUSY_OP, n, BUSY_BYTES, fraction]: the CPU time the processes spend per second of
    wall time while they run a stream of small all-reduces back to back in groups of n
    (getrusage of the whole process, its communication threads included; mean over the
    ranks that ran it). A process waiting in a collective over gloo's TCP transport is not
    idle: the kernel copies its messages and its threads wake and poll. sim/core_sharing.py
    counts that share of a wait as occupying a core (runtime.comm_busy_fraction). Only as
    many groups run as the host has cores for (the others wait at a barrier): with more
    processes than cores each would get a share of a core at most, and the figure would
    measure the scheduler, not the transport (measured here: 0.6-0.7 with 2 processes on 2
    cores; 0.41-0.57 with 4 processes all running)."""
    import resource

    import torch
    import torch.distributed as dist

    from validate.microbench import host_cores

    def cpu_s():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    active_groups = world // n if cfg.backend == "nccl" else max(1, host_cores() // n)
    active = first // n < active_groups
    frac = torch.zeros(2, dtype=torch.float64, device=dev)  # NCCL reduces device tensors only
    if active:
        call = collective_call("all_reduce", BUSY_BYTES // 4 // n * n, n, group, first, nxt, prv, dev)
        for _ in range(10):
            call()
        c0, t0 = cpu_s(), time.perf_counter()
        for _ in range(cfg.busy_calls):
            call()
        frac[0], frac[1] = (cpu_s() - c0) / max(time.perf_counter() - t0, 1e-9), 1.0
    dist.barrier()
    dist.all_reduce(frac)
    return [BUSY_OP, n, BUSY_BYTES, float(frac[0] / frac[1])]


def units_in_gap(unit, gap_s: float, dev, dsync) -> int:
    """How many calls of ``unit`` (a no-argument function) take about ``gap_s`` on this
    rank (timed over 20 after 3 unmeasured), the smallest count over all ranks so that
    every rank computes the same amount."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        unit()
    t0 = time.perf_counter()
    for _ in range(20):
        unit()
    if dsync:
        dsync()
    per = (time.perf_counter() - t0) / 20
    count = torch.tensor([max(1, int(gap_s / max(per, 1e-7)))], dtype=torch.float64, device=dev)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    return int(count[0])


def gap_gemms(gap_s: float, dev, dsync):
    """(a, w, k): operands of a layer-shaped GEMM (64 tokens, 512 -> 128) and the number k
    of them that takes about ``gap_s`` (units_in_gap)."""
    import torch

    a, w = torch.randn(64, 512, device=dev), torch.randn(128, 512, device=dev)
    return a, w, units_in_gap(lambda: torch.nn.functional.linear(a, w), gap_s, dev, dsync)


# In a plan every collective follows compute: the ranks' main threads were busy on the
# cores a moment before, so the threads that carry the collective (gloo's worker and TCP
# loop threads; kernel and proxy threads elsewhere) are woken while cores may still be
# computing, and on a host whose cores all compute a woken thread can wait for the running
# one's time slice (Linux EEVDF runs the current task to its slice before a waking one,
# the RUN_TO_PARITY feature, kernel/sched/features.h). Back-to-back calls never meet that.
AFTER_COMPUTE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")




def gap_layers(gap_s: float, dev, dsync):
    """A no-argument function running about ``gap_s`` of the runner's own layer code (the
    width-8 GPT's forward, validate/host_draws.chain_functions: embedding, layer norms,
    attention, MLP, logits; dozens of small ops), the same number of forwards on every
    rank (units_in_gap)."""
    import torch

    from validate.host_draws import chain_functions
    plain, _ = chain_functions(torch, dev)
    j = units_in_gap(plain, gap_s, dev, dsync)

    def run():
        for _ in range(j):
            plain()
    return run


def after_compute_rows(cfg: CollectiveConfig, n: int, group, first: int, nxt: int, prv: int, dev, dsync) -> list:
    """[op + '_after_compute', n, nbytes, seconds] for AFTER_COMPUTE_OPS at each size: the
    cost one call adds to a stream of (compute, call) iterations, as a plan's rank pays it.

    Every rank first times ``after_compute_calls`` rounds of about cfg.compute_gap_s of
    the runner's layer code alone (gap_layers), then as many rounds of the same compute
    each followed by the collective; the call's cost is the difference of the two mean
    round times, the slowest rank's. The compute is a layer's small ops, as between a
    plan's collectives, not GEMMs: small ops pay more for what a call's threads did to the
    caches and the core (measured here, a 32 KiB 2-rank all-reduce added 1.53 ms to rounds
    of the width-8 GPT's forward, mean of six, against 1.39 ms to rounds of GEMMs of the
    same length).
    A plan's step is the sum of its calls, so the figure is a mean over a long stream, not
    a median: on a host whose cores time-share (a guest that halts idle vCPUs, a scheduler
    tick of a few ms) a fraction of calls wait a whole tick for a woken thread, and those
    calls are most of the mean (measured here: 32 KiB 2-rank all-reduce after 0.9 ms of
    GEMMs, median 1.2 ms, mean 1.7-1.9 ms). Measuring the whole round also counts what a
    call does to the compute around it (a peer's late start, a descheduled main thread),
    which a per-call timer misses.

    A stream has cfg.after_compute_calls rounds, or fewer where its rounds are long (groups
    of 4 processes on 2 cores: 10-20 ms a round here on 2026-12-03, against 2-4 ms for a
    pair), so that it lasts about cfg.after_compute_stream_s, never fewer than
    cfg.after_compute_min_calls rounds: those streams were 60 % of a 4-process calibration's
    after-compute launches (24 of 41 s), and what they fit (the per-rank call cost, a few
    bucket all-reduces a step for dp=4) needs no more draws than a pair's 32 KiB calls do,
    whose rounds stay at 100. The round count comes from 3 timed rounds, the fewest any
    group asked for."""
    import torch
    import torch.distributed as dist

    compute = gap_layers(cfg.compute_gap_s, dev, dsync)
    mx = torch.zeros(1, dtype=torch.float64, device=dev)
    agreed = torch.zeros(1, dtype=torch.float64, device=dev)

    def mean_round(call, calls: int) -> float:
        """The slowest rank's mean time of one round (the layers, then ``call``)."""
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            compute()
            call()
        if dsync:
            dsync()
        mx[0] = (time.perf_counter() - t0) / calls
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=group)
        return float(mx[0])

    rows = []
    for op in cfg.after_compute_ops or AFTER_COMPUTE_OPS:
        for nbytes in cfg.after_compute_sizes:
            count = nbytes // 4 // n * n
            call = collective_call(op, count, n, group, first, nxt, prv, dev)
            call()
            agreed[0] = stream_calls(mean_round(call, 3), cfg)
            # Every group runs as many rounds (the fewest any asked for), so that no group
            # ends its stream early and times the rest of another's on freer cores.
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            calls = int(agreed[0])
            alone = mean_round(lambda: None, calls)
            with_call = mean_round(call, calls)
            rows.append([op + AFTER_COMPUTE_SUFFIX, n, count * 4, max(with_call - alone, 1e-7)])
    return rows


def stream_calls(round_s: float, cfg: CollectiveConfig) -> int:
    """Rounds of an after-compute stream whose rounds (compute and call) take ``round_s``:
    cfg.after_compute_calls, or as many as fill cfg.after_compute_stream_s when that is
    fewer, never fewer than cfg.after_compute_min_calls."""
    if round_s <= 0:
        return cfg.after_compute_calls
    fill = int(cfg.after_compute_stream_s / round_s)
    return max(min(cfg.after_compute_min_calls, cfg.after_compute_calls), min(cfg.after_compute_calls, fill))


STRAGGLER_OP = "straggler"  # the row's op; its 'seconds' field holds the extra wait
STRAGGLER_BYTES = 32 * 1024
STRAGGLER_ROUNDS = 50  # a long compute phase: this many rounds of compute_gap_s (about 50 ms)


def straggler_row(cfg: CollectiveConfig, n: int, group, dev, dsync, world: int) -> list:
    """[STRAGGLER_OP, n, STRAGGLER_BYTES, seconds]: how much longer a collective waits when
    it ends a long compute phase (STRAGGLER_ROUNDS rounds of about cfg.compute_gap_s of
    GEMMs, as a backward pass is) than when it follows one such round, in groups of n
    (world/n groups at once); the mean over ranks and cfg.straggler_reps phases, less the
    mean over as many short rounds, never below 0.

    Where processes share cores (more processes than cores, a time-sliced guest), ranks
    given the same work drift apart over a long phase, by up to a scheduler slice or so
    (the scheduler is fair over its period, not within it), and the collective that
    closes the phase waits for the last; after a short round they are still in step.
    Measured here (gloo, 2026-11-30, 32 KiB all-reduce, mean of 3 launches, four
    calibrations): 1.1-1.4 ms with 2 processes on 2 cores; 6.4-9.9 ms with 4.
    sim/gradient_reducer.py adds it to the gradient reduction that closes each backward
    (runtime.straggler_us)."""
    import torch
    import torch.distributed as dist

    a, w, k = gap_gemms(cfg.compute_gap_s, dev, dsync)
    buf = torch.ones(STRAGGLER_BYTES // 4 // n * n, device=dev)

    def waits(rounds: int, reps: int) -> float:
        got = []
        for i in range(reps + 1):
            for _ in range(rounds):
                for _ in range(k):
                    torch.nn.functional.linear(a, w)
            if dsync:
                dsync()
            t = time.perf_counter()
            dist.all_reduce(buf, group=group)
            if dsync:  # NCCL returns once the call is queued; the wait ends when the device has run it
                dsync()
            if i:  # the first phase warms up
                got.append(time.perf_counter() - t)
        return statistics.fmean(got)
    dist.barrier()
    short = waits(1, 4 * STRAGGLER_ROUNDS)
    dist.barrier()
    long = waits(STRAGGLER_ROUNDS, cfg.straggler_reps)
    extra = torch.tensor([long - short], dtype=torch.float64, device=dev)
    dist.all_reduce(extra)
    return [STRAGGLER_OP, n, STRAGGLER_BYTES, max(0.0, float(extra[0]) / world)]
