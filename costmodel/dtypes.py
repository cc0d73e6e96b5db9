"""Element sizes and the dtypes each training precision keeps its tensors in: the one
table every byte count of the cost model (memory, communication, optimizer traffic)
derives from.

A plan's ``precision`` names the GEMM arithmetic; the tensors around it follow the
framework conventions below:

- fp32: everything fp32; the weights are the optimizer's master copy.
- bf16 / fp16 mixed precision (Micikevicius et al. 2018, "Mixed Precision Training",
  Sec. 3): 16-bit weights, activations and new gradients, an fp32 master copy of the
  weights and fp32 Adam moments (2 + 2 + 12 = 16 bytes per parameter, Rajbhandari et al.
  2020, "ZeRO", Sec. 3.1). fp16 needs loss scaling (Micikevicius 2018, Sec. 3.2) and
  accumulates/reduces gradients in fp16; bf16 accumulates them in fp32 (Megatron-LM's
  ``main_grad`` with accumulate_allreduce_grads_in_fp32, DeepSpeed's BF16_Optimizer).
- fp8 (NVIDIA Transformer Engine user guide, "Using FP8 with Transformer Engine",
  section "Mixed precision training with FP8"): fp8 is cast to only as the input of the
  GEMMs inside TE's linear layers; the weights, activations and gradients outside the GEMMs
  stay bf16 and the optimizer is bf16 mixed precision. Assumption: the GEMM inputs saved
  for backward are counted at bf16 width too (an upper bound: TE may save an fp8 copy).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.errors import InputError

if TYPE_CHECKING:  # costmodel.profile takes its dtype choices from here
    from costmodel.profile import RuntimeSettings

# Bytes per element (IEEE 754 binary32; bfloat16 and binary16; OCP FP8 E4M3/E5M2).
# tf32 is fp32 storage with a 19-bit tensor-core input format (NVIDIA A100 whitepaper).
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class TrainingDtypes:
    """The dtype of each tensor class under one training precision."""

    working: str  # weights the GEMMs read, activations, freshly computed gradients
    grad_reduce: str  # default dtype of the gradient buffer / DP reduction
    master: str | None  # optimizer's master copy of the weights (None: weights are it)
    loss_scaling: bool  # dynamic loss scaling (unscale + inf/NaN check each step)


TRAINING = {
    "bf16": TrainingDtypes(working="bf16", grad_reduce="fp32", master="fp32", loss_scaling=False),
    "fp16": TrainingDtypes(working="fp16", grad_reduce="fp16", master="fp32", loss_scaling=True),
    "fp8": TrainingDtypes(working="bf16", grad_reduce="fp32", master="fp32", loss_scaling=False),
    "fp32": TrainingDtypes(working="fp32", grad_reduce="fp32", master=None, loss_scaling=False),
}
ADAM_MOMENT_DTYPE = "fp32"  # m and v, two per parameter (Kingma & Ba 2015)
# A profile's runtime.grad_reduce_dtype may name any of these ('auto': TRAINING's choice).
GRAD_REDUCE_CHOICES = ("fp32", "bf16", "fp16")


def training(precision: str) -> TrainingDtypes:
    got = TRAINING.get(precision)
    if got is None:
        raise InputError(None, "plan.precision", f"got {precision!r}; allowed: {', '.join(TRAINING)}")
    return got


def working_bytes(precision: str) -> int:
    """Bytes of a weight, activation or fresh gradient element (what ZeRO gathers, what
    pipeline stages send, what memory-bound kernels stream)."""
    return DTYPE_BYTES[training(precision).working]


def grad_reduce_bytes(precision: str, runtime: RuntimeSettings | None = None) -> int:
    """Bytes per gradient element in the gradient buffer and the DP reduction; a profile's
    runtime.grad_reduce_dtype (one of GRAD_REDUCE_CHOICES; 'auto' keeps TRAINING's choice,
    and the profile loader checks the value) overrides the default."""
    chosen = runtime.grad_reduce_dtype if runtime is not None else "auto"
    if chosen == "auto":
        return DTYPE_BYTES[training(precision).grad_reduce]
    return DTYPE_BYTES[chosen]


# A kept top-k entry's index: int32, which addresses any gradient bucket below 2^31
# elements (DDP's default 25 MB buckets hold 6.25M fp32 elements).
TOPK_INDEX_BYTES = 4


def topk_entry_bytes(precision: str, runtime: RuntimeSettings | None = None) -> int:
    """Bytes of one kept top-k entry on the wire: its int32 index and its value in the dtype
    of the gradient buffer it was selected from (grad_reduce_bytes: fp32 main gradients
    under bf16 mixed precision, as Megatron-LM accumulates them by default), as the runner
    packs them (validate/topk.TopKCompressor.start) and the simulator's sparse all-gather
    and decompression count them."""
    return TOPK_INDEX_BYTES + grad_reduce_bytes(precision, runtime)


def fp8_weight_bytes(precision: str, runtime: RuntimeSettings | None = None) -> float:
    """Bytes per parameter of the FP8 weight copies an FP8 run keeps besides its BF16
    weights: runtime.fp8_weight_copies x 1 B (Transformer Engine caches the FP8 weight and,
    for Hopper's GEMM layouts, its transpose); 0 for other precisions."""
    if precision != "fp8" or runtime is None:
        return 0.0
    return float(runtime.fp8_weight_copies * DTYPE_BYTES["fp8"])


def param_gather_bytes(precision: str, runtime: RuntimeSettings | None = None) -> int:
    """Bytes per weight element that ZeRO's / FSDP's parameter all-gathers move: the
    working width, or 1 (fp8) when FP8 training gathers its FP8 weight copies
    (runtime.fp8_param_gather: Megatron-Core --fp8-param-gather, TorchTitan
    float8.enable_fsdp_float8_all_gather)."""
    if precision == "fp8" and runtime is not None and runtime.fp8_param_gather:
        return DTYPE_BYTES["fp8"]
    return working_bytes(precision)


def optimizer_state_bytes(precision: str) -> int:
    """Bytes per parameter the optimizer holds beyond the weights and gradients: the
    master copy (if any) and Adam's two moments. bf16: 4 + 8 = 12; fp32: 8."""
    t = training(precision)
    master = DTYPE_BYTES[t.master] if t.master else 0
    return master + 2 * DTYPE_BYTES[ADAM_MOMENT_DTYPE]


def optimizer_step_bytes(precision: str) -> float:
    """HBM bytes the optimizer step moves per parameter held (mixed-precision Adam as in
    Micikevicius et al. 2018 and Megatron-LM's Float16OptimizerWithFloat16Params):
    gradient norm (read the fp32 grads), Adam (read master, grad, m, v; write master, m,
    v), zero the gradient buffer; with a master copy also copy it to the working weights;
    when gradients accumulate below fp32, first copy them to fp32 main grads; with loss
    scaling also unscale them (read and write fp32).
    fp16: 4 + 28 + 6 + 6 + 8 + 2 = 54; bf16 / fp8: 4 + 28 + 6 + 4 = 42; fp32: 36."""
    t = training(precision)
    fp32 = DTYPE_BYTES["fp32"]
    grad = DTYPE_BYTES[t.grad_reduce]
    moved = fp32 + 7 * fp32 + grad  # norm, Adam (4 reads + 3 writes), zero the grad buffer
    if t.master:
        moved += DTYPE_BYTES[t.master] + DTYPE_BYTES[t.working]
    if grad < fp32:
        moved += grad + fp32
    if t.loss_scaling:
        moved += 2 * fp32
    return float(moved)
