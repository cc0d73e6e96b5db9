"""Per-operation FLOPs and HBM bytes of a decoder-only transformer.

Every ``*_ops`` function describes ONE microbatch on ONE tensor-parallel (TP) rank, as a
list of :class:`Op` in execution order, so that the simulator can turn each into a
duration (matmuls by FLOPs and shape, elementwise ops by bytes). The layer follows
Megatron-LM (pre-LayerNorm GPT, unfused "core attention" that materialises the s x s
scores, as in Korthikanti et al. 2022), generalised to grouped-query attention (K and V
projections of width ``kv_hidden``) and SwiGLU (gate and up matrices, both of width ffn).

Matmul FLOPs are exact (2 FLOP per multiply-add). The ``flops`` of memory-bound ops are
rough operation counts kept for information only; published FLOP formulas and the totals
here count matmuls only (``kind`` 'gemm' and 'attention'). ``bytes`` is the minimum HBM
traffic: each operand read once and each result written once, in ``bytes_per_elem``;
dropout masks are 1 byte per element (PyTorch stores them as bool/uint8).

Tensor parallelism (Megatron): QKV and MLP-up are column-parallel, attention-out and
MLP-down row-parallel, so each rank holds heads/t query heads, groups/t KV groups, ffn/t
FFN columns and V/t vocabulary rows. Without sequence parallelism (SP) the LayerNorms,
dropouts and residual adds run replicated on the full s*b*h activation; with SP they run on
an s/t slice. The TP collectives themselves are not ops here (the simulator adds them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.errors import InputError
from costmodel.shapes import ModelSpec

RECOMPUTE_MODES = ("none", "selective", "full")
MATMUL_KINDS = ("gemm", "attention")

# Rough elementwise operation counts per element (information only; see module docstring).
_LN_FWD = 8  # mean, centre, square, variance sum, rsqrt-scale, gamma, beta (+ stats)
_LN_BWD = 12  # dgamma, dbeta and the two reductions of the input gradient
_SOFTMAX_FWD = 7  # scale, mask, max, subtract, exp, sum, divide
_SOFTMAX_BWD = 4  # dot(p, dp) reduction, subtract, multiply, scale
_GELU_FWD = 8  # tanh approximation: cube, fma, tanh, multiply, add
_GELU_BWD = 12
_SWIGLU_FWD = 6  # silu(gate) * up: exp, add, divide, two multiplies
_SWIGLU_BWD = 10
_ROPE = 3  # per element of Q and K: x cos + rotate_half(x) sin (two multiplies, one add)
_DROPOUT = 2  # compare with the random draw, scale
_CE_FWD = 6  # max, subtract, exp, sum, log, pick target
_CE_BWD = 2
_MASK_BYTES = 1  # dropout mask element (torch.bool / uint8)
# FLOPs per element of the forward element-wise ops plansim calibrate times on their own
# (validate/microbench.MEMORY_OPS), as the ops above count them: its add is the residual.
ELEMENTWISE_FLOPS_PER_ELEM = {"add": 1, "gelu": _GELU_FWD, "layernorm": _LN_FWD, "softmax": _SOFTMAX_FWD}
_TOKEN_ID_BYTES = 8  # int64 token ids read by the embedding lookup


@dataclass(frozen=True)
class Op:
    """One kernel-like operation.

    kind: 'gemm' (a matmul; m, n, k give its shape), 'attention' (one of the batched
    matmuls of core attention; batch = microbatch * heads on this rank) or 'memory'
    (bandwidth-bound elementwise or reduction). For matmuls flops == 2*m*n*k*batch.
    """

    name: str
    kind: str
    flops: float
    bytes: float
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1

    @property
    def is_matmul(self) -> bool:
        return self.kind in MATMUL_KINDS


def matmul_flops(ops: list[Op]) -> float:
    """Sum of the FLOPs of the matmul ops ('gemm' and 'attention'); memory ops excluded."""
    return float(sum(op.flops for op in ops if op.is_matmul))


def total_bytes(ops: list[Op]) -> float:
    return float(sum(op.bytes for op in ops))


# ---------------------------------------------------------------------------- checks
def check_sizes(mbs: int, tp: int, bytes_per_elem: int) -> None:
    """Microbatch and TP size are positive integers; activations are 1, 2 or 4 bytes wide."""
    if not isinstance(mbs, int) or mbs < 1:
        raise InputError(None, "plan.mbs", f"microbatch size must be an integer >= 1, got {mbs!r}")
    if not isinstance(tp, int) or tp < 1:
        raise InputError(None, "plan.tp", f"tensor-parallel size must be an integer >= 1, got {tp!r}")
    if bytes_per_elem not in (1, 2, 4):
        raise InputError(None, "bytes_per_elem", f"got {bytes_per_elem!r}; allowed: 1, 2, 4")


def check_tp_divides(model: ModelSpec, tp: int, sp: bool) -> None:
    """Megatron's divisibility rules for splitting one layer over ``tp`` ranks."""
    for field, value in (
        ("num_attention_heads", model.num_attention_heads),
        ("num_query_groups", model.kv_groups),
        ("ffn_hidden_size", model.ffn),
    ):
        if value % tp:
            msg = f"tp={tp} does not divide model {field}={value}; allowed: a divisor of {value}"
            raise InputError(None, "plan.tp", msg)
    if sp and model.seq_length % tp:
        raise InputError(None, "plan.sp", f"sequence parallelism needs tp={tp} to divide seq_length={model.seq_length}")


def check_recompute(recompute: str) -> None:
    """recompute is one of 'none', 'selective', 'full'."""
    if recompute not in RECOMPUTE_MODES:
        raise InputError(None, "plan.recompute", f"got {recompute!r}; allowed: {', '.join(RECOMPUTE_MODES)}")


# ----------------------------------------------------------------------- op builders
def _gemm(name: str, m: int, n: int, k: int, e: int) -> Op:
    """Y(m x n) = X(m x k) @ W(k x n): reads X and W, writes Y."""
    return Op(name, "gemm", 2.0 * m * n * k, float((m * k + k * n + m * n) * e), m, n, k)


def _gemm_backward(name: str, m: int, n: int, k: int, e: int) -> list[Op]:
    """Input gradient dX = dY @ W^T (m x k, inner n) and weight gradient dW = X^T @ dY
    (k x n, inner m): each the forward's FLOPs, so backward = 2x forward."""
    return [_gemm(f"{name}_dgrad", m, k, n, e), _gemm(f"{name}_wgrad", k, n, m, e)]


def _mem(name: str, elems: float, flops_per_elem: float, bytes_: float) -> Op:
    return Op(name, "memory", float(flops_per_elem * elems), float(bytes_))


def _attn(name: str, batch: int, m: int, n: int, k: int, bytes_: float) -> Op:
    return Op(name, "attention", 2.0 * batch * m * n * k, float(bytes_), m, n, k, batch)


@dataclass(frozen=True)
class _Dims:
    """Per-rank sizes of one microbatch."""

    tokens: int  # b*s rows of every GEMM (SP gathers the sequence before them)
    hid: int  # elements of an s*b*h activation on this rank (s/t slice with SP)
    h: int
    q: int  # query width on this rank, h/t
    kv: int  # K (or V) width on this rank, kv_hidden/t
    heads: int  # query heads on this rank
    f: int  # FFN width on this rank
    s: int
    d: int  # head dim
    b: int
    e: int
    swiglu: bool
    rope: bool = False  # rotary position embedding applied to Q and K in every layer


def _dims(model: ModelSpec, mbs: int, tp: int, sp: bool, e: int) -> _Dims:
    check_sizes(mbs, tp, e)
    check_tp_divides(model, tp, sp)
    s, h = model.seq_length, model.hidden_size
    tokens = mbs * s
    return _Dims(
        tokens=tokens,
        hid=tokens * h // tp if sp else tokens * h,
        h=h,
        q=h // tp,
        kv=model.kv_hidden // tp,
        heads=model.num_attention_heads // tp,
        f=model.ffn // tp,
        s=s,
        d=model.head_dim,
        b=mbs,
        e=e,
        swiglu=model.activation == "swiglu",
        rope=model.position_embedding == "rope",
    )


def _core_attention_forward(x: _Dims) -> list[Op]:
    """QK^T, softmax, attention dropout, attention over V (what selective recompute re-runs)."""
    e, scores = x.e, x.b * x.heads * x.s * x.s  # score elements on this rank
    qk_bytes = x.tokens * (x.q + x.kv) * e + scores * e
    pv_bytes = scores * e + x.tokens * x.kv * e + x.tokens * x.q * e
    return [
        _attn("attn_scores", x.b * x.heads, x.s, x.s, x.d, qk_bytes),
        _mem("softmax", scores, _SOFTMAX_FWD, 2 * scores * e),  # fused scale+mask+softmax
        _mem("attn_dropout", scores, _DROPOUT, 2 * scores * e + scores * _MASK_BYTES),
        _attn("attn_context", x.b * x.heads, x.s, x.d, x.s, pv_bytes),
    ]


def _dropout_residual(x: _Dims) -> list[Op]:
    return [
        _mem("dropout", x.hid, _DROPOUT, 2 * x.hid * x.e + x.hid * _MASK_BYTES),
        _mem("residual", x.hid, 1, 3 * x.hid * x.e),
    ]


def _layernorm(x: _Dims) -> Op:
    return _mem("layernorm", x.hid, _LN_FWD, (2 * x.hid + 2 * x.h) * x.e)  # in, out, gamma+beta


def _rope(x: _Dims, name: str) -> list[Op]:
    """Rotary position embedding on this rank's Q and K (Su et al. 2021, RoFormer, eq. 34:
    each pair of channels rotated by its position's angle): one fused element-wise kernel
    reading and writing both (Megatron-Core's --apply-rope-fusion); its backward is the
    inverse rotation, the same traffic. About 6 FLOPs a rotated pair: 3 an element. None
    without RoPE (a learned table is added once, in embedding_ops)."""
    if not x.rope:
        return []
    n = x.tokens * (x.q + x.kv)
    return [_mem(name, n, _ROPE, 2 * n * x.e)]


def _forward(x: _Dims) -> list[Op]:
    e, t = x.e, x.tokens
    up_n = 2 * x.f if x.swiglu else x.f  # SwiGLU's gate and up matrices run as one GEMM
    if x.swiglu:
        act = _mem("swiglu", t * x.f, _SWIGLU_FWD, 3 * t * x.f * e)  # read gate, up; write out
    else:
        act = _mem("gelu", t * x.f, _GELU_FWD, 2 * t * x.f * e)
    return [
        _layernorm(x),
        _gemm("qkv", t, x.q + 2 * x.kv, x.h, e),
        *_rope(x, "rope"),
        *_core_attention_forward(x),
        _gemm("attn_out", t, x.h, x.q, e),
        *_dropout_residual(x),
        _layernorm(x),
        _gemm("mlp_up", t, up_n, x.h, e),
        act,
        _gemm("mlp_down", t, x.h, x.f, e),
        *_dropout_residual(x),
    ]


def _backward(x: _Dims) -> list[Op]:
    e, t = x.e, x.tokens
    scores = x.b * x.heads * x.s * x.s
    q_bytes, kv_bytes = t * x.q * e, t * x.kv * e
    hid_bwd = [
        _mem("residual_bwd", x.hid, 1, 3 * x.hid * e),  # skip grad + branch grad
        _mem("dropout_bwd", x.hid, 1, 2 * x.hid * e + x.hid * _MASK_BYTES),
    ]
    ln_bwd = _mem("layernorm_bwd", x.hid, _LN_BWD, (3 * x.hid + 4 * x.h) * e)  # x, dy, dx; gamma, dgamma...
    up_n = 2 * x.f if x.swiglu else x.f
    if x.swiglu:  # read gate, up, dy; write dgate, dup
        act_bwd = _mem("swiglu_bwd", t * x.f, _SWIGLU_BWD, 5 * t * x.f * e)
    else:  # read input, dy; write dx
        act_bwd = _mem("gelu_bwd", t * x.f, _GELU_BWD, 3 * t * x.f * e)
    bh = x.b * x.heads
    return [
        *hid_bwd,
        *_gemm_backward("mlp_down", t, x.h, x.f, e),
        act_bwd,
        *_gemm_backward("mlp_up", t, up_n, x.h, e),
        ln_bwd,
        *hid_bwd,
        *_gemm_backward("attn_out", t, x.h, x.q, e),
        # O = P V:  dP = dO V^T (s x s, inner d);  dV = P^T dO (s x d, inner s)
        _attn("attn_context_dp", bh, x.s, x.s, x.d, q_bytes + kv_bytes + scores * e),
        _attn("attn_context_dv", bh, x.s, x.d, x.s, scores * e + q_bytes + kv_bytes),
        _mem("attn_dropout_bwd", scores, 1, 2 * scores * e + scores * _MASK_BYTES),
        _mem("softmax_bwd", scores, _SOFTMAX_BWD, 3 * scores * e),  # read P, dP; write dS
        # S = Q K^T:  dQ = dS K (s x d, inner s);  dK = dS^T Q (s x d, inner s)
        _attn("attn_scores_dq", bh, x.s, x.d, x.s, scores * e + kv_bytes + q_bytes),
        _attn("attn_scores_dk", bh, x.s, x.d, x.s, scores * e + q_bytes + kv_bytes),
        *_rope(x, "rope_bwd"),
        *_gemm_backward("qkv", t, x.q + 2 * x.kv, x.h, e),
        ln_bwd,
    ]


# ------------------------------------------------------------------------ public API
_CORE_ATTENTION_MEMORY_OPS = frozenset({"softmax", "attn_dropout", "softmax_bwd", "attn_dropout_bwd"})


def is_core_attention(op: Op) -> bool:
    """The ops of core attention (its batched matmuls and the softmax / dropout on the
    scores): what context parallelism repeats once per K/V block (sim/context_parallel.py)."""
    return op.kind == "attention" or op.name in _CORE_ATTENTION_MEMORY_OPS


def layer_forward_ops(model: ModelSpec, mbs: int, tp: int, sp: bool, bytes_per_elem: int = 2) -> list[Op]:
    """Forward of one transformer layer, one microbatch, one TP rank."""
    return _forward(_dims(model, mbs, tp, sp, bytes_per_elem))


def layer_backward_ops(model: ModelSpec, mbs: int, tp: int, sp: bool, bytes_per_elem: int = 2) -> list[Op]:
    """Backward of one layer: input- and weight-gradient GEMMs (2x forward matmul FLOPs) and
    the backward of every memory op. Recompute is separate (:func:`recompute_ops`)."""
    return _backward(_dims(model, mbs, tp, sp, bytes_per_elem))


def recompute_ops(model: ModelSpec, mbs: int, tp: int, sp: bool, recompute: str, bytes_per_elem: int = 2) -> list[Op]:
    """What backward re-runs before the layer's gradient: 'full' = the whole layer forward
    from its checkpointed input; 'selective' = core attention only (QK^T, softmax,
    attention dropout, attention over V; Korthikanti et al. 2022); 'none' = []."""
    check_recompute(recompute)
    x = _dims(model, mbs, tp, sp, bytes_per_elem)
    if recompute == "full":
        return _forward(x)
    if recompute == "selective":
        return _core_attention_forward(x)
    return []


def _head_dims(model: ModelSpec, mbs: int, tp: int, sp: bool, e: int) -> tuple[_Dims, int]:
    check_sizes(mbs, tp, e)
    if sp and model.seq_length % tp:
        raise InputError(None, "plan.sp", f"sequence parallelism needs tp={tp} to divide seq_length={model.seq_length}")
    s, h = model.seq_length, model.hidden_size
    tokens = mbs * s
    hid = tokens * h // tp if sp else tokens * h
    # Only the hidden-size fields matter outside the layer; the per-head ones are unused.
    x = _Dims(tokens=tokens, hid=hid, h=h, q=0, kv=0, heads=0, f=0, s=s, d=0, b=mbs, e=e, swiglu=False)
    # Megatron pads the vocabulary to a multiple of tp; each rank computes ceil(V/t) rows.
    return x, math.ceil(model.vocab_size / tp)


def head_forward_ops(model: ModelSpec, mbs: int, tp: int, bytes_per_elem: int = 2, *, sp: bool = False) -> list[Op]:
    """Last stage: final LayerNorm, logits GEMM over this rank's V/t vocabulary rows and the
    vocab-parallel cross entropy (logits cast to fp32, as Megatron does)."""
    x, v = _head_dims(model, mbs, tp, sp, bytes_per_elem)
    n = x.tokens * v
    return [
        _layernorm(x),
        _gemm("logits", x.tokens, v, x.h, x.e),
        # read 16-bit logits, write the fp32 copy, then exp and normalise in place (r+w each).
        _mem("cross_entropy", n, _CE_FWD, n * (x.e + 4 + 2 * 8)),
    ]


def head_backward_ops(model: ModelSpec, mbs: int, tp: int, bytes_per_elem: int = 2, *, sp: bool = False) -> list[Op]:
    """Backward of :func:`head_forward_ops` (2x its matmul FLOPs)."""
    x, v = _head_dims(model, mbs, tp, sp, bytes_per_elem)
    n = x.tokens * v
    return [
        _mem("cross_entropy_bwd", n, _CE_BWD, n * (4 + x.e)),  # read fp32 softmax, write dlogits
        *_gemm_backward("logits", x.tokens, v, x.h, x.e),
        _mem("layernorm_bwd", x.hid, _LN_BWD, (3 * x.hid + 4 * x.h) * x.e),
    ]


def embedding_ops(model: ModelSpec, mbs: int, tp: int, bytes_per_elem: int = 2, *, sp: bool = False) -> list[Op]:
    """First stage: vocab-parallel word-embedding lookup, the learned position embedding's
    add (GPT-3/Megatron; none under RoPE, which rotates Q and K in every layer: _rope) and
    embedding dropout.
    The lookup writes the full b*s*h output (zeros for tokens outside this rank's rows)
    and reads on average 1/t of the rows (tokens assumed spread evenly over the shards)."""
    x, _ = _head_dims(model, mbs, tp, sp, bytes_per_elem)
    full, e = x.tokens * x.h, x.e
    lookup_bytes = x.tokens * _TOKEN_ID_BYTES + full * e / tp + full * e
    learned = model.position_embedding == "learned"
    return [
        _mem("embedding", full, 0, lookup_bytes),
        *([_mem("position_add", x.hid, 1, 3 * x.hid * e)] if learned else []),  # word out + position row
        _mem("dropout", x.hid, _DROPOUT, 2 * x.hid * e + x.hid * _MASK_BYTES),
    ]


def embedding_backward_ops(
    model: ModelSpec, mbs: int, tp: int, bytes_per_elem: int = 2, *, sp: bool = False
) -> list[Op]:
    """Backward of :func:`embedding_ops`: dropout backward, then a dense gradient of this
    rank's V/t x h word-embedding shard (zero fill, then scatter-add of the token rows)
    and the position-embedding gradient (sum over the microbatch)."""
    x, v = _head_dims(model, mbs, tp, sp, bytes_per_elem)
    full, e = x.tokens * x.h, x.e
    word_bytes = v * x.h * e + full * e + 2 * full * e / tp
    pos_bytes = x.hid * e + x.s * x.h * e
    return [
        _mem("dropout_bwd", x.hid, 1, 2 * x.hid * e + x.hid * _MASK_BYTES),
        _mem("embedding_bwd", full / tp, 1, word_bytes),
        *([_mem("position_bwd", x.hid, 1, pos_bytes)] if model.position_embedding == "learned" else []),
    ]


def _per_sequence_matmul_flops(model: ModelSpec) -> tuple[float, float, float]:
    """(layer forward, layer backward, head forward+backward) matmul FLOPs of one sequence.
    Matmul FLOPs are linear in the microbatch, so B sequences cost B times these."""
    fwd = matmul_flops(layer_forward_ops(model, 1, 1, False))
    bwd = matmul_flops(layer_backward_ops(model, 1, 1, False))
    head = matmul_flops(head_forward_ops(model, 1, 1)) + matmul_flops(head_backward_ops(model, 1, 1))
    return fwd, bwd, head


def model_flops_per_iteration(model: ModelSpec) -> float:
    """Model FLOPs of one optimizer step (global batch B): all layer matmuls forward and
    backward plus the logits layer, no recompute. For GPT (MHA, gelu, ffn=4h) this is
    72*B*s*l*h^2*(1 + s/(6h) + V/(12*h*l)) (Narayanan et al. 2021; Korthikanti et al. 2022)."""
    fwd, bwd, head = _per_sequence_matmul_flops(model)
    return model.global_batch_size * (model.num_layers * (fwd + bwd) + head)


def hardware_flops_per_iteration(model: ModelSpec, recompute: str, *, convention: str = "published") -> float:
    """Model FLOPs plus recompute FLOPs of one optimizer step.

    convention='ops': add exactly the matmul FLOPs that :func:`recompute_ops` re-runs (what
    the simulator schedules). 'full' gives 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))
    (Narayanan et al. 2021 eq. 3); 'selective' adds one forward of core attention,
    4*B*s^2*h per layer for GPT.

    convention='published' (default, so utilisation figures compare with published ones):
    as 'ops' except that selective recompute is charged 3x the core-attention forward
    matmul FLOPs, which is what Korthikanti et al. 2022's printed formula
    72*B*s*l*h^2*(1 + s/(3h) + V/(12*h*l)) implies for GPT: it adds 12*B*s^2*h per layer
    (2.7% for GPT-3 175B) where re-running QK^T and attention over V once costs 4*B*s^2*h
    (0.9%). 'none' and 'full' are the same in both conventions.
    """
    check_recompute(recompute)
    if convention not in ("published", "ops"):
        raise InputError(None, "convention", f"got {convention!r}; allowed: published, ops")
    extra = matmul_flops(recompute_ops(model, 1, 1, False, recompute))
    if recompute == "selective" and convention == "published":
        extra *= 3
    return model_flops_per_iteration(model) + model.global_batch_size * model.num_layers * extra


def megatron_flops_per_iteration(model: ModelSpec) -> float:
    """Model FLOPs of one step as Megatron-LM counts them for its throughput figures
    (megatron/training/training.py num_floating_point_operations, NVIDIA/Megatron-LM
    commit f2e5db402c): 12*B*s*l*h^2 * ((1 + g/a + s/h) * q/h + f/h * (3/2 if SwiGLU else 1)
    + V/(2*l*h)), with q = a * head dim the query width, g the KV groups, f the FFN width.
    Attention scores are counted whole (no causal halving), no recompute. For GPT (MHA,
    ffn = 4h) it is 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)), what model_flops_per_iteration gives."""
    b, s, l, h = model.global_batch_size, model.seq_length, model.num_layers, model.hidden_size
    a, g, q = model.num_attention_heads, model.kv_groups, model.num_attention_heads * model.head_dim
    gated = 1.5 if model.activation == "swiglu" else 1.0
    return 12.0 * b * s * l * h * h * ((1 + g / a + s / h) * q / h + model.ffn / h * gated + model.vocab_size / (2 * l * h))
