"""Framework runtimes (costmodel/profile.RUNTIMES, costmodel/profiles/runtime-*.yaml), fused
attention's time and FP8 as Transformer Engine runs it (costmodel/efficiency.py), checked
against hand-worked numbers."""
from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel import flops as fl
from costmodel.dtypes import fp8_weight_bytes, param_gather_bytes, topk_entry_bytes
from costmodel.efficiency import (FP8_EFF_RATIO, FP8_K_HALF_RATIO, causal_fraction, fp8_cast_ops, fused_attention_efficiency,
                                  op_time_s, ops_time_s)
from costmodel.errors import InputError
from costmodel.flops import Op
from costmodel.gpus import get_gpu
from costmodel.profile import (RUNTIMES, GpuEfficiency, RuntimeSettings, bundled_profiles, for_gpus, load_profile,
                               reshard_after_forward)
from costmodel.shapes import ModelSpec
from costmodel.yamlio import parse_yaml
from plansim.cli import main
from sim.program import stage_memory
from specs.model import load_model
from specs.plan import resolve_plan

H100 = get_gpu("H100-SXM5-80GB")
A100 = get_gpu("A100-SXM4-80GB")
FLAT = GpuEfficiency(gemm_eff_max=0.6, gemm_k_half=0.0, gemm_dim_half=0.0, hbm_eff=1.0, kernel_overhead_us=0.0,
                     attention_eff=0.4)


def test_every_runtime_loads_and_holds_only_software():
    """Each bundled runtime merges over the H100 hardware profile; its files hold only
    name/source/runtime (hardware stays in the hardware profiles); megatron-core turns on
    fused attention, TP-comm overlap and the overlapped parameter gather,
    megatron-lm-2022 none of them; an unknown name is an InputError naming --runtime."""
    from importlib import resources
    for name, files in RUNTIMES.items():
        prof = load_profile(None, bundled=("h100-ib-ndr",), runtime=name)
        assert prof.fabric("network").bw_eff == 0.94  # the hardware profile is untouched
        for f in files:
            assert f in bundled_profiles()
            text = resources.files("costmodel").joinpath(f"profiles/{f}.yaml").read_text()
            assert set(parse_yaml(text, f)) <= {"name", "source", "runtime"}
    core = load_profile(None, runtime="megatron-core").runtime
    old = load_profile(None, runtime="megatron-lm-2022").runtime
    assert core.flash_attention and core.tp_comm_overlap and core.overlap_param_gather
    assert not (old.flash_attention or old.tp_comm_overlap or old.overlap_param_gather)
    assert replace(old, source="") == replace(load_profile(None).runtime, source="")  # the old default
    with pytest.raises(InputError) as err:
        load_profile(None, runtime="jax")
    assert err.value.field == "--runtime"


def test_cli_runtime_flag(capsys):
    """`plansim simulate --runtime NAME` picks the runtime (megatron-core by default: fused
    attention makes a 4096-token Llama 3 8B step faster than megatron-lm-2022's unfused
    attention); a bad name exits 2 with one line."""
    args = ["simulate", "dgx-h100", "--nodes", "1", "--model", "llama3-8b", "--plan", "tp=8,mbs=1,sp=true", "--json"]
    import json
    assert main(args) == 0
    core = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(args + ["--runtime", "megatron-lm-2022"]) == 0
    old = json.loads(capsys.readouterr().out)["step_time_s"]
    assert core < old
    assert main(args + ["--runtime", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_fused_attention_off_without_kernels():
    """V100 has no FlashAttention kernels: on a cluster with V100s the runtime falls back
    to unfused attention; A100-only clusters keep it."""
    prof = load_profile(None, runtime="megatron-core")
    assert not for_gpus(prof, {"A100-SXM4-80GB", "V100-SXM2-32GB"}).runtime.flash_attention
    assert for_gpus(prof, {"A100-SXM4-80GB"}).runtime.flash_attention


def test_fused_attention_time_by_hand():
    """A causal fused-attention op at s = 4096, head dim 128 computes (1 + 128/4096)/2 of
    the full score FLOPs, at attention_eff x 4096/(4096+256) x 128/(128+16) of the peak."""
    assert causal_fraction(4096) == pytest.approx(33 / 64)
    assert causal_fraction(64) == 1.0
    eff = replace(FLAT, attention_eff=0.35)
    f = fused_attention_efficiency(4096, 128, eff)
    assert f == pytest.approx(0.35 * 4096 / 4352 * 128 / 144)
    op = Op("flash_attention", "flash_attention", 1e13, 0.0, 4096, 4096, 128, 32)
    assert op_time_s(op, H100, eff, "bf16") == pytest.approx(1e13 / (989.4e12 * f))
    # Transformer Engine runs attention in BF16 under FP8 training: same time.
    assert op_time_s(op, H100, eff, "fp8") == pytest.approx(op_time_s(op, H100, eff, "bf16"))


def test_fp8_gemm_at_its_own_efficiency():
    """A GEMM under fp8 runs at the 1,978.9 TFLOP/s FP8 peak, at FP8_EFF_RATIO x gemm_eff_max
    and a k-loop half point FP8_K_HALF_RATIO x gemm_k_half, the ratios of the two fits to
    tilelang's H800 sweeps (FP16 E = 785 TFLOP/s h = 262, FP8 E = 1,613 h = 458): 1.03 and
    1.75. By hand, gemm_eff_max 0.6, gemm_k_half 768, k = 16384: BF16 0.6 x 16384/17152,
    FP8 0.6 x 1.0273 x 16384/(16384 + 1342.6); the tile-wave factor of the 16384 x 16384
    output is the same for both and cancels in the ratio. On an A100 (no FP8 units) fp8
    falls back to BF16."""
    assert FP8_EFF_RATIO == pytest.approx((1613 / 1978.9) / (785 / 989.4), rel=1e-12)
    assert FP8_EFF_RATIO == pytest.approx(1.0273, abs=1e-4)
    assert FP8_K_HALF_RATIO == pytest.approx(1.7481, abs=1e-4)
    op = Op("g", "gemm", 2.0 * 16384 ** 3, 0.0, 16384, 16384, 16384)
    bf16, fp8 = op_time_s(op, H100, FLAT, "bf16"), op_time_s(op, H100, FLAT, "fp8")
    # FLAT has gemm_k_half 0: only the maximum differs.
    assert bf16 / fp8 == pytest.approx(FP8_EFF_RATIO * 1978.9 / 989.4, rel=1e-9)
    eff = replace(FLAT, gemm_k_half=768.0, sm_count=132)
    b, f = op_time_s(op, H100, eff, "bf16"), op_time_s(op, H100, eff, "fp8")
    e_b = 0.6 * 16384 / (16384 + 768)
    e_f = 0.6 * FP8_EFF_RATIO * 16384 / (16384 + 768 * FP8_K_HALF_RATIO)
    assert b / f == pytest.approx((1978.9 * e_f) / (989.4 * e_b), rel=1e-9)
    # A profile's own values win; an efficiency never exceeds 1.
    assert op_time_s(op, H100, replace(FLAT, gemm_eff_max_fp8=0.6), "fp8") == pytest.approx(bf16 * 989.4 / 1978.9)
    assert op_time_s(op, H100, replace(eff, gemm_eff_max_fp8=0.6, gemm_k_half_fp8=768.0), "fp8") == \
        pytest.approx(b * 989.4 / 1978.9)
    assert op_time_s(op, H100, replace(FLAT, gemm_eff_max=1.0), "fp8") == pytest.approx(op.flops / 1978.9e12)
    assert op_time_s(op, A100, FLAT, "fp8") == pytest.approx(op_time_s(op, A100, FLAT, "bf16"))


def test_fp8_cast_kernels():
    """Under FP8 every GEMM of a layer gets a cast-transpose kernel over its m x k input:
    read 2 B, write the FP8 tensor and its transpose (1 + 1 B) per element; the forward of a
    GPT layer has 4 GEMMs, so 4 casts of 4 B per element."""
    m = ModelSpec("m", 2, 1024, 16, 512, 32000, 8)
    ops = fl.layer_forward_ops(m, 1, 1, False)
    casts = [o for o in fp8_cast_ops(ops) if o.name.endswith("_fp8_cast")]
    gemms = [o for o in ops if o.kind == "gemm"]
    assert len(casts) == len(gemms) == 4
    assert sum(c.bytes for c in casts) == pytest.approx(sum(4.0 * g.m * g.k for g in gemms))
    # ops_time_s adds them only where FP8 runs natively.
    rt = RuntimeSettings(host_overhead_us=0.0)  # GPU time only
    cast_t = sum(op_time_s(c, H100, FLAT, "fp8") for c in casts)
    no_cast = sum(op_time_s(o, H100, FLAT, "fp8") for o in ops)
    assert ops_time_s(ops, H100, FLAT, "fp8", replace(rt, fused_bias_dropout_add=False)) == pytest.approx(no_cast + cast_t)


def test_fp8_memory_and_gathers():
    """FP8 under megatron-core keeps 2 B of FP8 weight copies per parameter (weight and
    transpose), under torchtitan none; ZeRO's gathers move 1 B per weight only with
    fp8_param_gather; other precisions are unaffected."""
    core = load_profile(None, runtime="megatron-core").runtime
    titan = load_profile(None, runtime="torchtitan").runtime
    assert fp8_weight_bytes("fp8", core) == 2.0 and fp8_weight_bytes("fp8", titan) == 0.0
    assert fp8_weight_bytes("bf16", core) == 0.0
    assert param_gather_bytes("fp8", core) == 2 and param_gather_bytes("fp8", replace(core, fp8_param_gather=True)) == 1
    assert param_gather_bytes("bf16", replace(core, fp8_param_gather=True)) == 2
    model = load_model("llama3-8b")
    plan = resolve_plan("tp=8,dp=1,mbs=1,sp=true,precision=fp8", model, 8)
    mem = stage_memory(model, plan, core, 0, plan.mb_shares[0])
    params = mem["weights"] / 2  # bf16 working weights
    assert mem["fp8_weights"] == pytest.approx(2 * params)
    assert stage_memory(model, plan, titan, 0, plan.mb_shares[0])["fp8_weights"] == 0.0


def test_topk_entry_is_index_plus_gradient_buffer_value():
    """A kept top-k entry is a 4 B int32 index plus its value in the gradient buffer's
    dtype: 8 B for fp32 training and for bf16 (fp32 main gradients), 6 B for fp16 (2 B
    gradients) and for bf16 with a runtime that reduces gradients in bf16."""
    assert topk_entry_bytes("fp32") == 8 and topk_entry_bytes("bf16") == 8
    assert topk_entry_bytes("fp16") == 6
    core = load_profile(None, runtime="megatron-core").runtime
    assert topk_entry_bytes("bf16", replace(core, grad_reduce_dtype="bf16")) == 6


def test_reshard_after_forward_policy():
    """TorchTitan's 'default' reshards after forward only without pipeline parallelism
    (torchtitan/distributed/fsdp.py); 'always' and 'never' ignore pp."""
    titan = load_profile(None, runtime="torchtitan").runtime
    assert reshard_after_forward(titan, 1) and not reshard_after_forward(titan, 4)
    assert reshard_after_forward(replace(titan, fsdp_reshard_after_forward="always"), 4)
    assert not reshard_after_forward(replace(titan, fsdp_reshard_after_forward="never"), 1)


def test_fsdp_kept_weights_in_memory():
    """ZeRO-3 under torchtitan with pp > 1 keeps the gathered layers for the whole step
    (reshard_after_forward is False): the device holds its unsharded bf16 weights, 2 B per
    parameter, beside its 1/dp shard; with pp = 1 (resharded after forward) it does not."""
    titan = load_profile(None, runtime="torchtitan").runtime
    model = load_model("llama3-8b")
    plan = resolve_plan("tp=1,pp=2,dp=4,mbs=1,zero=3", model, 8)
    mem = stage_memory(model, plan, titan, 0, plan.mb_shares[0])
    params = mem["weights"] * 4 / 2  # the shard is 1/dp of the bf16 weights
    assert mem["fsdp_gathered"] == pytest.approx(2 * params)
    flat = resolve_plan("tp=1,pp=1,dp=8,mbs=1,zero=3", model, 8)
    assert stage_memory(model, flat, titan, 0, flat.mb_shares[0])["fsdp_gathered"] == 0.0
