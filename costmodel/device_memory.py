"""One device's memory at its peak, by kind: the single model that the simulator's program,
the search's out-of-memory prune and the heterogeneous layer balancer all call.

Inputs are plain numbers so that costmodel needs nothing from the schedule code: the
layers of each model chunk the device holds (uneven chunks are exact) and the schedule's
in-flight activation counts per chunk at the moments the held activations can peak (right
after a forward; sim/schedules.py's ``inflight_peaks`` gives them for a rank's action
list). The peak of activations is the largest of those moments' sums of
in-flight count x chunk activation bytes, which is what walking the action list gives.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from costmodel import memory as mem
from costmodel.dtypes import working_bytes
from costmodel.shapes import ModelSpec

class MemoryConfig(NamedTuple):
    """What of a plan and the framework the memory of a device depends on (a NamedTuple:
    it keys caches, and tuples hash fast)."""

    tp: int
    sp: bool
    mbs: int
    recompute: str  # none | selective | full
    precision: str  # bf16 | fp16 | fp8 | fp32 (costmodel/dtypes.py)
    dp: int
    zero: int  # ZeRO stage 0..3
    grad_bytes: int  # bytes per element of the gradient buffer (the reduction dtype)
    topk: bool  # top-k compression with an error-feedback residual
    flash_attention: bool  # fused attention keeps no s x s scores
    # Bytes per parameter of FP8 weight copies kept beside the working weights (Transformer
    # Engine under precision=fp8: runtime.fp8_weight_copies x 1 B; 0 otherwise).
    fp8_weight_bytes: float = 0.0
    cp: int = 1  # context parallelism: each device keeps the activations of seq/cp tokens
    # ZeRO-3/FSDP keeps every gathered layer until the step's backward is done instead of
    # freeing it after forward (runtime fsdp_reshard_after_forward; TorchTitan with pp > 1,
    # costmodel/profile.reshard_after_forward): the whole unsharded weights stay resident.
    zero3_keep_gathered: bool = False
    # Dropout masks kept for backward (runtime.dropout; costmodel.memory.activation_bytes_per_layer).
    dropout: bool = True
    # With SP the column-parallel GEMMs keep their gathered input instead of the s/t slice
    # (not runtime.sp_regather_input; costmodel.memory.activation_bytes_per_layer).
    sp_saves_gathered: bool = False


class ChunkSpec(NamedTuple):
    """One model chunk (virtual pipeline stage) on the device."""

    layers: int
    first: bool  # holds the embedding
    last: bool  # holds the output layer and the loss


def device_memory(model: ModelSpec, cfg: MemoryConfig, chunks: tuple[ChunkSpec, ...],
                  inflight: tuple[tuple[int, ...], ...]) -> dict[str, float]:
    """Bytes by kind (weights, grads, optimizer, activations, logits, topk_residual,
    fp8_weights) on
    one device of a TP group at its peak.

    ``inflight``: per candidate peak moment, the microbatches in flight on each chunk
    (one count per entry of ``chunks``). Weights, gradient buffer and optimizer states
    cover the parameters of all chunks (ZeRO-sharded over dp); at the worst moment,
    activations are the sum of count x chunk layers x one layer's activations and 'logits'
    what the output end keeps (final norm and output-layer inputs, the fp32 softmax) once
    per microbatch in flight on the last chunk (GPipe's last stage: every microbatch);
    top-k compression adds an fp32 residual the size of the local parameters. The
    per-layer and per-chunk terms are cached: the search and the heterogeneous balancer
    ask for the same shapes many times."""
    params = _params(model, cfg.tp, chunks)
    layer, head = _layer_activations(model, cfg), _head_activations(model, cfg)
    held_layers, held_heads = _held(tuple(c.layers for c in chunks), tuple(int(c.last) for c in chunks), inflight,
                                    layer, head)
    states = mem.model_state_bytes(params, cfg.dp, cfg.zero, cfg.precision, grad_bytes=cfg.grad_bytes)
    return {
        **states,
        "activations": held_layers * layer,
        "logits": held_heads * head,
        "topk_residual": mem.topk_residual_bytes(params) if cfg.topk else 0.0,
        "fp8_weights": params * cfg.fp8_weight_bytes,
        "fsdp_gathered": params * working_bytes(cfg.precision) if cfg.zero == 3 and cfg.zero3_keep_gathered else 0.0,
    }


def chunk_activation_bytes(model: ModelSpec, cfg: MemoryConfig, chunk: ChunkSpec) -> float:
    """Bytes one in-flight microbatch keeps on a device for ``chunk``: its layers'
    activations, and the output end's when the chunk is the last (the per-microbatch
    terms device_memory sums)."""
    return chunk.layers * _layer_activations(model, cfg) + (_head_activations(model, cfg) if chunk.last else 0.0)


@lru_cache(maxsize=65536)
def _held(layers: tuple[int, ...], heads: tuple[int, ...], inflight: tuple[tuple[int, ...], ...],
          layer_bytes: float, head_bytes: float) -> tuple[int, int]:
    """(layer-activations, output ends) held at the worst moment: the moment whose sum over
    chunks of count x (layers x layer_bytes + head x head_bytes) is largest."""
    held = [(sum(n * k for n, k in zip(counts, layers)), sum(n * h for n, h in zip(counts, heads)))
            for counts in inflight]
    return max(held, key=lambda lh: lh[0] * layer_bytes + lh[1] * head_bytes, default=(0, 0))


@lru_cache(maxsize=4096)
def _layer_activations(model: ModelSpec, cfg: MemoryConfig) -> float:
    """Activation bytes one layer keeps per in-flight microbatch, at the precision's width.
    With context parallelism a device keeps the activations of its seq/cp tokens, and its
    attention runs on fused kernels block by block (Transformer Engine's context-parallel
    attention has only fused backends), so no s x s scores are kept; K/V blocks received
    from neighbours are not kept either (backward exchanges them again)."""
    return mem.activation_bytes_per_layer(cp_local(model, cfg.cp), cfg.mbs, cfg.tp, cfg.sp, cfg.recompute,
                                          bytes_per_elem=working_bytes(cfg.precision),
                                          flash_attention=cfg.flash_attention or cfg.cp > 1,
                                          sp_saves_gathered=cfg.sp_saves_gathered, dropout=cfg.dropout)


@lru_cache(maxsize=4096)
def _head_activations(model: ModelSpec, cfg: MemoryConfig) -> float:
    """Bytes the output end of the stack keeps per in-flight microbatch on the last stage
    (costmodel.memory.head_activation_bytes), for the device's seq/cp tokens."""
    return mem.head_activation_bytes(cp_local(model, cfg.cp), cfg.mbs, cfg.tp, cfg.sp,
                                     bytes_per_elem=working_bytes(cfg.precision),
                                     sp_saves_gathered=cfg.sp_saves_gathered)


def cp_local(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one context-parallel rank sees its tokens: seq_length / cp (every
    per-token tensor and GEMM shrinks by cp; attention is the caller's business)."""
    return model if cp == 1 else replace(model, seq_length=model.seq_length // cp)


@lru_cache(maxsize=65536)
def _params(model: ModelSpec, tp: int, chunks: tuple[ChunkSpec, ...]) -> float:
    """Parameters one device holds for all its chunks."""
    return sum(mem.stage_params(model, c.layers, tp, c.first, c.last) for c in chunks)
