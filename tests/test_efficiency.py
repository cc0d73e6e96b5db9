"""Cost of operations on one GPU (costmodel/efficiency.py), the hardware profiles that
parameterise it (costmodel/profile.py) and the per-layer times sim/program.py derives.

Numbers are worked out by hand from the formulas in the module docstrings, or compared with
Korthikanti et al. 2022 Table 4 (docs/facts.md), the published per-layer times of the
22B model on A100 80GB that the A100 entry of the default profile is checked against.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import yaml

from costmodel import flops as fl
from costmodel.efficiency import (OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_KERNELS, gemm_efficiency, op_time_s,
                                  ops_time_s, optimizer_time_s, transform_ops, wave_utilisation)
from costmodel.errors import InputError
from costmodel.gpus import get_gpu
from costmodel.profile import (GpuEfficiency, RuntimeSettings, bundled_profiles, load_profile,
                               profile_to_dict)
from costmodel.shapes import ModelSpec
from specs.plan import resolve_plan
from sim.program import chunk_work, grad_accumulation_ops
from sim.tp_comm import tp_ends_comm_s, tp_layer_comm_s
from specs.topology import load_topology

A100 = get_gpu("A100-SXM4-80GB")
M22 = ModelSpec("22b", 48, 6144, 64, 2048, 51200, 4)  # Korthikanti et al. 2022, 22B


# ------------------------------------------------------------------ GEMM shape model
def test_wave_utilisation_hand_count():
    """8192 x 2304 output on 108 SMs: 256x128 tiles give 32*18 = 576 tiles in 6 waves of 108
    (576/648 = 0.889); 128x128 tiles give 1152 in 11 waves, 0.9 * 1152/1188 = 0.873; 64x64
    give 4608 in 43 waves, 0.6 * 4608/4644 = 0.595. The best is the large tile."""
    assert wave_utilisation(8192, 2304, 1, 108) == pytest.approx(576 / 648)
    # One full wave of 256x128 tiles: 108 tiles = 12 x 9 -> 3072 x 1152 is exactly used.
    assert wave_utilisation(3072, 1152, 1, 108) == pytest.approx(1.0)
    # Batched: 27 copies of a 1024 x 512 output (4 x 4 = 16 tiles each) = 432 tiles = 4 waves.
    assert wave_utilisation(1024, 512, 27, 108) == pytest.approx(1.0)


def test_gemm_efficiency_formula_and_skinny_shapes():
    """eff = gemm_eff_max * k/(k + k_half) * utilisation; a GEMM slimmed by tensor parallelism
    (attention-out of GPT-3 175B at t = 8: k = 12288/8) is slower than the unsliced one, and
    one with a tiny output runs far below peak."""
    eff = load_profile(None).gpu("A100-SXM4-80GB")
    m, n, k = 8192, 2304, 6144
    assert gemm_efficiency(m, n, k, eff) == pytest.approx(
        eff.gemm_eff_max * k / (k + eff.gemm_k_half) * wave_utilisation(m, n, 1, eff.sm_count))
    full = gemm_efficiency(2048, 12288, 12288, eff)
    sliced = gemm_efficiency(2048, 12288, 12288 // 8, eff)
    assert sliced < full <= eff.gemm_eff_max
    assert gemm_efficiency(128, 128, 128, eff) < 0.1 * eff.gemm_eff_max
    # Without an SM count (generic devices) m and n saturate as d / (d + dim_half).
    gen = GpuEfficiency(gemm_eff_max=0.8, gemm_k_half=0.0, gemm_dim_half=64.0)
    assert gemm_efficiency(64, 192, 10, gen) == pytest.approx(0.8 * 0.5 * 0.75)


def test_roofline_and_kernel_overhead():
    """A GEMM takes max(FLOPs / (peak * eff), bytes / (bandwidth * hbm_eff)) + overhead; an
    elementwise op only its memory time + overhead."""
    eff = load_profile(None).gpu("A100-SXM4-80GB")
    op = fl.Op("g", "gemm", 2.0 * 8192 * 2304 * 6144, 1e6, 8192, 2304, 6144)
    comp = op.flops / (312e12 * gemm_efficiency(8192, 2304, 6144, eff))
    assert op_time_s(op, A100, eff, "bf16") == pytest.approx(comp + eff.kernel_overhead_us * 1e-6)
    mem = fl.Op("ln", "memory", 0.0, 4e9)
    assert op_time_s(mem, A100, eff, "bf16") == pytest.approx(
        4e9 / (2039e9 * eff.hbm_eff) + eff.kernel_overhead_us * 1e-6)


def test_elementwise_arithmetic_bound_only_where_the_profile_prices_it():
    """A CPU GELU over 2^20 fp32 elements (8 FLOPs and 8 B each as costmodel/flops.py counts
    it) at hbm_eff 0.1 of the CPU ceiling's 200 GB/s (20 GB/s: 0.4194 ms of traffic) and
    vector_flops_eff 0.01 of its 0.5 TFLOP/s (5 GFLOP/s: 1.6777 ms of arithmetic) takes the
    arithmetic's 1.6777 ms + 5 us; an add of the same size (1 FLOP, 12 B) its traffic's
    0.6291 ms + 5 us (0.2097 ms of arithmetic). With vector_flops_eff unset (0, every bundled
    GPU profile) the GELU takes its traffic alone, 0.4194 ms + 5 us."""
    cpu = get_gpu("CPU")
    n = 1 << 20
    gelu = fl.Op("gelu", "memory", float(fl.ELEMENTWISE_FLOPS_PER_ELEM["gelu"] * n), 8.0 * n)
    add = fl.Op("residual", "memory", float(fl.ELEMENTWISE_FLOPS_PER_ELEM["add"] * n), 12.0 * n)
    eff = GpuEfficiency(hbm_eff=0.1, vector_flops_eff=0.01, kernel_overhead_us=5.0)
    assert op_time_s(gelu, cpu, eff, "fp32") == pytest.approx(8 * n / 5e9 + 5e-6)
    assert op_time_s(gelu, cpu, eff, "fp32") == pytest.approx(1.6777e-3 + 5e-6, rel=1e-4)
    assert op_time_s(add, cpu, eff, "fp32") == pytest.approx(12 * n / 20e9 + 5e-6)
    assert op_time_s(gelu, cpu, replace(eff, vector_flops_eff=0.0), "fp32") == pytest.approx(0.4194e-3 + 5e-6, rel=1e-4)
    assert all(g.vector_flops_eff == 0.0 for p in bundled_profiles() for g in load_profile(None, bundled=[p]).gpus.values())


# ------------------------------------------------------------------ framework transforms
def test_fused_bias_dropout_add_saves_one_write_and_read():
    """Dropout (2e+1 bytes per element) then residual (3e) fuse into one kernel of 3e+1:
    read the branch and the residual, write the sum and the mask."""
    x = fl.layer_forward_ops(M22, 4, 8, False)
    fused = transform_ops(x, RuntimeSettings())
    hid = 4 * 2048 * 6144
    bda = [o for o in fused if o.name == "bias_dropout_add"]
    assert len(bda) == 2 and not any(o.name in ("dropout", "residual") for o in fused)
    assert bda[0].bytes == pytest.approx(hid * (3 * 2 + 1))
    assert len(transform_ops(x, replace(RuntimeSettings(), fused_bias_dropout_add=False))) == len(x)


def test_flash_attention_drops_score_traffic():
    """Flash attention: the core-attention ops of a pass become one kernel with the same
    matmul FLOPs forward (5/4 of them backward, for recomputing QK^T) times the causal
    share of 128-wide tiles at s = 2048, (1 + 128/2048)/2 = 17/32, moving only Q, K, V
    and O, and no s x s softmax or dropout ops remain."""
    rt = replace(RuntimeSettings(), flash_attention=True)
    q = 4 * 2048 * (6144 // 8) * 2  # one b*s*h/t tensor in bytes (Q, K, V, O all this size here)
    # Forward reads Q, K, V and writes O; backward reads Q, K, V, O, dO and writes dQ, dK, dV.
    cases = ((fl.layer_forward_ops(M22, 4, 8, False), 1.0, 4 * q), (fl.layer_backward_ops(M22, 4, 8, False), 1.25, 8 * q))
    for ops, factor, io in cases:
        out = transform_ops(ops, rt)
        fa = [o for o in out if o.kind == "flash_attention"]
        assert len(fa) == 1
        assert not any(o.name in ("softmax", "attn_dropout", "softmax_bwd", "attn_dropout_bwd") for o in out)
        attn = sum(o.flops for o in ops if o.kind == "attention")
        assert fa[0].flops == pytest.approx(factor * attn * 17 / 32)
        assert (fa[0].m, fa[0].k) == (2048, 96)  # s, head dim 6144/64
        assert fa[0].bytes == pytest.approx(io)
        unfused = sum(o.bytes for o in ops if o.kind == "attention" or o.name in ("softmax", "attn_dropout",
                                                                                  "softmax_bwd", "attn_dropout_bwd"))
        assert fa[0].bytes < unfused / 5


def test_host_overhead_async_max_blocking_sum():
    """Three ops of 2, 20 and 2 us on the GPU (kernel overhead 0) and 10 us of CPU each:
    asynchronous launches take max(24, 30) = 30 us, launch blocking 24 + 30 = 54 us."""
    eff = GpuEfficiency(hbm_eff=1.0, kernel_overhead_us=0.0)
    bw = A100.mem_bw_Bps
    ops = [fl.Op(f"m{i}", "memory", 0.0, t * 1e-6 * bw) for i, t in enumerate((2, 20, 2))]
    rt = replace(RuntimeSettings(), host_overhead_us=10.0, fused_bias_dropout_add=False)
    assert ops_time_s(ops, A100, eff, "bf16", rt) == pytest.approx(30e-6)
    assert ops_time_s(ops, A100, eff, "bf16", replace(rt, launch_blocking=True)) == pytest.approx(54e-6)
    assert ops_time_s(ops, A100, eff, "bf16") == pytest.approx(24e-6)  # no runtime: GPU time only


def test_optimizer_step_bytes():
    """fp16 mixed-precision Adam streams 54 B per parameter (grad copy, unscale, norm, Adam,
    weight copy, zero), bf16 42 B, plus one kernel overhead per fused multi-tensor kernel."""
    eff = load_profile(None).gpu("A100-SXM4-80GB")
    p = 2.75e9
    for prec, per in (("fp16", 54.0), ("bf16", 42.0), ("fp32", 36.0)):
        assert OPTIMIZER_BYTES_PER_PARAM[prec] == per
        want = p * per / (2039e9 * eff.hbm_eff) + OPTIMIZER_KERNELS * eff.kernel_overhead_us * 1e-6
        assert optimizer_time_s(p, A100, eff, prec) == pytest.approx(want)
    assert optimizer_time_s(0, A100, eff) == 0.0


def test_grad_accumulation_pass_bytes():
    """Without fused accumulation every microbatch reads the accumulator and the new gradient
    and writes the accumulator: params * (2 * 2 + 2) bytes for bf16 accumulation, * (2 * 4 + 2)
    for fp32; fused (Megatron-LM) there is no extra pass."""
    from costmodel import memory as mem
    rt = replace(RuntimeSettings(), grad_accumulation_fusion=False, grad_reduce_dtype="bf16")
    params = mem.stage_params(M22, 1, 8, False, False)
    (op,) = grad_accumulation_ops(M22, 1, 8, False, False, "bf16", rt)
    assert op.bytes == pytest.approx(params * 6)
    (op32,) = grad_accumulation_ops(M22, 1, 8, False, False, "bf16", replace(rt, grad_reduce_dtype="fp32"))
    assert op32.bytes == pytest.approx(params * 10)
    assert grad_accumulation_ops(M22, 1, 8, False, False, "bf16", RuntimeSettings()) == []


# ------------------------------------------------------------------ tensor-parallel communication
def test_tp_comm_sequence_parallel_same_volume_and_overlap():
    """With no latency and no call cost, SP's all-gather + reduce-scatter moves exactly an
    all-reduce's bytes, so forward TP time is equal; an overlapped backward collective costs
    max(0, c - w) + slowdown * min(c, w)."""
    cluster = load_topology("dgx-a100", nodes=1)
    prof = load_profile(None)
    prof = replace(prof, fabrics={**prof.fabrics, "nvswitch": replace(prof.fabrics["nvswitch"], call_latency_us=0.0,
                                                                      compute_slowdown=0.0)})
    ranks = list(range(8))
    act = 4 * 2048 * 6144 * 2
    eff = prof.gpu(A100.name)
    b_ops = fl.layer_backward_ops(M22, 4, 8, False)
    f_tp, b_tp = tp_layer_comm_s(cluster, prof, ranks, act, False, "none", b_ops, A100, eff, "fp16")
    f_sp, _ = tp_layer_comm_s(cluster, prof, ranks, act, True, "none", b_ops, A100, eff, "fp16")
    lat = 1e-6  # the NVSwitch GPU-to-GPU latency of dgx-a100.yaml, per ring step
    ar = 2 * 7 / 8 * act / (300e9 * 0.77)
    assert f_tp == pytest.approx(2 * (ar + 14 * lat))
    assert f_sp == pytest.approx(2 * (ar + 14 * lat))
    # Backward: the input-gradient all-reduce (ar) beside each weight-gradient GEMM.
    w = {o.name: op_time_s(o, A100, eff, "fp16") for o in b_ops}
    c = ar + 14 * lat
    assert b_tp == pytest.approx(max(0, c - w["qkv_wgrad"]) + max(0, c - w["mlp_up_wgrad"]))
    slow = replace(prof, fabrics={**prof.fabrics, "nvswitch": replace(prof.fabrics["nvswitch"], call_latency_us=0.0,
                                                                      compute_slowdown=0.25)})
    _, b_slow = tp_layer_comm_s(cluster, slow, ranks, act, False, "none", b_ops, A100, eff, "fp16")
    assert b_slow - b_tp == pytest.approx(0.25 * (min(c, w["qkv_wgrad"]) + min(c, w["mlp_up_wgrad"])))
    no_overlap = replace(prof, runtime=replace(prof.runtime, tp_bwd_overlap=False))
    _, b_no = tp_layer_comm_s(cluster, no_overlap, ranks, act, False, "full", b_ops, A100, eff, "fp16")
    assert b_no == pytest.approx(4 * c)  # two backward + the recomputed forward's two


def test_sp_backward_regather_is_a_runtime_fact():
    """With SP and no backward overlap, a layer's backward is 2 x (all-gather + reduce-
    scatter + the re-gather of the GEMM input) under Megatron (sp_regather_input) and one
    all-gather less per block where the gathered input was saved (the validator's runner):
    the difference is exactly 2 all-gathers of the activation, (n-1)/n S/B + (n-1) alpha
    each, at tp=8 on NVSwitch with no call cost."""
    cluster = load_topology("dgx-a100", nodes=1)
    prof = load_profile(None)
    prof = replace(prof, fabrics={**prof.fabrics, "nvswitch": replace(prof.fabrics["nvswitch"], call_latency_us=0.0)},
                   runtime=replace(prof.runtime, tp_bwd_overlap=False))
    ranks, act = list(range(8)), 4 * 2048 * 6144 * 2
    eff = prof.gpu(A100.name)
    b_ops = fl.layer_backward_ops(M22, 4, 8, True)
    _, regather = tp_layer_comm_s(cluster, prof, ranks, act, True, "none", b_ops, A100, eff, "fp16")
    saved = replace(prof, runtime=replace(prof.runtime, sp_regather_input=False))
    _, kept = tp_layer_comm_s(cluster, saved, ranks, act, True, "none", b_ops, A100, eff, "fp16")
    assert regather - kept == pytest.approx(2 * (7 / 8 * act / (300e9 * 0.77) + 7 * 1e-6))


def test_tp_ends_of_the_stack_hand_worked():
    """The vocabulary-parallel embedding and loss at tp=8 on one DGX A100 (NVSwitch 300 GB/s
    x bw_eff 0.77, 1 us a ring step, call cost 7 us here), per microbatch of 2048 tokens:
    first stage forward one all-reduce of the b*s*h activation; last stage backward one
    (the logits' input gradient), forward the loss's two all-reduces of 2048 and 2 x 2048
    fp32 values; with SP the activation's all-reduces become an all-gather (first stage
    backward, last stage forward) and a reduce-scatter (last stage backward). One rank: none."""
    cluster = load_topology("dgx-a100", nodes=1)
    prof = load_profile(None)
    prof = replace(prof, fabrics={**prof.fabrics, "nvswitch": replace(prof.fabrics["nvswitch"], call_latency_us=7.0,
                                                                      all_reduce_call_us=None,
                                                                      all_gather_call_us=None,
                                                                      reduce_scatter_call_us=None)})
    ranks, act, tokens = list(range(8)), 2048 * 6144 * 2, 2048
    bw, steps, call = 300e9 * 0.77, 14 * 1e-6, 7e-6

    def ar(nbytes):  # 2(n-1)/n S/B + 2(n-1) alpha + the call
        return 2 * 7 / 8 * nbytes / bw + steps + call
    half = 7 / 8 * act / bw + 7 * 1e-6 + call  # all-gather or reduce-scatter: (n-1)/n S/B + (n-1) alpha
    loss = ar(4 * tokens) + ar(8 * tokens)
    assert tp_ends_comm_s(cluster, prof, ranks, act, False, True, False, tokens) == pytest.approx((ar(act), 0.0))
    assert tp_ends_comm_s(cluster, prof, ranks, act, False, False, True, tokens) == pytest.approx((loss, ar(act)))
    assert tp_ends_comm_s(cluster, prof, ranks, act, True, True, True, tokens) == pytest.approx(
        (ar(act) + half + loss, half + half))
    assert tp_ends_comm_s(cluster, prof, [0], act, True, True, True, tokens) == (0.0, 0.0)


# ------------------------------------------------------------------ published per-layer times
TABLE4 = {  # (recompute, sp) -> (forward ms, backward ms); Korthikanti et al. 2022, Table 4
    ("none", False): (7.7, 11.9), ("none", True): (7.2, 11.8), ("full", False): (7.7, 19.5),
    ("selective", False): (7.7, 13.2), ("selective", True): (7.2, 13.1),
}


@pytest.mark.parametrize("key", sorted(TABLE4))
def test_per_layer_times_match_korthikanti_table4(key):
    """One layer of the 22B model (TP 8, microbatch 4, fp16, one DGX A100 node): forward and
    backward (recompute included) within 5 % of the published times, and the total within
    3 %, with the bundled A100 profile."""
    recompute, sp = key
    cluster = load_topology("dgx-a100", nodes=1)
    plan = resolve_plan(f"tp=8,mbs=4,recompute={recompute},sp={str(sp).lower()},precision=fp16", M22, 8)
    w = chunk_work(M22, plan, cluster, load_profile(None, bundled=["a100-ib-hdr"]), 0, 1, False, False)
    fwd, bwd = (w.fwd_s + w.fwd_tp_s) * 1e3, (w.bwd_s + w.bwd_tp_s) * 1e3
    pf, pb = TABLE4[key]
    assert fwd == pytest.approx(pf, rel=0.05)
    assert bwd == pytest.approx(pb, rel=0.05)
    assert fwd + bwd == pytest.approx(pf + pb, rel=0.03)


def test_recompute_and_sp_deltas_match_table4():
    """The differences Table 4 isolates: full recompute adds a forward (7.6 ms), selective
    recompute the core attention (1.3 ms), SP saves 0.5 ms forward; each within 0.35 ms."""
    cluster = load_topology("dgx-a100", nodes=1)
    prof = load_profile(None, bundled=["a100-ib-hdr"])

    def layer(rc, sp):
        plan = resolve_plan(f"tp=8,mbs=4,recompute={rc},sp={sp},precision=fp16", M22, 8)
        w = chunk_work(M22, plan, cluster, prof, 0, 1, False, False)
        return (w.fwd_s + w.fwd_tp_s) * 1e3, (w.bwd_s + w.bwd_tp_s) * 1e3

    base_f, base_b = layer("none", "false")
    assert layer("full", "false")[1] - base_b == pytest.approx(7.6, abs=0.35)
    assert layer("selective", "false")[1] - base_b == pytest.approx(1.3, abs=0.35)
    assert base_f - layer("none", "true")[0] == pytest.approx(0.5, abs=0.35)


# ------------------------------------------------------------------ profiles
def test_bundled_profiles_load_and_cite_sources():
    """Every bundled profile loads over the default and every entry it sets has a source."""
    names = bundled_profiles()
    assert {"default", "a100-ib-hdr", "a100-opa", "runtime-megatron-deepspeed"} <= set(names)
    from importlib import resources
    for name in names:
        data = yaml.safe_load(resources.files("costmodel").joinpath(f"profiles/{name}.yaml").read_text())
        for section in ("gpus", "fabrics"):
            for key, entry in (data.get(section) or {}).items():
                assert entry.get("source"), f"{name}: {section}.{key} has no source"
        if data.get("runtime"):
            assert data["runtime"].get("source"), f"{name}: runtime has no source"
        load_profile(None, bundled=[name])


def test_profile_merge_order_and_overlays(tmp_path):
    """Bundled overlays merge in order over the default, the user's file last, key by key;
    runtime sources accumulate so each setting keeps its citation."""
    p = load_profile(None, bundled=["a100-opa", "runtime-megatron-deepspeed", "runtime-deepspeed-bf16-optimizer"])
    assert p.fabric("nic").bw_eff == load_profile(None, bundled=["a100-opa"]).fabrics["network"].bw_eff
    assert p.runtime.launch_blocking and p.runtime.zero1_grad_all_reduce and p.runtime.grad_reduce_dtype == "fp32"
    assert "CUDA_LAUNCH_BLOCKING" in p.runtime.source and "BF16_Optimizer" in p.runtime.source
    user = tmp_path / "u.yaml"
    user.write_text("fabrics: {network: {bw_eff: 0.5}}\nruntime: {launch_blocking: false}\n")
    q = load_profile(str(user), bundled=["a100-opa", "runtime-megatron-deepspeed"])
    assert q.fabric("nic").bw_eff == 0.5 and q.fabric("nic").call_latency_us == p.fabric("nic").call_latency_us
    assert not q.runtime.launch_blocking and q.runtime.p2p_blocking  # the user's key only
    assert load_profile("a100-ib-hdr").fabric("nic").bw_eff == pytest.approx(0.96)  # a bundled name


@pytest.mark.parametrize("text,field", [
    ("runtime: {launch_blocking: 3}\n", "runtime.launch_blocking"),
    ("runtime: {grad_reduce_dtype: int8}\n", "runtime.grad_reduce_dtype"),
    ("gpus: {A100-SXM4-80GB: {hbm_eff: 1.5}}\n", "gpus.A100-SXM4-80GB.hbm_eff"),
    ("fabrics: {nvswitch: {bw_gbps: 3}}\n", "fabrics.nvswitch.bw_gbps"),
    ("runtimes: {}\n", "runtimes"),
])
def test_bad_profile_names_the_field(tmp_path, text, field):
    """A bad value or key raises one InputError naming its dotted path."""
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError) as err:
        load_profile(str(f))
    assert err.value.field == field


def test_profile_round_trip(tmp_path):
    """profile_to_dict writes what load_profile reads back to the same profile."""
    p = load_profile(None, bundled=["a100-opa", "runtime-megatron-deepspeed"])
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(profile_to_dict(p)))
    q = load_profile(str(f))
    assert q.gpus == p.gpus and q.fabrics == p.fabrics and q.runtime == p.runtime
    assert not math.isnan(q.gpu("A100-SXM4-80GB").gemm_eff_max)
