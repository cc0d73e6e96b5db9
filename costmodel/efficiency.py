"""Durations of operations on one GPU: achievable efficiency applied to datasheet peaks.

A GEMM runs at ``gemm_eff_max`` of dense peak scaled by a saturating factor
d/(d + gemm_dim_half) for each of its three dimensions: skinny GEMMs (a small m, n or
k, as under heavy tensor-parallel slicing) run well below peak, large ones near
``gemm_eff_max``. Every kernel is also bounded below by its HBM traffic at
``hbm_eff`` of datasheet bandwidth (a roofline), and pays ``kernel_overhead_us``.
"""
from __future__ import annotations

from typing import Iterable

from costmodel.flops import Op
from costmodel.gpus import GpuSpec
from costmodel.profile import GpuEfficiency


def gemm_efficiency(m: float, n: float, k: float, eff: GpuEfficiency) -> float:
    """Fraction of dense peak a GEMM of shape (m x k) @ (k x n) reaches."""
    f = eff.gemm_eff_max
    half = eff.gemm_dim_half
    for d in (m, n, k):
        if d > 0:
            f *= d / (d + half)
    return f


def op_time_s(op: Op, gpu: GpuSpec, eff: GpuEfficiency, precision: str) -> float:
    """Seconds for one operation: max(compute time, memory time) + launch overhead."""
    bw = gpu.mem_bw_Bps * eff.hbm_eff
    mem_t = op.bytes / bw
    if op.kind == "gemm":
        comp_t = op.flops / (gpu.peak_flops(precision) * gemm_efficiency(op.m, op.n, op.k, eff))
    elif op.kind == "attention":
        comp_t = op.flops / (gpu.peak_flops(precision) * eff.attention_eff)
    else:
        comp_t = 0.0
    return max(comp_t, mem_t) + eff.kernel_overhead_us * 1e-6


def ops_time_s(ops: Iterable[Op], gpu: GpuSpec, eff: GpuEfficiency, precision: str) -> float:
    return sum(op_time_s(op, gpu, eff, precision) for op in ops)


# Adam step, bytes moved per parameter held: read fp32 master weight, fp32 gradient,
# m and v (16 B); write master, m, v (12 B) and the 16-bit working copy (2 B).
# (Mixed-precision Adam as in Micikevicius et al. 2018 / ZeRO, Rajbhandari et al. 2020.)
ADAM_BYTES_PER_PARAM = 30.0


def optimizer_time_s(params: float, gpu: GpuSpec, eff: GpuEfficiency) -> float:
    """The optimizer step is memory bound: a few fused kernels streaming the state."""
    if params <= 0:
        return 0.0
    return params * ADAM_BYTES_PER_PARAM / (gpu.mem_bw_Bps * eff.hbm_eff) + 4 * eff.kernel_overhead_us * 1e-6


# Top-k with error feedback, bytes moved per fp32 gradient element on the sender:
# add the residual (read grad + residual, write sum: 12 B), select the top k (a radix
# select reads the buffer about twice: 8 B), write back the new residual (8 B).
TOPK_COMPRESS_BYTES_PER_ELEM = 28.0


def topk_compress_time_s(elements: float, gpu: GpuSpec, eff: GpuEfficiency) -> float:
    return elements * TOPK_COMPRESS_BYTES_PER_ELEM / (gpu.mem_bw_Bps * eff.hbm_eff) + 3 * eff.kernel_overhead_us * 1e-6


def topk_decompress_time_s(elements: float, received_entries: float, bytes_per_entry: float,
                           gpu: GpuSpec, eff: GpuEfficiency) -> float:
    """Zero the dense buffer (4 B/elem) and scatter-add every received (index, value) pair
    (read the pair, read-modify-write one fp32 element: bytes_per_entry + 8 B)."""
    moved = elements * 4.0 + received_entries * (bytes_per_entry + 8.0)
    return moved / (gpu.mem_bw_Bps * eff.hbm_eff) + 2 * eff.kernel_overhead_us * 1e-6
