"""Tests of costmodel/flops.py: published FLOP formulas, TP splitting and hand-worked ops."""
from __future__ import annotations

import math

import pytest

from costmodel.errors import InputError
from costmodel.flops import (
    embedding_backward_ops,
    embedding_ops,
    hardware_flops_per_iteration,
    head_backward_ops,
    head_forward_ops,
    layer_backward_ops,
    layer_forward_ops,
    matmul_flops,
    model_flops_per_iteration,
    recompute_ops,
)
from costmodel.shapes import ModelSpec

# GPT shapes of Korthikanti et al. 2022 Table 3 / Narayanan et al. 2021 (MHA, gelu, ffn=4h),
# plus a narrow long-sequence one so that the s/(6h) terms weigh a lot.
GPT_22B = ModelSpec("gpt-22b", 48, 6144, 64, 2048, 51200, 4)
GPT_175B = ModelSpec("gpt-175b", 96, 12288, 96, 2048, 51200, 1536)
GPT_LONG = ModelSpec("gpt-long", 4, 256, 4, 8192, 50257, 3)
GPTS = [GPT_22B, GPT_175B, GPT_LONG]

# Tiny GQA + SwiGLU shape for hand-worked numbers: h=8, 4 heads of dim 2, 2 KV groups
# (kv_hidden=4), ffn=12, s=4, V=16.
TINY = ModelSpec("tiny", 2, 8, 4, 4, 16, 1, num_query_groups=2, ffn_hidden_size=12, activation="swiglu")
LLAMA_LIKE = ModelSpec(
    "llama-like", 32, 4096, 32, 4096, 32000, 1024, num_query_groups=8, ffn_hidden_size=11008, activation="swiglu"
)


def _published_model_flops(m: ModelSpec) -> float:
    B, s, l, h, V = m.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * h * l))


@pytest.mark.parametrize("m", GPTS, ids=lambda m: m.name)
def test_model_flops_equal_published_formula(m):
    """Model FLOPs = 72*B*s*l*h^2*(1 + s/(6h) + V/(12hl)) (Narayanan 2021; Korthikanti 2022)."""
    assert math.isclose(model_flops_per_iteration(m), _published_model_flops(m), rel_tol=1e-12)


@pytest.mark.parametrize("m", GPTS, ids=lambda m: m.name)
def test_full_recompute_flops_equal_narayanan_eq3(m):
    """Hardware FLOPs with full recompute = 96*B*s*l*h^2*(1 + s/(6h) + V/(16lh)) (Narayanan 2021 eq. 3)
    in both conventions."""
    B, s, l, h, V = m.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    expected = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert math.isclose(hardware_flops_per_iteration(m, "full"), expected, rel_tol=1e-12)
    assert math.isclose(hardware_flops_per_iteration(m, "full", convention="ops"), expected, rel_tol=1e-12)


@pytest.mark.parametrize("m", GPTS, ids=lambda m: m.name)
def test_selective_recompute_flops_both_conventions(m):
    """'published' equals Korthikanti 2022's 72*B*s*l*h^2*(1 + s/(3h) + V/(12hl)); 'ops' adds only
    one forward of QK^T and attention-over-V, 4*B*s^2*h per layer."""
    B, s, l, h, V = m.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    published = 72 * B * s * l * h**2 * (1 + s / (3 * h) + V / (12 * h * l))
    assert math.isclose(hardware_flops_per_iteration(m, "selective"), published, rel_tol=1e-12)
    ops = _published_model_flops(m) + 4 * B * s**2 * h * l
    assert math.isclose(hardware_flops_per_iteration(m, "selective", convention="ops"), ops, rel_tol=1e-12)
    assert hardware_flops_per_iteration(m, "none") == model_flops_per_iteration(m)


def test_selective_overhead_gpt3():
    """The printed selective formula costs ~2.7% over model FLOPs for GPT-3 175B, one re-run ~0.9%."""
    base = model_flops_per_iteration(GPT_175B)
    pub = hardware_flops_per_iteration(GPT_175B, "selective") / base - 1
    ops = hardware_flops_per_iteration(GPT_175B, "selective", convention="ops") / base - 1
    assert round(pub, 3) == 0.027 and round(ops, 3) == 0.009


@pytest.mark.parametrize("m", GPTS + [TINY, LLAMA_LIKE], ids=lambda m: m.name)
@pytest.mark.parametrize("tp", [1, 2])
def test_backward_matmuls_are_twice_forward(m, tp):
    """Input-grad + weight-grad GEMMs and the four attention backward matmuls = 2x forward matmul FLOPs."""
    fwd = matmul_flops(layer_forward_ops(m, 2, tp, False))
    assert matmul_flops(layer_backward_ops(m, 2, tp, False)) == 2 * fwd
    assert matmul_flops(head_backward_ops(m, 2, tp)) == 2 * matmul_flops(head_forward_ops(m, 2, tp))


@pytest.mark.parametrize("m", [GPT_22B, LLAMA_LIKE], ids=lambda m: m.name)
@pytest.mark.parametrize("tp", [2, 8])
def test_tp_splits_flops_exactly(m, tp):
    """Summed over tp ranks, matmul FLOPs equal the tp=1 ones; with SP every op (memory ops too)
    splits exactly; without SP the LayerNorm/dropout/residual ops are replicated per rank."""
    one_fwd = layer_forward_ops(m, 4, 1, False)
    for builder in (layer_forward_ops, layer_backward_ops):
        one = builder(m, 4, 1, False)
        assert tp * matmul_flops(builder(m, 4, tp, False)) == matmul_flops(one)
        with_sp = builder(m, 4, tp, True)
        assert tp * sum(o.flops for o in with_sp) == sum(o.flops for o in one)
    ln_one = [o.flops for o in one_fwd if o.name == "layernorm"]
    ln_tp = [o.flops for o in layer_forward_ops(m, 4, tp, False) if o.name == "layernorm"]
    assert ln_tp == ln_one


def test_tiny_gqa_swiglu_forward_by_hand():
    """Hand-worked GEMM shapes and FLOPs for h=8, 4 heads (d=2), 2 KV groups (kv width 4), ffn=12 swiglu, s=4."""
    ops = {o.name: o for o in layer_forward_ops(TINY, 1, 1, False)}
    # qkv: m=4 tokens, n = 8 + 2*4 = 16, k=8 -> 2*4*16*8
    assert (ops["qkv"].m, ops["qkv"].n, ops["qkv"].k, ops["qkv"].flops) == (4, 16, 8, 1024)
    # QK^T per head: 4 heads x (4x2 @ 2x4) -> 2*4*4*4*2 = 256; context the same
    assert (ops["attn_scores"].batch, ops["attn_scores"].flops, ops["attn_context"].flops) == (4, 256, 256)
    assert ops["attn_out"].flops == 2 * 4 * 8 * 8  # 512
    # swiglu: gate and up in one GEMM of width 2*12
    assert (ops["mlp_up"].n, ops["mlp_up"].flops) == (24, 2 * 4 * 24 * 8)  # 1536
    assert ops["mlp_down"].flops == 2 * 4 * 8 * 12  # 768
    assert matmul_flops(list(ops.values())) == 1024 + 256 + 256 + 512 + 1536 + 768
    # tp=2: 2 heads and 1 KV group per rank: qkv n = 4 + 2*2 = 8
    assert {o.name: o.n for o in layer_forward_ops(TINY, 1, 2, False)}["qkv"] == 8


def test_tiny_bytes_by_hand():
    """HBM bytes: qkv reads X (4x8) and W (8x16), writes Y (4x16) at 2 B; softmax reads/writes
    4*4*4=64 scores; attention dropout also writes a 1-byte mask; fp32 doubles GEMM bytes."""
    ops = {o.name: o for o in layer_forward_ops(TINY, 1, 1, False)}
    assert ops["qkv"].bytes == (32 + 128 + 64) * 2
    assert ops["softmax"].bytes == 64 * 2 * 2
    assert ops["attn_dropout"].bytes == 64 * 2 * 2 + 64
    ops4 = {o.name: o for o in layer_forward_ops(TINY, 1, 1, False, bytes_per_elem=4)}
    assert ops4["qkv"].bytes == 2 * ops["qkv"].bytes


@pytest.mark.parametrize("m", [TINY, GPT_22B], ids=lambda m: m.name)
def test_matmul_ops_consistent_with_shape(m):
    """Every matmul op's flops equal 2*m*n*k*batch, so efficiency-by-shape models see the same work."""
    ops = (
        layer_forward_ops(m, 2, 2, True)
        + layer_backward_ops(m, 2, 2, True)
        + head_forward_ops(m, 2, 2)
        + head_backward_ops(m, 2, 2)
    )
    mm = [o for o in ops if o.is_matmul]
    assert len(mm) == 6 + 12 + 1 + 2
    for o in mm:
        assert o.flops == 2 * o.m * o.n * o.k * o.batch, o.name
    assert all(o.kind == "memory" for o in ops if not o.is_matmul)


def test_recompute_ops_modes():
    """'none' re-runs nothing, 'full' the whole forward, 'selective' exactly the core-attention ops."""
    assert recompute_ops(GPT_22B, 4, 8, True, "none") == []
    assert recompute_ops(GPT_22B, 4, 8, True, "full") == layer_forward_ops(GPT_22B, 4, 8, True)
    sel = recompute_ops(GPT_22B, 4, 8, True, "selective")
    assert [o.name for o in sel] == ["attn_scores", "softmax", "attn_dropout", "attn_context"]
    # 22B, TP=8: 2 matmuls of 2*b*s^2*h/t each
    assert matmul_flops(sel) == 2 * (2 * 4 * 2048**2 * 6144 / 8)
    with pytest.raises(InputError, match="allowed: none, selective, full"):
        recompute_ops(GPT_22B, 4, 8, True, "some")


def test_head_and_embedding():
    """Logits GEMM is 2*b*s*h*V/t; an indivisible vocabulary is padded to ceil(V/t) per rank;
    embedding ops are memory bound."""
    (ln, logits, ce) = head_forward_ops(GPT_22B, 4, 8)
    assert logits.flops == 2 * 4 * 2048 * 6144 * 51200 / 8
    assert ce.kind == "memory" and ln.name == "layernorm"
    assert head_forward_ops(GPT_LONG, 1, 4)[1].n == math.ceil(50257 / 4)  # 12565
    for op in embedding_ops(GPT_22B, 4, 8) + embedding_backward_ops(GPT_22B, 4, 8):
        assert op.kind == "memory" and op.bytes > 0
    # with SP the position add and dropout run on the s/t slice
    assert embedding_ops(GPT_22B, 4, 8, sp=True)[2].bytes * 8 == embedding_ops(GPT_22B, 4, 8)[2].bytes


def test_bad_input_raises_input_error():
    """TP must divide heads, KV groups and ffn; SP needs tp | s; mbs >= 1; bytes_per_elem in 1,2,4."""
    with pytest.raises(InputError, match="num_attention_heads=64"):
        layer_forward_ops(GPT_22B, 4, 3, False)
    with pytest.raises(InputError, match="num_query_groups=8"):
        layer_forward_ops(LLAMA_LIKE, 1, 16, False)
    with pytest.raises(InputError, match="seq_length=4"):
        layer_forward_ops(ModelSpec("x", 1, 64, 8, 4, 10, 1), 1, 8, True)
    with pytest.raises(InputError, match="plan.mbs"):
        layer_forward_ops(GPT_22B, 0, 8, False)
    with pytest.raises(InputError, match="bytes_per_elem"):
        layer_forward_ops(GPT_22B, 1, 8, False, bytes_per_elem=3)
    with pytest.raises(InputError, match="convention"):
        hardware_flops_per_iteration(GPT_22B, "full", convention="paper")
