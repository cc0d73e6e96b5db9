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


def test_sp_saved_gathered_inputs_by_hand():
    """With SP where backward does not gather the GEMM inputs again (the validator's runner:
    runtime sp_regather_input false), the QKV and MLP-up inputs are kept whole [s, b, h].
    Tiny GQA+SwiGLU, b=1, t=2, 16-bit: those two 2*2*32 = 128 B whole; LN inputs and masks
    (2*2*32 + 2*32 = 192) / 2 = 96; split 240 and scores 160 as above: 624, i.e. 64 B more
    than Megatron's 560. 22B, b=4, t=8: 4 sbh + (6 + 24) sbh/8 + 5as^2b/8."""
    assert activation_bytes_per_layer(TINY, 1, 2, True, "none", sp_saves_gathered=True) == 624
    assert activation_bytes_per_layer(GPT_22B, 4, 8, True, "none", sp_saves_gathered=True) == \
        SBH * 4 + SBH * 30 // 8 + ATT // 8 == 1_061_158_912
    # Without SP nothing is split along the sequence: the flag changes nothing; full
    # recompute keeps only the layer input (the s/t slice).
    assert activation_bytes_per_layer(TINY, 1, 2, False, "none", sp_saves_gathered=True) == 720
    assert activation_bytes_per_layer(GPT_22B, 4, 8, True, "full", sp_saves_gathered=True) == 12_582_912


def test_sp_saved_inputs_reach_the_device_peak():
    """End to end through sim.program.stage_memory: tp=8, sp, pp=2 1F1B on the 22B model
    (48 layers, 24 a stage; stage 0 holds 2 microbatches in flight, pp=2), the runtime
    that saves gathered inputs has exactly 24 x 2 x (4 sbh - 4 sbh/8) more activations than
    Megatron's; nothing else moves."""
    from dataclasses import replace

    from costmodel.profile import load_profile
    from sim.program import stage_memory
    from specs.plan import resolve_plan

    model = replace(GPT_22B, global_batch_size=32)
    plan = resolve_plan("tp=8,pp=2,dp=1,mbs=4,sp=true", model, 16)
    megatron = load_profile(None).runtime
    assert megatron.sp_regather_input
    saved = replace(megatron, sp_regather_input=False)
    m = plan.mb_shares[0]
    a, b = stage_memory(model, plan, megatron, 0, m), stage_memory(model, plan, saved, 0, m)
    assert b["activations"] - a["activations"] == 24 * 2 * (4 * SBH - 4 * SBH / 8)
    assert {k: v for k, v in a.items() if k != "activations"} == {k: v for k, v in b.items() if k != "activations"}


def test_no_dropout_by_hand():
    """Without dropout no masks are kept and the softmax output feeds the probabilities x V
    GEMM directly. 22B, b=4, t=8, 16-bit: Korthikanti's sbh*(10 + 24/8) + 5as^2b/8 loses
    the two 1-byte hidden masks (2 sbh) and, of the 5as^2b/8 scores term, the 1-byte mask
    and the 2-byte dropout output: sbh*(8 + 3) + 2as^2b/8."""
    got = activation_bytes_per_layer(GPT_22B, 4, 8, False, "none", dropout=False)
    assert got == SBH * 11 + ATT * 2 // 5 // 8 == 822_083_584
    # With SP the replicated part is split too: 32 sbh/8 + 2as^2b/8; flash attention keeps
    # the log-sum-exp either way (no scores, no masks).
    assert activation_bytes_per_layer(GPT_22B, 4, 8, True, "none", dropout=False) == SBH * 4 + ATT * 2 // 5 // 8
    assert activation_bytes_per_layer(GPT_22B, 4, 8, True, "none", dropout=False, flash_attention=True) == \
        SBH * 4 + 4 * 64 * 2048 * 4 // 8


def test_grouped_query_copy_by_hand():
    """Tiny GQA (4 query heads in 2 K/V groups), t=1: both groups on one rank, so the query
    heads are copied out of the grouped projection, e*sbh = 2*32 = 64 B more than the 720 of
    test_gqa_swiglu_by_hand (t=2 there: one group a rank, no copy). Multi-head attention
    (one query head a group) never copies."""
    base = activation_bytes_per_layer(TINY, 1, 1, False, "none")
    replicated, split, scores = 4 * 2 * 32 + 2 * 32, 480, 4 * 16 * 5
    assert base == replicated + split + 64 + scores == 1184
    # MHA, h=8, 4 heads, f=32 (gelu), s=4: replicated 320; Q,K 2*4*16 + V 64 + attention-out
    # input 64 + MLP 2*(2*4*32) = 768; scores 320: 1408, no copy.
    mha = ModelSpec("mha", 2, 8, 4, 4, 16, 1)
    assert activation_bytes_per_layer(mha, 1, 1, False, "none") == 320 + 768 + 320 == 1408


def test_output_end_bytes_by_hand():
    """The last stage's output end per microbatch: final norm input and logits-GEMM input
    (e*sbh each, both /t with SP) and the fp32 softmax s*b*V/t*4. 22B, b=4, t=8, 16-bit:
    2*2*sbh + 4*2048*4*51200/8 = 201,326,592 + 209,715,200; with SP: /8 on the first two;
    with SP and the gathered GEMM input saved, that one stays whole."""
    from costmodel.memory import head_activation_bytes
    assert head_activation_bytes(GPT_22B, 4, 8, False) == 4 * SBH + 209_715_200 == 411_041_792
    assert head_activation_bytes(GPT_22B, 4, 8, True) == 4 * SBH / 8 + 209_715_200
    assert head_activation_bytes(GPT_22B, 4, 8, True, sp_saves_gathered=True) == 2 * SBH / 8 + 2 * SBH + 209_715_200


def test_gpipe_last_stage_holds_every_output_end():
    """device_memory: GPipe's last stage holds all m microbatches' output ends (each keeps its
    softmax until its backward), 1F1B's one. 22B, tp=8, pp=2 (24 layers a stage), 8
    microbatches of 4: logits = 8 x head vs 1 x head; activations 8 x 24 vs 1 x 24 layers
    (1F1B's last stage runs each forward's backward next)."""
    from costmodel.memory import head_activation_bytes
    from costmodel.profile import load_profile
    from sim.program import stage_memory
    from specs.plan import resolve_plan

    model = ModelSpec("gpt-22b", 48, 6144, 64, 2048, 51200, 32)
    rt = load_profile(None).runtime
    head = head_activation_bytes(model, 4, 8, False)
    layer = activation_bytes_per_layer(model, 4, 8, False, "none")
    for schedule, held in (("gpipe", 8), ("1f1b", 1)):
        plan = resolve_plan(f"tp=8,pp=2,dp=1,mbs=4,schedule={schedule}", model, 16)
        mem = stage_memory(model, plan, rt, 1, plan.mb_shares[0])
        assert mem["logits"] == held * head and mem["activations"] == held * 24 * layer, schedule


def test_llama_parameter_count_by_hand():
    """Llama 3 8B (Dubey et al. 2024, Table 3: 32 layers, h 4096, 8 K/V heads of 128, ffn
    14336, V 128256), untied, RoPE, no biases, RMSNorm: per layer 4096 x (4096 + 2 x 1024)
    + 4096^2 + 3 x 4096 x 14336 + 2 x 4096 = 218,112,000; x 32 = 6,979,584,000; plus the
    token embedding and the output layer, 2 x 128256 x 4096 = 1,050,673,152, and the final
    norm's 4096: 8,030,261,248 (the published 8.03 B). With GPT-3's choices (tied, learned
    8192-position table, biases, LayerNorm) the same shape counts 7,540,121,600."""
    from dataclasses import replace

    from specs.model import PRESETS
    m = PRESETS["llama3-8b"]
    assert m.params_per_layer == 218_112_000
    assert m.total_params == 8_030_261_248
    gpt_style = replace(m, tie_embeddings=True, position_embedding="learned", linear_bias=True,
                        normalization="layernorm")
    assert gpt_style.total_params == 7_540_121_600


def test_untied_stage_params_by_hand():
    """TINY untied with RMSNorm and no biases, tp=2: a layer holds its matrices split,
    8 x (8 + 2 x 4) + 8 x 8 + 3 x 8 x 12 = 480 / 2 = 240, plus two replicated norms of 8:
    256. First stage of pp=2 (1 layer): + V*h/t = 64, no position table (RoPE): 320. Last
    stage: + final norm 8 + its own output layer 64: 328. pp=1: both matrices, 256 x 2 +
    64 + 64 + 8 = 648, where the tied model counts the one matrix once."""
    from dataclasses import replace
    llama = replace(TINY, tie_embeddings=False, position_embedding="rope", linear_bias=False,
                    normalization="rmsnorm")
    assert stage_params(llama, 1, 2, True, False) == 320
    assert stage_params(llama, 1, 2, False, True) == 328
    assert stage_params(llama, 2, 2, True, True) == 648
    assert stage_params(replace(llama, tie_embeddings=True), 2, 2, True, True) == 648 - 64
    # Every parameter is somewhere: both TP ranks' stages, less the second copy of each
    # replicated norm (two of 8 in each of 2 layers, and the final one): 1296 - 40 = 1256.
    assert 2 * (320 + 328) - (2 * 2 * 8 + 8) == llama.total_params == 1256


def test_rope_keeps_the_rotated_q_and_k():
    """RoPE's rotated Q and K are new tensors attention keeps beside the fused projection's
    output: e*s*b*(h + g)/t more a layer. TINY (s 4, h 8, g 4), b=2, t=2, e=2: 2 x 4 x 2 x 12
    / 2 = 96 B. With two K/V groups on one rank (t=1), GQA's query copy (e*sbh = 128 B) is
    RoPE's input only, not kept: the difference is 2 x 4 x 2 x 12 - 128 = 64 B."""
    from dataclasses import replace
    rope = replace(TINY, position_embedding="rope")
    for t, diff in ((2, 96), (1, 64)):
        got = activation_bytes_per_layer(rope, 2, t, False, "none", flash_attention=True) - \
            activation_bytes_per_layer(TINY, 2, t, False, "none", flash_attention=True)
        assert got == diff
