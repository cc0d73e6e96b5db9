"""Tests of costmodel/memory.py against Korthikanti et al. 2022 Table 2, ZeRO and hand counts."""
from __future__ import annotations

import pytest

from costmodel.errors import InputError
from costmodel.memory import (
    activation_bytes_per_layer,
    logits_bytes,
    model_state_bytes,
    stage_params,
)
from costmodel.shapes import ModelSpec

# Korthikanti 2022's 22B model: h=6144, a=64, s=2048; microbatch 4, TP 8.
GPT_22B = ModelSpec("gpt-22b", 48, 6144, 64, 2048, 51200, 4)
# h=8, 4 heads, 2 KV groups (kv_hidden 4), ffn 12, swiglu, s=4, V=16.
TINY = ModelSpec("tiny", 2, 8, 4, 4, 16, 1, num_query_groups=2, ffn_hidden_size=12, activation="swiglu")

# Hand computation for the 22B model, b=4, t=8:
#   sbh = 2048*4*6144 = 50,331,648;  5*a*s^2*b = 5*64*2048^2*4 = 5,368,709,120 (= sbh*5as/h)
SBH = 50_331_648
ATT = 5_368_709_120


@pytest.mark.parametrize(
    "tp, sp, recompute, expected",
    [
        (1, False, "none", 7_079_985_152),  # sbh*34 + 5as^2b
        (8, False, "none", 1_325_400_064),  # sbh*(10 + 24/8) + 5as^2b/8
        (8, True, "none", 884_998_144),  # sbh*34/8 + 5as^2b/8
        (8, False, "selective", 654_311_424),  # sbh*(10 + 24/8)
        (8, True, "selective", 213_909_504),  # sbh*34/8
        (8, False, "full", 100_663_296),  # 2*sbh
        (8, True, "full", 12_582_912),  # 2*sbh/8: with SP the stored layer input is the s/t slice
    ],
)
def test_table2_22b(tp, sp, recompute, expected):
    """Each Korthikanti 2022 Table 2 row for the 22B model, worked out by hand (full+SP is our choice)."""
    assert activation_bytes_per_layer(GPT_22B, 4, tp, sp, recompute) == expected


def test_table2_hand_constants():
    """The two hand-computed building blocks behind the table above."""
    assert SBH == 2048 * 4 * 6144 and ATT == SBH * 5 * 64 * 2048 // 6144
    assert activation_bytes_per_layer(GPT_22B, 4, 8, False, "none") == SBH * 13 + ATT // 8


def test_gqa_swiglu_by_hand():
    """Tiny GQA+SwiGLU, b=1, t=2, no SP, 16-bit:
    replicated: 4 tensors*2 B*sbh(32) + 2 masks*32 = 320;
    split: Q,K 2*4*(8+4)=96, V 2*4*4=32, attn-out input 2*32=64, swiglu in 2*4*24=192, down in 2*4*12=96
           -> 480/2 = 240;  scores: 4 heads*16*(2+1+2) = 320 -> /2 = 160.  Total 720."""
    assert activation_bytes_per_layer(TINY, 1, 2, False, "none") == 720
    assert activation_bytes_per_layer(TINY, 1, 2, False, "selective") == 560
    assert activation_bytes_per_layer(TINY, 1, 2, True, "none") == 160 + 240 + 160


def test_activation_bytes_per_elem_fp32():
    """fp32 activations double every stored tensor but not the 1-byte dropout masks."""
    two = activation_bytes_per_layer(GPT_22B, 4, 8, False, "selective")
    four = activation_bytes_per_layer(GPT_22B, 4, 8, False, "selective", bytes_per_elem=4)
    masks = 2 * SBH  # two hidden-size dropout masks, replicated without SP
    assert four == 2 * (two - masks) + masks


def test_model_state_bytes_zero_stages():
    """16 bytes/param fp16 mixed-precision Adam (ZeRO paper, Sec. 3.1: 2 + 2 + 12); stage k
    shards optimizer, then grads, then weights over dp. bf16 keeps fp32 gradients by default
    (Megatron-LM's main_grad), fp32 training has no master copy (4 + 4 + 8)."""
    p, dp = 1e9, 8
    assert model_state_bytes(p, dp, 0, "fp16") == {"weights": 2e9, "grads": 2e9, "optimizer": 12e9}
    assert model_state_bytes(p, dp, 1, "fp16") == {"weights": 2e9, "grads": 2e9, "optimizer": 1.5e9}
    assert model_state_bytes(p, dp, 2, "fp16") == {"weights": 2e9, "grads": 0.25e9, "optimizer": 1.5e9}
    assert model_state_bytes(p, dp, 3, "fp16") == {"weights": 0.25e9, "grads": 0.25e9, "optimizer": 1.5e9}
    assert model_state_bytes(p, dp, 0, "bf16") == {"weights": 2e9, "grads": 4e9, "optimizer": 12e9}
    assert model_state_bytes(p, dp, 0, "fp32") == {"weights": 4e9, "grads": 4e9, "optimizer": 8e9}
    with pytest.raises(InputError, match="allowed: 0, 1, 2, 3"):
        model_state_bytes(p, dp, 4)
    with pytest.raises(InputError, match="plan.precision"):
        model_state_bytes(p, dp, 0, "int8")


def test_stage_params_pp1_tp1_equals_total_params():
    """One stage holding every layer, first and last, tp=1: ModelSpec.total_params (independent count)."""
    for m in (GPT_22B, TINY):
        assert stage_params(m, m.num_layers, 1, True, True) == m.total_params


def test_stage_params_split():
    """pp>1 keeps a second copy of the word embedding on the last stage; TP splits all but 6h per layer,
    the position embedding and the final norm. Tiny layer by hand: attention 8*16 + 16 + 8*8 + 8 = 216,
    swiglu MLP 3*8*12 + 2*12 + 8 = 320, norms 4*8 = 32: 568 params, 6h = 48 replicated."""
    m = TINY
    assert m.params_per_layer == 568
    first = stage_params(m, 1, 1, True, False)
    last = stage_params(m, 1, 1, False, True)
    assert first + last == m.total_params + 16 * 8
    # tp=2: layer (568-48)/2 + 48 = 308; word embedding 16*8/2 = 64; position 4*8 = 32; final norm 16
    assert stage_params(m, 1, 2, True, False) == 308 + 64 + 32
    assert stage_params(m, 1, 2, False, True) == 308 + 64 + 16
    assert stage_params(m, 2, 2, False, False) == 616


def test_logits_bytes():
    """fp32 logits s*b*V/t*4 = 2048*4*51200/8*4 bytes."""
    assert logits_bytes(GPT_22B, 4, 8) == 209_715_200


def test_bad_recompute_and_tp():
    """Unknown recompute modes and a tp not dividing the heads raise InputError naming the value."""
    with pytest.raises(InputError, match="'partial'"):
        activation_bytes_per_layer(GPT_22B, 4, 8, False, "partial")
    with pytest.raises(InputError, match="tp=5"):
        activation_bytes_per_layer(GPT_22B, 4, 5, False, "none")


def test_fp32_gradient_buffer_makes_18_bytes_per_param():
    """bf16 training that accumulates gradients in fp32 holds 2 + 4 + 12 = 18 bytes per
    parameter without ZeRO, the figure BLOOM's planning used (chronicles-prequel.md:
    'params * 18 bytes'); ZeRO-1 then shards only the 12 optimizer bytes."""
    from costmodel.memory import model_state_bytes
    st = model_state_bytes(1e9, dp=8, zero=0, precision="bf16", grad_bytes=4)
    assert sum(st.values()) == 18e9
    st = model_state_bytes(1e9, dp=8, zero=1, precision="bf16", grad_bytes=4)
    assert sum(st.values()) == 2e9 + 4e9 + 12e9 / 8
