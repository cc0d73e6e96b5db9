"""Runtime mechanisms of issue 9 against closed forms: Megatron-Core's overlapped
parameter gather (--overlap-param-gather) in the engine, and the chunked TP-communication
overlap (--tp-comm-overlap) in the program's TP cost."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.flops import layer_backward_ops, layer_forward_ops
from costmodel.gpus import get_gpu
from costmodel.profile import FabricEfficiency, GpuEfficiency, Profile, RuntimeSettings
from costmodel.shapes import ModelSpec
from engine_fixtures import fixed_program, run_engine
from sim.program import overlapped_gather_exposed_s
from sim.tp_comm import pipelined_overlap_s, tp_layer_comm_s
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"


def _gather_program(params: float, buckets: int, f: float, overlap: bool):
    """tp=2, dp=2 over the two-node test cluster (one DP rank per node, 10 GB/s NIC, no
    latency), zero=1, bf16: one bucket's all-gather moves half its params x 2 B over the
    NIC: params / buckets / 1e10 s. Gradient buckets of 1 byte (their reduce-scatter costs
    ~0), no backward, no optimizer time."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("m", buckets, 1024, 16, 512, 32000, 4)
    prog = fixed_program(cluster, model, "tp=2,dp=2,mbs=2,zero=1,precision=bf16", f, 0.0,
                         grad_bytes=[1.0] * buckets, params=params)
    prog.overlap_param_gather = overlap
    return prog


@pytest.mark.parametrize("g", [0.001, 0.004])
def test_param_gather_overlap_hides_what_the_first_forward_covers(g):
    """K = 4 buckets of gather time g each; the first forward (f = 0.01 s) takes c = f/K
    per bucket. Without overlap the whole gather K*g follows the optimizer. With it, bucket
    0 is exposed (g) and bucket j+1 runs beside bucket j's layers, exposing g - c whenever
    it is longer: exposed g + (K-1) max(0, g - c), i.e. the overlap hides (K-1) min(g, c)."""
    K, f = 4, 0.01
    c, params = f / K, g * K * 1e10
    plain, res_plain = run_engine(_gather_program(params, K, f, overlap=False))
    early, res_early = run_engine(_gather_program(params, K, f, overlap=True))
    assert plain - early == pytest.approx((K - 1) * min(g, c), rel=1e-6)
    exposed = g + (K - 1) * max(0.0, g - c)
    assert overlapped_gather_exposed_s(g, K, f) == pytest.approx(exposed)  # the search's closed form
    assert res_early.exposed_comm_s["dp"] == pytest.approx(exposed, rel=1e-3, abs=1e-6)
    assert res_plain.exposed_comm_s["dp"] == pytest.approx(K * g, rel=1e-3, abs=1e-6)


def test_pipelined_overlap_closed_form():
    """A collective of C seconds pipelined in n chunks with a GEMM of G seconds hides
    G (n-1)/n of it: C = 3, G = 4, n = 4 -> exposed 0; C = 5 -> exposed 2; with a 10 %
    slowdown the hidden part also costs 0.1 x min(C, 3)."""
    assert pipelined_overlap_s(3.0, 4.0, 4, 0.0) == pytest.approx(0.0)
    assert pipelined_overlap_s(5.0, 4.0, 4, 0.0) == pytest.approx(2.0)
    assert pipelined_overlap_s(5.0, 4.0, 4, 0.1) == pytest.approx(2.3)


def test_tp_comm_overlap_cost_by_hand():
    """Sequence-parallel TP on one DGX A100 node, ideal fabric (no latency, no call cost,
    no slowdown): forward, without overlap, 2 all-gathers + 2 reduce-scatters of the b*s*h
    activation; with --tp-comm-overlap each is pipelined with its GEMM (QKV, attention-out,
    MLP-up, MLP-down), exposing max(0, C - G (t-1)/t), the sum worked out from the GEMM
    times the cost model gives; backward's output-gradient gathers likewise with the dgrad
    GEMMs of attention-out and MLP-down.

    Pinned by hand first (the rest compares with the cost model's own GEMM times): each
    collective is a ring all-gather/reduce-scatter of the 2048 x 6144 x 2 B = 25,165,824 B
    activation over 8 GPUs on 300 GB/s NVSwitch links, (8-1)/8 x 25,165,824 / 300e9 =
    73.40 us, so forward without overlap is 4 x 73.40 = 293.6 us. Every GEMM beside a
    pipelined collective hides it whole: the smallest, attention-out (2 x 2048 x 768 x
    6144 = 19.33 GFLOP), takes at least 19.33e9 / (312e12 x 0.77 x 768/(768+64)) + 4 us
    = 91.1 us forward and its dgrad (k = 6144) 19.33e9 / (312e12 x 0.77 x 6144/6208) +
    4 us = 85.3 us, both above 8/7 x 73.40 = 83.9 us (the wave factor can only lengthen
    them). So forward with overlap exposes 0 and backward saves exactly 2 x 73.40 us."""
    cluster = load_topology("dgx-a100", nodes=1)
    ranks = list(range(8))
    a100 = get_gpu("A100-SXM4-80GB")
    eff = GpuEfficiency(sm_count=108, gemm_eff_max=0.77)
    fab = FabricEfficiency(bw_eff=1.0, call_latency_us=0.0, compute_slowdown=0.0, hop_latency_us=0.0)
    base = Profile(gpus={"default": eff}, fabrics={"default": fab, "nvswitch": fab})
    on = replace(base, runtime=replace(RuntimeSettings(), tp_comm_overlap=True))
    m = ModelSpec("22b", 48, 6144, 64, 2048, 51200, 4)
    f_ops, b_ops = layer_forward_ops(m, 1, 8, True), layer_backward_ops(m, 1, 8, True)
    act = 2048 * 6144 * 2
    f0, b0 = tp_layer_comm_s(cluster, base, ranks, act, True, "none", b_ops, a100, eff, "bf16", f_ops=f_ops)
    f1, b1 = tp_layer_comm_s(cluster, on, ranks, act, True, "none", b_ops, a100, eff, "bf16", f_ops=f_ops)
    one = 7 / 8 * 25_165_824 / 300e9  # 73.40 us, worked out in the docstring
    assert f0 == pytest.approx(4 * one, rel=1e-9) and one == pytest.approx(73.40e-6, rel=1e-4)
    assert f1 == pytest.approx(0.0, abs=1e-15)
    assert b0 - b1 == pytest.approx(2 * one, rel=1e-9)
    from costmodel.efficiency import op_time_s
    g = {o.name: op_time_s(o, a100, eff, "bf16") for o in f_ops + b_ops if o.kind == "gemm"}
    expect_f = sum(max(0.0, one - g[n] * 7 / 8) for n in ("qkv", "attn_out", "mlp_up", "mlp_down"))
    assert f1 == pytest.approx(expect_f, rel=1e-9)
    assert f1 < f0
    # Backward: the two output-gradient gathers now pipelined; the bulk overlaps unchanged.
    expect_b = b0 - 2 * one + sum(max(0.0, one - g[f"{n}_dgrad"] * 7 / 8) for n in ("attn_out", "mlp_down"))
    assert b1 == pytest.approx(expect_b, rel=1e-9)


def test_engine_tp_time_follows_the_overlap():
    """One simulated step (dgx-a100, 1 node, tp=8, sp, 4 microbatches of a 4-layer GPT):
    switching --tp-comm-overlap on lowers the step's exposed TP time by exactly
    microbatches x layers x (forward + backward saving of one layer) from tp_layer_comm_s."""
    from costmodel.profile import load_profile
    from sim.metrics import simulate
    from specs.plan import resolve_plan
    cluster = load_topology("dgx-a100", nodes=1)
    model = ModelSpec("m", 4, 4096, 32, 2048, 51200, 4)
    plan = resolve_plan("tp=8,mbs=1,sp=true", model, 8)
    off = load_profile(None, bundled=cluster.profiles, runtime="megatron-lm-2022")
    on = replace(off, runtime=replace(off.runtime, tp_comm_overlap=True))
    a100 = cluster.devices[0].gpu
    eff = off.gpu(a100.name)
    f_ops, b_ops = layer_forward_ops(model, 1, 8, True), layer_backward_ops(model, 1, 8, True)
    act = 2048 * 4096 * 2
    ranks = list(range(8))
    f0, b0 = tp_layer_comm_s(cluster, off, ranks, act, True, "none", b_ops, a100, eff, "bf16", f_ops=f_ops)
    f1, b1 = tp_layer_comm_s(cluster, on, ranks, act, True, "none", b_ops, a100, eff, "bf16", f_ops=f_ops)
    saved = 4 * 4 * ((f0 + b0) - (f1 + b1))
    assert saved > 0
    t_off = simulate(model, plan, cluster, off).breakdown["tp"]
    t_on = simulate(model, plan, cluster, on).breakdown["tp"]
    assert t_off - t_on == pytest.approx(saved, rel=1e-6)
