"""A small GPT in torch, built from the simulator's ModelSpec (costmodel/shapes.py), in
model chunks that tensor and pipeline parallelism cut out of the whole.

Architecture (what costmodel/shapes.ModelSpec counts): token embedding plus a learned
position embedding (or RoPE on Q and K in every layer); per layer, pre-norm causal
self-attention (num_attention_heads query heads, num_query_groups K/V heads) and an MLP
(GELU: 2 matrices; SwiGLU: 3), each with its residual; final norm; logits through the
token embedding (tied) or an output matrix of its own, and mean cross-entropy. Norms are
LayerNorm or RMSNorm, linears with or without biases (the model's fields: a GPT-3 or a
Llama).

Queries, keys and values come out of one fused projection (``qkv.w``), as Megatron-Core's
``linear_qkv`` computes them and as the cost model counts them (costmodel/flops.py: one
'qkv' GEMM of n = h + 2 x kv width): its rows are grouped per K/V group, each group's
query heads, then its key head, then its value head (megatron/core/transformer/
attention.py, SelfAttention.get_query_key_value_tensors: the output viewed as [.., groups,
(heads/groups + 2) x head_dim] and split), so an even TP split of the rows hands each rank
whole groups. Three separate projections took this project's CPU runner 154 us of a
layer's forward at tiny's shapes, where the cost model prices the fused GEMM at 75-90 us
(2026-12-02, 2 processes).

Weights are a function of the seed only: every rank builds the full weights from the
seed, in one fixed order, and keeps its slice (``local_weight``), so every layout starts
from exactly the single-process reference's weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel.errors import InputError
from costmodel.shapes import ModelSpec
from validate.comm import Comm
from validate.tp import enter, leave, scatter_seq, vocab_cross_entropy, vocab_embedding

_SWIGLU = None


def swiglu(gate, up):
    """silu(gate) * up keeping only its two inputs for backward, as Megatron-Core's fused
    SwiGLU does (megatron/core/fusions/fused_bias_swiglu.py, SwiGLUFunction): autograd's
    own ops would also keep silu(gate), a third tensor of the MLP's width (the cost model
    counts two, costmodel/memory.py). Backward: d up = g silu(gate); d gate = g up
    sigmoid(gate) (1 + gate (1 - sigmoid(gate)))."""
    global _SWIGLU
    if _SWIGLU is None:
        import torch

        class _SwiGLU(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                ctx.save_for_backward(a, b)
                return torch.nn.functional.silu(a) * b

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                sig = torch.sigmoid(a)
                return g * b * sig * (1 + a * (1 - sig)), g * a * sig

        _SWIGLU = _SwiGLU
    return _SWIGLU.apply(gate, up)


INIT_STD = 0.02  # GPT-2/GPT-3 initialisation (Radford et al. 2019, Sec. 2.3)
LN_EPS = 1e-5
ROPE_BASE = 10000.0  # RoFormer's theta base (Su et al. 2021, eq. 15); timing does not depend on it

_ROPE = None


def rope(x, cos, sin):
    """Rotary position embedding of x [b, heads, s, d] (Su et al. 2021, RoFormer, eq. 34, in
    the rotate-half layout): x cos + rotate_half(x) sin, rotate_half([x1, x2]) = [-x2, x1].
    One autograd Function that keeps nothing for backward but the angles, as Megatron-Core's
    fused RoPE does (the cost model counts no RoPE activations); backward is the inverse
    rotation: g cos - rotate_half(g sin). cos, sin: [s, d], constants of the positions."""
    global _ROPE
    if _ROPE is None:
        import torch

        def half(t):
            a, b = t.chunk(2, dim=-1)
            return torch.cat((-b, a), dim=-1)

        class _Rope(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t, c, s_):
                ctx.angles = (c, s_)  # constants, not activations: kept out of save_for_backward
                return t * c + half(t) * s_

            @staticmethod
            def backward(ctx, g):
                c, s_ = ctx.angles
                return g * c - half(g * s_), None, None

        _ROPE = _Rope
    return _ROPE.apply(x, cos, sin)


_RMSNORM = None


def rms_norm(x, w, eps: float):
    """RMSNorm (Zhang and Sennrich 2019, eq. 4: x / sqrt(mean(x^2) + eps) * w) keeping only
    its input and the fp32 reciprocal RMS per row for backward, as fused RMSNorm kernels do
    (Transformer Engine's RMSNorm saves input and rsigma) and as the cost model counts a
    norm (its input); torch's eager F.rms_norm on CPU also keeps the normalised x. Backward,
    with r the reciprocal RMS and n the width: dx = r (g w) - r^3 x mean((g w) x);
    dw = sum over rows of g x r."""
    global _RMSNORM
    if _RMSNORM is None:
        import torch

        class _RMSNorm(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t, weight, eps_):
                # fp32 statistics for 16-bit inputs; fp32 and fp64 keep their own precision.
                r = torch.rsqrt(t.to(torch.promote_types(t.dtype, torch.float32)).pow(2).mean(-1, keepdim=True) + eps_)
                ctx.save_for_backward(t, weight, r)
                return (t * r).to(t.dtype) * weight

            @staticmethod
            def backward(ctx, g):
                t, weight, r = ctx.saved_tensors
                gw = g * weight
                dx = r * gw - r.pow(3) * t * (gw * t).mean(-1, keepdim=True)
                dw = (g * t * r).reshape(-1, t.shape[-1]).sum(0)
                return dx.to(t.dtype), dw, None

        _RMSNORM = _RMSNorm
    return _RMSNORM.apply(x, w, eps)


def rope_angles(positions, d: int, device):
    """(cos, sin) [len(positions), d] for head dim d: angle p / base^(2i/d) on channel pair i,
    repeated over the two halves (rotate-half layout)."""
    import torch
    inv = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1).to(device)
    return ang.cos(), ang.sin()


@dataclass(frozen=True)
class ParamSpec:
    """One full weight: its shape, initialisation, and how TP splits it.

    split_dim: the dimension split across TP ranks (0: output rows of a column-parallel
    linear; 1: input columns of a row-parallel one), or None when every TP rank holds it.
    sp_partial: replicated, but with sequence parallelism each TP rank sees only its part
    of the sequence, so its gradient must be summed over the TP group."""

    name: str
    shape: tuple[int, ...]
    init: str  # 'normal', 'scaled' (residual output projections), 'zeros', 'ones'
    split_dim: int | None = None
    sp_partial: bool = False


def layer_params(model: ModelSpec, i: int) -> list[ParamSpec]:
    h, kv, f = model.hidden_size, model.kv_hidden, model.ffn
    p = f"l{i}."
    bias, ln = model.linear_bias, model.normalization == "layernorm"

    def norm(name):
        return [ParamSpec(p + name + ".w", (h,), "ones", None, True)] + (
            [ParamSpec(p + name + ".b", (h,), "zeros", None, True)] if ln else [])

    def linear(name, shape, init, split, row):
        w = [ParamSpec(p + name + ".w", shape, init, split)]
        if not bias:
            return w
        # A row-parallel linear's bias is added after the reduction: replicated.
        return w + [ParamSpec(p + name + ".b", (shape[0],), "zeros", None if row else 0, row)]

    out = norm("ln1") + linear("qkv", (h + 2 * kv, h), "normal", 0, False) + linear("o", (h, h), "scaled", 1, True)
    out += norm("ln2") + linear("fc1", (f, h), "normal", 0, False)
    if model.activation == "swiglu":
        out += linear("gate", (f, h), "normal", 0, False)
    return out + linear("fc2", (h, f), "scaled", 1, True)


def all_params(model: ModelSpec) -> list[ParamSpec]:
    """Every full weight in the fixed order the seed fills them."""
    h = model.hidden_size
    out = [ParamSpec("wte", (model.vocab_size, h), "normal", 0)]  # rows split along the vocabulary
    if model.position_embedding == "learned":
        out.append(ParamSpec("wpe", (model.seq_length, h), "normal"))
    for i in range(model.num_layers):
        out += layer_params(model, i)
    out.append(ParamSpec("lnf.w", (h,), "ones", None, True))
    if model.normalization == "layernorm":
        out.append(ParamSpec("lnf.b", (h,), "zeros", None, True))
    if not model.tie_embeddings:
        out.append(ParamSpec("wout", (model.vocab_size, h), "normal", 0))
    return out


def full_weights(model: ModelSpec, seed: int) -> dict:
    """name -> full fp32 tensor, the same on every rank for a given seed."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    # Residual output projections scaled by 1/sqrt(2 * layers) (Radford et al. 2019, Sec. 2.3).
    scaled = INIT_STD / math.sqrt(2 * model.num_layers)
    out = {}
    for ps in all_params(model):
        if ps.init == "ones":
            out[ps.name] = torch.ones(ps.shape)
        elif ps.init == "zeros":
            out[ps.name] = torch.zeros(ps.shape)
        else:
            std = scaled if ps.init == "scaled" else INIT_STD
            out[ps.name] = torch.randn(ps.shape, generator=gen) * std
    return out


def local_weight(full, spec: ParamSpec, tp: int, tp_index: int):
    """This TP rank's slice of a full weight (a copy; heads stay whole: q rows of head j
    are rows j*head_dim .. (j+1)*head_dim, so an even split keeps whole heads)."""
    if spec.split_dim is None or tp == 1:
        return full.clone()
    return full.chunk(tp, dim=spec.split_dim)[tp_index].clone()


def check_tp(model: ModelSpec, tp: int) -> None:
    """The runner splits whole query heads, whole K/V groups and equal vocabulary shares
    across TP ranks."""
    if model.kv_groups % tp:
        raise InputError("--plan", "tp", f"the runner needs tp={tp} to divide num_query_groups="
                         f"{model.kv_groups} (it does not replicate K/V heads)")
    if model.vocab_size % tp:
        raise InputError("--plan", "tp", f"the runner needs tp={tp} to divide vocab_size={model.vocab_size} "
                         "(it splits the token embedding into equal shares and does not pad it)")


class GPTChunk:
    """Layers ``layers`` (global indices) of the model, plus the embedding when ``first``
    and the final norm, logits and loss when ``last``; TP slices for ``tp_comm``."""

    def __init__(self, model: ModelSpec, layers: list[int], first: bool, last: bool, weights: dict,
                 tp_comm: Comm | None, sp: bool, recompute: str, device, ring=None):
        import torch
        self.model, self.layers, self.first, self.last = model, list(layers), first, last
        # Context parallelism (validate/cp.py Ring): this rank holds ring.positions() of
        # every sequence, and attention runs around the ring; None: the whole sequence.
        self.ring = ring if ring is not None and ring.size > 1 else None
        self.comm, self.sp, self.recompute = tp_comm, sp and tp_comm is not None and tp_comm.size > 1, recompute
        tp = tp_comm.size if tp_comm else 1
        ti = tp_comm.index if tp_comm else 0
        check_tp(model, tp)
        self.heads = model.num_attention_heads // tp
        self.groups = model.kv_groups // tp
        self.out_name = "wte" if model.tie_embeddings else "wout"
        specs = [s for s in all_params(model) if (first and s.name in ("wte", "wpe"))
                 or (last and s.name in (self.out_name, "lnf.w", "lnf.b"))
                 or any(s.name.startswith(f"l{i}.") for i in self.layers)]
        self.specs = {s.name: s for s in specs}
        self._angle_cache: dict = {}  # RoPE's (cos, sin) per (positions, device): _angles
        self.params = {s.name: torch.nn.Parameter(local_weight(weights[s.name], s, tp, ti).to(device))
                       for s in specs}

    def forward(self, inp, targets=None, loss_scale: float = 1.0):
        """First chunk: ``inp`` are token ids [b, s]; else activations [b, s(/tp), h].
        Last chunk returns the scaled loss; others return activations."""
        from torch.utils.checkpoint import checkpoint
        P = self.params
        x = inp
        if self.first:
            pos = (self.ring.positions(self.model.seq_length).to(inp.device) if self.ring
                   else slice(0, inp.shape[1]))
            x = vocab_embedding(inp, P["wte"], self.comm)
            if "wpe" in P:
                x = x + P["wpe"][pos]
            x = scatter_seq(x, self.comm, self.sp)
        for i in self.layers:
            if self.recompute == "full":
                x = checkpoint(self._layer, i, x, use_reentrant=False)
            else:
                x = self._layer(i, x)
        if not self.last:
            return x
        x = self._norm(x, "lnf")
        # Logits over this rank's vocabulary rows (a column-parallel GEMM: with sp its input
        # is gathered along the sequence first), then the vocabulary-parallel loss.
        logits = enter(x, self.comm, self.sp) @ P[self.out_name].t()
        return vocab_cross_entropy(logits, targets, self.comm) * loss_scale

    def _norm(self, x, name: str):
        import torch.nn.functional as F
        P = self.params
        if self.model.normalization == "rmsnorm":
            return rms_norm(x, P[name + ".w"], LN_EPS)
        return F.layer_norm(x, x.shape[-1:], P[name + ".w"], P[name + ".b"], LN_EPS)

    def _add_bias(self, x, name: str):
        b = self.params.get(name)
        return x if b is None else x + b

    def _layer(self, i: int, x):
        p = f"l{i}."
        x = x + self._attention(p, self._norm(x, p + "ln1"))
        return x + self._mlp(p, self._norm(x, p + "ln2"))

    def _angles(self, s: int, device):
        """RoPE's (cos, sin) for this rank's s positions (its ring positions under CP)."""
        import torch
        key = (s, str(device))
        if key not in self._angle_cache:
            pos = self.ring.positions(self.model.seq_length) if self.ring else torch.arange(s)
            self._angle_cache[key] = rope_angles(pos, self.model.head_dim, device)
        return self._angle_cache[key]

    def _attention(self, p: str, h):
        import torch.nn.functional as F
        from torch.utils.checkpoint import checkpoint
        P = self.params
        h = enter(h, self.comm, self.sp)
        b, s, _ = h.shape
        d = self.model.head_dim
        rep = self.model.heads_per_group
        # One GEMM, then per K/V group: its rep query heads, its key, its value (module doc).
        qkv = F.linear(h, P[p + "qkv.w"], P.get(p + "qkv.b")).view(b, s, self.groups, rep + 2, d)
        q, k, v = qkv.split((rep, 1, 1), dim=3)  # views; one dispatch (multi-dim slicing costs three)
        q = q.reshape(b, s, self.heads, d).transpose(1, 2)
        k, v = k.squeeze(3).transpose(1, 2), v.squeeze(3).transpose(1, 2)
        if self.model.position_embedding == "rope":
            cos, sin = self._angles(s, h.device)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
        if self.ring is not None:  # checkpoints its own pieces, not the exchange
            a = self.ring.attend(q, k, v, rep, checkpoint=self.recompute == "selective")
        elif self.recompute == "selective":
            # Korthikanti et al. 2022, Sec. 5: recompute only the attention core (scores,
            # softmax, weighted sum), whose activations grow with s^2.
            a = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            a = self._core(q, k, v)
        a = a.transpose(1, 2).reshape(b, s, self.heads * d)
        return self._add_bias(leave(F.linear(a, P[p + "o.w"]), self.comm, self.sp), p + "o.b")

    def _core(self, q, k, v):
        import torch.nn.functional as F
        rep = self.model.heads_per_group
        if rep > 1:  # grouped-query attention: each K/V head serves `rep` query heads
            import torch  # here, not at import: validate.gpt must import without torch
            if torch.__version__ >= "2.5":  # enable_gqa from torch 2.5: natively, K and V kept once
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def _mlp(self, p: str, h):
        import torch.nn.functional as F
        P = self.params
        h = enter(h, self.comm, self.sp)
        u = F.linear(h, P[p + "fc1.w"], P.get(p + "fc1.b"))
        if self.model.activation == "swiglu":
            u = swiglu(F.linear(h, P[p + "gate.w"], P.get(p + "gate.b")), u)
        else:
            u = F.gelu(u)
        return self._add_bias(leave(F.linear(u, P[p + "fc2.w"]), self.comm, self.sp), p + "fc2.b")


def batch_tokens(model: ModelSpec, step: int, seed: int):
    """Token ids [global_batch, seq + 1] of step ``step``: inputs are [:, :-1], targets
    [:, 1:]. Drawn from a fixed pool of 2 x global_batch random sequences, alternating
    halves, so the model can memorise them and the loss falls within a few steps (what
    the top-k test needs to tell a good compressor from a bad one)."""
    import torch
    gen = torch.Generator().manual_seed(seed + 7919)  # a data stream apart from the weights'
    g = model.global_batch_size
    pool = torch.randint(0, model.vocab_size, (2 * g, model.seq_length + 1), generator=gen)
    half = step % 2
    return pool[half * g:(half + 1) * g]
