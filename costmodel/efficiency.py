"""Durations of operations on one GPU: achievable efficiency applied to datasheet peaks.

GEMMs. A GEMM computing an m x n output is cut into threadblock tiles, and the GPU runs
them in waves of one tile per SM (NVIDIA, "Matrix Multiplication Background User's
Guide": tile and wave quantization). Its efficiency is

    gemm_eff_max * k / (k + gemm_k_half) * tile_and_wave_utilisation(m, n, batch)

where the k factor is the k-loop's fixed prologue/epilogue, and the utilisation is the
useful share of the tiles' work over the waves, for the best of a few common tile shapes
(``TILES``), as cuBLAS' heuristics pick one. A skinny GEMM (small n or k after
tensor-parallel slicing) thus runs well below peak, a large one near ``gemm_eff_max``.
Without ``sm_count`` (generic devices) m and n get a saturating factor d/(d + dim_half).

Every kernel is bounded below by its HBM traffic at ``hbm_eff`` of datasheet bandwidth (a
roofline: max of compute and memory time) and pays ``kernel_overhead_us`` on the GPU.
Element-wise ('memory') ops are bounded by their traffic alone unless the profile sets
``vector_flops_eff``, the share of peak their arithmetic reaches (a CPU's vector units).
A profile may give a cache level (``cache_mib``, ``cache_bw_eff``): an op whose traffic
fits it moves at that bandwidth instead (a CPU's caches; unset for GPUs).

Host side. The framework needs ``host_overhead_us`` of CPU time to issue each op. With
asynchronous launches the CPU runs ahead of the GPU, so a sequence of ops takes
max(GPU time, CPU time); with CUDA_LAUNCH_BLOCKING=1 each op waits for the previous one,
so the two add up.
"""
from __future__ import annotations

import math
from statistics import NormalDist
from dataclasses import replace
from typing import Iterable, Sequence

from costmodel.dtypes import TRAINING, optimizer_step_bytes
from costmodel.flops import Op
from costmodel.gpus import GpuSpec
from costmodel.profile import GpuEfficiency, RuntimeSettings

# Threadblock tiles (rows, cols, relative throughput per SM). 256x128 and 128x256 are the
# large Ampere/Hopper cuBLAS/CUTLASS tiles that NVIDIA's GEMM guide uses to explain wave
# quantization; 128x128 tiles re-read operands more often per FLOP (lower arithmetic
# intensity per SM), which we count as 10 % slower; 64x64 (for tiny GEMMs) as 40 % slower.
# These relative figures are modelling assumptions of the order CUTLASS's profiler shows.
TILES: tuple[tuple[int, int, float], ...] = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.9), (64, 64, 0.6))


def wave_utilisation(m: float, n: float, batch: float, sm_count: float) -> float:
    """Useful fraction of the tile waves of an m x n output (``batch`` of them), best tile."""
    best = 0.0
    for tm, tn, rel in TILES:
        tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / sm_count)
        best = max(best, rel * batch * m * n / (waves * sm_count * tm * tn))
    return best


def gemm_efficiency(m: float, n: float, k: float, eff: GpuEfficiency, batch: float = 1) -> float:
    """Fraction of dense peak a GEMM of shape (m x k) @ (k x n), ``batch`` times, reaches."""
    if m <= 0 or n <= 0 or k <= 0:
        return eff.gemm_eff_max
    f = eff.gemm_eff_max * k / (k + eff.gemm_k_half)
    if eff.sm_count > 0:
        return f * wave_utilisation(m, n, max(batch, 1), eff.sm_count)
    for d in (m, n):
        f *= d / (d + eff.gemm_dim_half)
    return f


# FlashAttention processes the s x s scores in square tiles; with a causal mask it skips
# the tiles above the diagonal and computes the diagonal ones whole (Dao 2023,
# FlashAttention-2, Sec. 3.1.1 "Causal masking": about half the blocks are skipped). The
# forward kernels of FA2 on A100 and FA3 on H100 use 128-row query tiles for head dims
# 64-128 (FA2 Sec. 3.3; Shah et al. 2024, FlashAttention-3, Sec. 4.1 block sizes).
FLASH_BLOCK = 128


def causal_fraction(s: float) -> float:
    """Share of the full s x s score FLOPs a causal fused-attention kernel computes: the
    lower triangle of (s/B)^2 tiles of side B, diagonal tiles whole: (1 + B/s) / 2."""
    if s <= FLASH_BLOCK:
        return 1.0
    return 0.5 * (1.0 + FLASH_BLOCK / s)


def fused_attention_efficiency(s: float, d: float, eff: GpuEfficiency) -> float:
    """Fraction of peak of a fused attention kernel at sequence ``s`` and head dim ``d``:
    ``attention_eff`` at long sequences and large heads, falling as
    s/(s + attention_seq_half) * d/(d + attention_head_dim_half). FlashAttention-2's A100
    speed figures (Dao 2023, Fig. 4-7: forward+backward TFLOP/s by sequence 512-16k and
    head dim 64/128) and FlashAttention-3's H100 benchmarks (Shah et al. 2024, Sec. 4.1) rise
    with both, saturating from about 2k tokens and head dim 128; the two half-points say
    where (docs/runtimes.md). Unknown shape (s or d <= 0): the long-sequence value."""
    f = eff.attention_eff
    if s > 0 and eff.attention_seq_half > 0:
        f *= s / (s + eff.attention_seq_half)
    if d > 0 and eff.attention_head_dim_half > 0:
        f *= d / (d + eff.attention_head_dim_half)
    return f


# FP8 GEMMs when a profile does not say: the same share of the FP8 peak as BF16/FP16 GEMMs
# reach of theirs at deep k, and a k-loop half point 1.75x as deep. Measured on one
# Hopper SXM chip with one kernel generator, M = N = 8192, K = 256..16384 (tilelang,
# benchmark/matmul/README.md and benchmark/matmul_fp8/README.md, NVIDIA H800 SXM, whose
# tensor cores are the H100 SXM's: 989.4 / 1,978.9 TFLOP/s dense FP16 / FP8): FP16 386 ..
# 766 TFLOP/s, FP8 569 .. 1,541. Fitting E * k/(k + h) to each (relative least squares,
# residuals within 2 %): FP16 E = 785 TFLOP/s (0.793 of peak), h = 262; FP8 E = 1,613
# (0.815 of peak), h = 458. An FP8 MMA does twice the work per k-step, so the fixed
# prologue/epilogue of a tile weighs about twice as much: FP8 needs a deeper k to fill.
# (Until 2026-12-03 session 10 the ratio was FlashAttention-3's FP8/FP16 utilisation, 0.81
# on the maximum and none on k: attention kernels, not GEMMs; NeMo 24.07's FP8 GPT-3 175B,
# Llama 2 7B/70B and Llama 3 70B on DGX H100 came out 15-28 % slow.)
FP8_EFF_RATIO = (1613.0 / 1978.9) / (785.0 / 989.4)
FP8_K_HALF_RATIO = 458.0 / 262.0
# Transformer Engine runs attention (and everything but the GEMMs of its linear layers) in
# BF16 under FP8 training (TE user guide, "Using FP8 with Transformer Engine").
_ATTENTION_PRECISION = {"fp8": "bf16"}


def fp8_native(gpu: GpuSpec, precision: str) -> bool:
    """True when ``precision`` is fp8 and the GPU has FP8 tensor cores (a datasheet fp8 peak)."""
    return precision == "fp8" and "fp8" in gpu.peak_tflops


def _gemm_eff_for(eff: GpuEfficiency, gpu: GpuSpec, precision: str) -> GpuEfficiency:
    if not fp8_native(gpu, precision):
        return eff
    fp8 = eff.gemm_eff_max_fp8 or min(1.0, FP8_EFF_RATIO * eff.gemm_eff_max)
    k_half = eff.gemm_k_half_fp8 or FP8_K_HALF_RATIO * eff.gemm_k_half
    return _with_gemm(eff, fp8, k_half)


_EFF_CACHE: dict[tuple[GpuEfficiency, float, float], GpuEfficiency] = {}


def _with_gemm(eff: GpuEfficiency, e_max: float, k_half: float) -> GpuEfficiency:
    key = (eff, e_max, k_half)
    got = _EFF_CACHE.get(key)
    if got is None:
        got = _EFF_CACHE[key] = replace(eff, gemm_eff_max=e_max, gemm_k_half=k_half)
    return got


def memory_eff(nbytes: float, eff: GpuEfficiency) -> float:
    """The share of datasheet bandwidth an op moving ``nbytes`` reaches: cache_bw_eff where
    the profile has a cache level and the traffic fits it, hbm_eff otherwise."""
    if eff.cache_bw_eff > 0 and nbytes <= eff.cache_mib * 2**20:
        return eff.cache_bw_eff
    return eff.hbm_eff


def op_time_s(op: Op, gpu: GpuSpec, eff: GpuEfficiency, precision: str) -> float:
    """GPU seconds for one operation: max(compute time, memory time) + kernel overhead.
    'gemm' ops run at the precision's peak (FP8 GEMMs at the fp8 peak and efficiency);
    'attention' ops are the batched matmuls of core attention (batch = microbatch x heads)
    and 'flash_attention' a fused attention kernel (m = s, k = head dim), both in BF16 under
    FP8 training."""
    mem_t = op.bytes / (gpu.mem_bw_Bps * memory_eff(op.bytes, eff))
    if op.kind == "gemm":
        e = _gemm_eff_for(eff, gpu, precision)
        comp_t = op.flops / (gpu.peak_flops(precision) * gemm_efficiency(op.m, op.n, op.k, e, op.batch))
    elif op.kind == "attention":
        prec = _ATTENTION_PRECISION.get(precision, precision)
        comp_t = op.flops / (gpu.peak_flops(prec) * gemm_efficiency(op.m, op.n, op.k, eff, op.batch))
    elif op.kind == "flash_attention":
        prec = _ATTENTION_PRECISION.get(precision, precision)
        comp_t = op.flops / (gpu.peak_flops(prec) * fused_attention_efficiency(op.m, op.k, eff))
    elif eff.vector_flops_eff > 0:
        comp_t = op.flops / (gpu.peak_flops(precision) * eff.vector_flops_eff)
    else:
        comp_t = 0.0
    return max(comp_t, mem_t) + eff.kernel_overhead_us * 1e-6


# ----------------------------------------------------------------- framework transforms
_SCORE_OPS = {"softmax", "attn_dropout", "softmax_bwd", "attn_dropout_bwd"}


def _fuse_dropout_add(ops: Sequence[Op]) -> list[Op]:
    """Megatron's bias-dropout-add kernel: a 'dropout' op followed by its 'residual' add
    become one kernel that reads the branch output and the residual and writes the sum and
    the mask (the dropout output is never written): dropout bytes + residual bytes minus
    one write and one read of the intermediate."""
    out: list[Op] = []
    i = 0
    while i < len(ops):
        a = ops[i]
        b = ops[i + 1] if i + 1 < len(ops) else None
        if b is not None and a.name == "dropout" and b.name == "residual" and b.bytes > 0:
            elem_bytes = b.bytes / 3  # residual: read two, write one, e bytes per element
            out.append(Op("bias_dropout_add", "memory", a.flops + b.flops, a.bytes + b.bytes - 2 * elem_bytes))
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _flash(ops: Sequence[Op]) -> list[Op]:
    """Fused (flash) attention: the s x s scores never reach HBM. The core-attention ops of
    one pass become one kernel with their matmul FLOPs and only Q, K, V, O traffic; its
    backward recomputes QK^T (FlashAttention: 5 matmuls backward vs 2 forward). The model
    is a causal decoder, so the kernel computes only ``causal_fraction(s)`` of those FLOPs;
    the op keeps m = s and k = head dim for the kernel's efficiency."""
    out: list[Op] = []
    group: list[Op] = []

    def flush():
        if not group:
            return
        mm = [o for o in group if o.kind == "attention"]
        flops = sum(o.flops for o in mm)
        backward = any(o.name.endswith(("_dq", "_dk", "_dp", "_dv")) for o in mm)
        if backward:
            flops *= 5 / 4
        s_len, d_head, batch = mm[0].m, mm[0].k, mm[0].batch
        flops *= causal_fraction(s_len)
        # Q, K, V and O (and their gradients backward) stream once: each matmul's bytes
        # less its s x s operand (scores x e bytes: the softmax reads and writes them once
        # forward, 2 x; its backward reads two and writes one, 3 x).
        score_e = 0.0
        for o in group:
            if o.name == "softmax":
                score_e = o.bytes / 2
            elif o.name == "softmax_bwd":
                score_e = o.bytes / 3
        io = sum(max(o.bytes - score_e, 0.0) for o in mm)
        out.append(Op("flash_attention_bwd" if backward else "flash_attention", "flash_attention", flops, io,
                      s_len, s_len, d_head, batch))
        group.clear()

    for o in ops:
        if o.kind == "attention" or o.name in _SCORE_OPS:
            group.append(o)
        else:
            flush()
            out.append(o)
    flush()
    return out


def transform_ops(ops: Sequence[Op], runtime: RuntimeSettings | None) -> list[Op]:
    """The ops a framework really launches for the cost model's op list."""
    if runtime is None:
        return list(ops)
    out = list(ops)
    if runtime.fused_bias_dropout_add:
        out = _fuse_dropout_add(out)
    if runtime.flash_attention:
        out = _flash(out)
    return out


# Transformer Engine casts each FP8 GEMM's activation operand from BF16 in a fused
# cast-transpose kernel that also records the tensor's amax for the delayed scaling
# recipe (TE user guide, "Using FP8 with Transformer Engine": FP8 tensors carry a scaling
# factor from the amax history; Hopper's FP8 GEMMs take both operand layouts, so the
# kernel writes the FP8 tensor and its transpose). Per GEMM: read 2 B, write 1 + 1 B per
# element of its m x k input. Weights are cast once per step and cached across
# microbatches (TE's is_first_microbatch), not per microbatch; the amax-history update is
# one small kernel per step. Neither is counted per microbatch.
FP8_CAST_BYTES_PER_ELEM = 2.0 + 1.0 + 1.0


def fp8_cast_ops(ops: Sequence[Op]) -> list[Op]:
    """``ops`` with an FP8 cast(-transpose) kernel before every GEMM (see above)."""
    out: list[Op] = []
    for o in ops:
        if o.kind == "gemm":
            elems = float(o.m) * o.k * o.batch
            out.append(Op(f"{o.name}_fp8_cast", "memory", 0.0, elems * FP8_CAST_BYTES_PER_ELEM))
        out.append(o)
    return out


def host_time_s(n_ops: int, runtime: RuntimeSettings | None) -> float:
    return 0.0 if runtime is None else n_ops * runtime.host_overhead_us * 1e-6


def ops_time_s(ops: Iterable[Op], gpu: GpuSpec, eff: GpuEfficiency, precision: str,
               runtime: RuntimeSettings | None = None, extra_host_s: float = 0.0) -> float:
    """Seconds for a sequence of ops: GPU time, combined with the CPU time to issue them
    (max of the two with asynchronous launches, their sum with launch blocking).
    ``extra_host_s``: host time the framework spends around them besides the per-op cost
    (a checkpointed region's, RuntimeSettings.checkpoint_region_s)."""
    ops = transform_ops(list(ops), runtime)
    if fp8_native(gpu, precision):
        ops = fp8_cast_ops(ops)
    gpu_t = sum(op_time_s(op, gpu, eff, precision) for op in ops)
    host_t = host_time_s(len(ops), runtime) + (extra_host_s if runtime is not None else 0.0)
    if runtime is not None and runtime.launch_blocking:
        return gpu_t + host_t
    return max(gpu_t, host_t)


# Optimizer step, HBM bytes moved per parameter held, derived from the precision's dtypes
# (costmodel/dtypes.py, optimizer_step_bytes: fp16 54, bf16 and fp8 42, fp32 36).
OPTIMIZER_BYTES_PER_PARAM = {p: optimizer_step_bytes(p) for p in TRAINING}
# Fused multi-tensor kernels per step: grad copy, unscale, norm, Adam, weight copy, zero.
OPTIMIZER_KERNELS = 6


# Adam as eager in-place element-wise ops on fp32 tensors (validate/dp.adam_update, runtime
# eager_adam), bytes per parameter counted by hand, each operand read once and each result
# written once: m*=b1 (8), m+=(1-b1)g (12), v*=b2 (8), v+=(1-b2)g*g (16),
# d=max(v, FLT_MIN) (8), d=sqrt(d) (8), d/=sqrt(1-b2^t) (8), d+=eps (8),
# p-=lr/(1-b1^t) m/d (16): 92 B, 9 ops. The clamp keeps the root's cost independent of the
# data (CPU sqrt is 16x slower over zeros; validate/dp.adam_update says why).
EAGER_ADAM_BYTES = (8.0, 12.0, 8.0, 16.0, 8.0, 8.0, 8.0, 8.0, 16.0)


def optimizer_time_s(params: float, gpu: GpuSpec, eff: GpuEfficiency, precision: str = "bf16",
                     runtime: RuntimeSettings | None = None) -> float:
    """The optimizer step is memory bound: a few fused kernels streaming the state (or,
    with runtime.eager_adam, nine element-wise ops each paying its issue cost)."""
    if params <= 0:
        return 0.0
    # measured over priced where a calibration timed the runner's own (RuntimeSettings.optimizer_scale)
    scale = runtime.optimizer_scale if runtime is not None else 1.0
    if runtime is not None and runtime.eager_adam:
        ops = [Op(f"adam_{i}", "memory", 0.0, params * b) for i, b in enumerate(EAGER_ADAM_BYTES)]
        return scale * ops_time_s(ops, gpu, eff, "fp32", runtime)
    per_param = OPTIMIZER_BYTES_PER_PARAM.get(precision, OPTIMIZER_BYTES_PER_PARAM["bf16"])
    return scale * (params * per_param / (gpu.mem_bw_Bps * eff.hbm_eff)
                    + OPTIMIZER_KERNELS * eff.kernel_overhead_us * 1e-6)


# Top-k with error feedback, bytes moved per fp32 gradient element on the sender:
# add the residual (read grad + residual, write sum: 12 B), select the top k (a radix
# select reads the buffer about twice: 8 B), write back the new residual (8 B).
TOPK_COMPRESS_BYTES_PER_ELEM = 28.0


def expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normal draws] by Blom's approximation
    Phi^-1((n - 0.375) / (n + 0.25)) (G. Blom, "Statistical Estimates and Transformed
    Beta-Variables", 1958): 0 for n = 1; 0.589 for n = 2 (exact: 1/sqrt(pi) = 0.564),
    1.049 for 4 (exact 1.029), 1.434 for 8 (exact 1.424): within 5 %."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def topk_compress_time_s(elements: float, gpu: GpuSpec, eff: GpuEfficiency, group: int = 1,
                         kept: float = 0.0) -> float:
    """Error feedback plus top-k selection of one bucket keeping ``kept`` entries: its
    memory traffic, the selection's compute where the profile has one
    (topk_select_ns_per_elem per element, topk_select_ns_per_kept per kept entry), 3 kernels.

    The selection's time depends on the data (a CPU's partial sort: measured here, one
    bucket of 867k elements took 4-16 ms from step to step on the same rank), and the
    sparse all-gather that follows starts when the slowest of the ``group`` ranks has
    selected. With a coefficient of variation ``topk_select_cv`` per selection, the group
    waits the expected maximum of ``group`` draws: mean x (1 + cv x E[max of group
    standard normals]). GPU radix selects (cv 0) take the same time on every rank."""
    select_s = (elements * eff.topk_select_ns_per_elem + kept * eff.topk_select_ns_per_kept) * 1e-9
    if eff.topk_select_cv:
        select_s *= 1.0 + eff.topk_select_cv * expected_max_std_normal(group)
    return (elements * TOPK_COMPRESS_BYTES_PER_ELEM / (gpu.mem_bw_Bps * eff.hbm_eff)
            + select_s + 3 * eff.kernel_overhead_us * 1e-6)


def topk_decompress_time_s(elements: float, received_entries: float, bytes_per_entry: float,
                           gpu: GpuSpec, eff: GpuEfficiency) -> float:
    """Zero the dense buffer (4 B/elem) and scatter-add every gathered (index, value) pair
    (read the pair, read-modify-write one fp32 element: bytes_per_entry + 8 B). The
    all-gather hands every rank all ``group`` ranks' pairs, its own included, and all of
    them are added (validate/topk.TopKCompressor.finish): received_entries = group x k."""
    moved = elements * 4.0 + received_entries * (bytes_per_entry + 8.0)
    return moved / (gpu.mem_bw_Bps * eff.hbm_eff) + 2 * eff.kernel_overhead_us * 1e-6
