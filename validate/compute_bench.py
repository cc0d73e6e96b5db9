"""The compute microbenchmarks as one worker process runs them (validate/microbench.py
starts the workers and turns what they return into samples): GEMMs, memory-bound ops,
fused attention, top-k selection in an error-feedback stream, each family's smallest call
through the same timing harness (bench_timing.py), the speed probe, and the draws of the
runner's host costs (host_draws.py) and of the alive stage (alive_bench.py) spread over
the worker.

torch is imported inside the functions only: this module imports without it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from costmodel.shapes import ModelSpec
from validate.alive_bench import alive_drawer, split_drawer
from validate.bench_timing import inner_for, median_time, worker_device
from validate.collective_bench import MIB
from validate.host_draws import chain_drawer, fsdp_drawer, microbatch_drawer, recompute_drawer
from validate.microbench import MEMORY_OPS, WORKER_CHAIN_DRAWS, memory_op_bytes


# Operand bytes the GEMM benchmark cycles through: above a current x86 core's L2 cache
# (1-2 MiB), so weights arrive from L3 or DRAM as in a training step.
GEMM_POOL_BYTES = 8 * MIB


def _cycling(sets: int, call):
    """A no-argument function that calls call(j) for j = 0, 1, .., sets-1, 0, .. in turn."""
    state = [0]

    def f():
        j = state[0]
        state[0] = (j + 1) % sets
        return call(j)
    return f


# A CUDA device's own time per tiny kernel (device_kernel_s): this many element-wise adds on
# one element, queued behind a device-side sleep of DEVICE_SLEEP_CYCLES clock cycles (about
# 50 ms at an H100's 1.98 GHz boost clock, NVIDIA H100 datasheet), far longer than the host
# takes to queue them (a few microseconds each), so the device runs them back to back.
DEVICE_KERNELS = 400
DEVICE_SLEEP_CYCLES = 100_000_000
DEVICE_KERNEL_REPEATS = 5


def device_kernel_s(torch, dev) -> float:
    """Seconds one tiny kernel takes on a CUDA device itself, back to back (between two
    CUDA events around DEVICE_KERNELS adds queued behind torch.cuda._sleep), median of
    DEVICE_KERNEL_REPEATS after one unmeasured. The runner's per-op host cost (the overhead
    chain) is the host's: on a GPU the host queues kernels asynchronously and the device
    runs each in about this long, so the cost model prices an op at the longer of the two
    sums (costmodel/efficiency.ops_time_s), with this as the device's per-kernel overhead
    (calibrate.per_op_overheads)."""
    import statistics
    x = torch.zeros(1, device=dev)
    times = []
    for i in range(DEVICE_KERNEL_REPEATS + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        torch.cuda._sleep(DEVICE_SLEEP_CYCLES)
        start.record()
        for _ in range(DEVICE_KERNELS):
            x.add_(1.0)
        end.record()
        end.synchronize()
        if i:
            times.append(start.elapsed_time(end) * 1e-3 / DEVICE_KERNELS)  # elapsed_time: milliseconds
    return statistics.median(times)


@dataclass(frozen=True)
class ComputeConfig:
    gemm_shapes: tuple
    mem_sizes: tuple
    attn_shapes: tuple = ()
    topk: tuple = ()  # (elements, fraction) pairs
    repeats: int = 5
    threads: int = 0  # intra-op threads; 0 keeps what the worker started with
    backend: str = "gloo"
    alive_model: ModelSpec | None = None  # time its layers against the activations held (alive_drawer); None: not


def compute_worker(rank: int, world: int, cfg: ComputeConfig) -> dict:
    """One rank's compute microbenchmarks (a)-(c); every rank runs the same list at the
    same time, meeting at a barrier before each item so that they overlap."""
    import torch
    import torch.distributed as dist

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(rank)
    dev, dsync = worker_device(cfg.backend)
    sync = dist.barrier if dist.is_initialized() and world > 1 else (lambda: None)

    def timed(f):
        f()
        if dsync:
            dsync()
        t0 = time.perf_counter()
        f()
        if dsync:
            dsync()
        inner = inner_for(time.perf_counter() - t0)
        sync()
        return median_time(f, cfg.repeats, inner, dsync)

    # (c) the overhead chain (CHAIN_MODEL), drawn several times over the worker (chain_drawer).
    draw = chain_drawer(torch, dev, dsync, cfg.repeats)
    draws = []
    rdraw = recompute_drawer(torch, dev, dsync, cfg.repeats)
    rdraws = []
    fdraw = fsdp_drawer(torch, dev, dsync, cfg.repeats)
    fdraws = []
    adraw = alive_drawer(torch, dev, dsync, cfg.repeats, cfg.alive_model) if cfg.alive_model is not None else None
    adraws = []
    sdraw = split_drawer(torch, dev, cfg.repeats, cfg.alive_model) if cfg.alive_model is not None else None
    sdraws = []
    mdraw = microbatch_drawer(torch, dev, dsync, cfg.repeats)
    mdraws = []

    def chain_draw(with_regions: bool = False, with_stage: bool = False):
        sync()
        draws.append(draw())
        if with_regions:  # checkpoint regions, FSDP units, microbatches: twice per worker (after the memory ops and at the end)
            sync()
            rdraws.append(rdraw())
            sync()
            fdraws.append(fdraw())
            sync()
            mdraws.append(mdraw())
        if with_stage and adraw is not None:
            # The alive stage and its split, once per worker (after the memory ops; twice
            # until session 31): 5.5 s and 1.5 s a draw in 2 processes here, a third of
            # the worker's time. A second draw bought nothing measurable: the 34 saved
            # runs of sessions 26-30 refitted with each worker's first alive draw only met
            # the six in 17 of 34, as with both (docs/validation-cpu.md mechanism 60).
            sync()
            adraws.append(adraw())
            sync()
            sdraws.append(sdraw())

    out = {"gemm": [], "memory": [], "attention": [], "topk": [], "harness": []}
    # The speed probe (validate/probe.py), every rank at once, first: the runner probes its
    # ranks fresh, before their steps, and a process that has computed for a while probes
    # slower (here, 2026-12-02, two calibrations of 2 processes: 8.5-8.9 ms at the start of
    # this worker, 9.0-9.2 ms after its GEMM, memory, attention and top-k benchmarks, where
    # the probe used to be taken; that 2-7 % went straight into the drift factor and put
    # every plan's compute that much low).
    from validate.probe import probe_s
    sync()
    out["probe"] = probe_s(dev, dsync)
    out["device_kernel"] = device_kernel_s(torch, dev) if dev.type == "cuda" else 0.0
    with torch.no_grad():
        # Each family's smallest call through the same timing harness: what a call costs
        # besides its work here (dispatch, the harness's Python), which the fits take out
        # of the samples before fitting rates (validate/calibrate.py). It is less than the
        # runner's per-op cost (the chain below), whose model code runs between its ops.
        one = [torch.ones(1, 1, device=dev) for _ in range(2)]
        out["harness"].append(["gemm", timed(_cycling(2, lambda j: torch.nn.functional.linear(one[j], one[1 - j])))])
        out["harness"].append(["bmm", timed(_cycling(2, lambda j: torch.bmm(one[j][None], one[1 - j][None])))])
        g1, b1 = torch.ones(1, device=dev), torch.zeros(1, device=dev)
        for op, f in (("add", lambda: torch.add(one[0], one[1])), ("gelu", lambda: torch.nn.functional.gelu(one[0])),
                      ("layernorm", lambda: torch.nn.functional.layer_norm(one[0], (1,), g1, b1)),
                      ("softmax", lambda: torch.softmax(one[0], -1))):
            out["harness"].append([f"memory:{op}", timed(f)])
        q1 = torch.ones(1, 1, 1, 1, device=dev)
        out["harness"].append(["attention", timed(lambda: torch.nn.functional.scaled_dot_product_attention(
            q1, q1, q1, is_causal=True))])
        for (m, n, k, b) in cfg.gemm_shapes:
            # As the runner calls them (validate/gpt.py: F.linear, weight [n, k]), cycling
            # through operand sets larger than a core's L2 cache together: a training step's
            # weights come from beyond it (tiny's are 3.5 MB), not from a hot L1. Measured
            # here, 64x512x128: 82 us with one hot torch.mm operand pair, 95 us this way.
            sets = max(1, min(64, math.ceil(GEMM_POOL_BYTES / (4.0 * b * (m * k + k * n)))))
            a = [torch.randn(b, m, k, device=dev) if b > 1 else torch.randn(m, k, device=dev) for _ in range(sets)]
            w = [torch.randn(b, k, n, device=dev) if b > 1 else torch.randn(n, k, device=dev) for _ in range(sets)]
            f = _cycling(sets, (lambda j: torch.bmm(a[j], w[j])) if b > 1
                         else (lambda j: torch.nn.functional.linear(a[j], w[j])))
            out["gemm"].append([m, n, k, b, timed(f)])
        chain_draw()
        for op in MEMORY_OPS:
            for elems in cfg.mem_sizes:
                row = 128 if elems % 128 == 0 else 1
                x = torch.randn(elems // row, row, device=dev)
                y = torch.randn(elems // row, row, device=dev)
                g, bta = torch.ones(row, device=dev), torch.zeros(row, device=dev)
                f = {
                    "add": lambda: torch.add(x, y),
                    "gelu": lambda: torch.nn.functional.gelu(x),
                    "layernorm": lambda: torch.nn.functional.layer_norm(x, (row,), g, bta),
                    "softmax": lambda: torch.softmax(x, -1),
                }[op]
                out["memory"].append([op, elems, memory_op_bytes(op, elems, 4, row), timed(f)])
        chain_draw(with_regions=True, with_stage=True)
        for (bh, sq, d) in cfg.attn_shapes:
            q, k, v = (torch.randn(1, bh, sq, d, device=dev) for _ in range(3))
            f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
            out["attention"].append([bh, sq, d, timed(f)])
        from validate.topk import SelectBuffers, select
        gap = gemm_gap(torch, dev) if cfg.topk else None
        for (elems, frac) in cfg.topk:
            # A stream of selections as error feedback makes them (each step's fresh
            # gradient plus the residual the previous selection left), every rank at once
            # after a barrier, as a plan's replicas select: the time depends on the data
            # (one fixed random bucket misses that spread), so each selection is kept.
            # Between two selections a step computes (the backward whose last layers
            # fill the bucket, the optimizer, the next forward): each selection here
            # follows TOPK_GAP_S of GEMMs, as in a step, not the previous selection.
            grads = [torch.randn(elems, device=dev) for _ in range(TOPK_STREAM_GRADS)]
            k = max(1, math.ceil(frac * elems))
            residual, times, bufs = None, [], SelectBuffers.like(grads[0], k)
            for i in range(TOPK_STREAM_WARMUP + TOPK_STREAM_STEPS):
                gap()
                if dsync:
                    dsync()
                sync()
                t0 = time.perf_counter()
                _, _, residual = select(grads[i % len(grads)], residual, k, bufs)
                if dsync:
                    dsync()
                if i >= TOPK_STREAM_WARMUP:
                    times.append(time.perf_counter() - t0)
            out["topk"].append([elems, frac, times])
        chain_draw()
    chain_draw(with_regions=True)
    # Four draws (after the GEMMs, the memory ops, attention and top-k, and once more at
    # the end), [plain s, train s] each; validate/microbench.py takes each draw's median
    # over the ranks and the figure's median over the draws: one draw moved with the host
    # (4 calibrations of 2026-12-03: kernel_overhead_us 17.5-22.7, host_overhead_us
    # 7.2-14.5 at 2 processes, the plans' predicted dp=2 step 120-145 ms against 125-138
    # measured, the two moving together), where the probe's median of nine was steady.
    # Each collective launch adds one more (microbench._pool_overhead_draws).
    assert len(draws) == WORKER_CHAIN_DRAWS  # what --compute-from reuses (microbench.reused_compute)
    out["overhead_draws"] = draws
    out["recompute_draws"] = rdraws  # [none s, full s, selective s] per draw (recompute_drawer)
    out["fsdp_draws"] = fdraws  # [plain s, zero=3 s] per FSDP_MODELS model, per draw (fsdp_drawer)
    out["alive_draws"] = adraws  # [s at each of ALIVE_DEPTHS] per draw (alive_drawer); [] when not measured
    out["split_draws"] = sdraws  # [forward s, backward s] a microbatch, [optimizer s] a step, per draw (split_drawer); [] when not measured
    out["microbatch_draws"] = mdraws  # [s, s] at MICROBATCH_SHAPES per draw (microbatch_drawer)
    return out


# The top-k selection stream (compute_worker): error-feedback steps before timing (the
# residual builds up), timed steps, and distinct fresh gradients cycled through.
TOPK_STREAM_WARMUP = 2
TOPK_STREAM_STEPS = 12
TOPK_STREAM_GRADS = 4
# Seconds of GEMMs ([256, 1024] x [1024, 1024] fp32) before each selection of the stream.
# Back to back, a selection finds its residual and magnitude buffers where the last one
# left them; in a step they were last touched a whole step earlier. Measured here
# (2026-12-06, benchmarks/topk_gap.py: two processes selecting 867,072 elements x 0.1 at
# once, medians of 16): back to back 8.5-9.1 ms; after 5 ms of GEMMs 9.7-10.0; after 20
# or 40 ms 10.9-12.2; after a 20 ms sleep 12.3-12.4 (so it is the time since the buffers
# were used, not the GEMMs' cache traffic). The runner's own selections in the session-24
# validation runs (tiny dp=2 top-k:0.1, the same bucket) took 10.4-11.1 ms a step where
# this stream, back to back, had measured 7.9-9.8 in the same runs. 20 ms: about where the
# slowdown stopped growing (docs/validation-cpu.md, mechanism 56).
TOPK_GAP_S = 0.020
TOPK_GAP_GEMM = (256, 1024, 1024)  # m, k, n


def gemm_gap(torch, dev, seconds: float = TOPK_GAP_S):
    """A function that computes TOPK_GAP_GEMM GEMMs on ``dev`` for ``seconds`` (issue time:
    the caller syncs a device)."""
    m, k, n = TOPK_GAP_GEMM
    a, w = torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)

    def gap():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, w)
    return gap
