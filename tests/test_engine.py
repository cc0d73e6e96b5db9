"""The SimPy engine against closed forms: pipeline bubbles, overlap of gradient
reduction with backward, and per-device memory from the schedule."""
from __future__ import annotations

from pathlib import Path

import pytest

from costmodel import memory as mem
from costmodel.profile import FabricEfficiency, Profile
from costmodel.shapes import ModelSpec
from engine_fixtures import IDEAL, fixed_program, run_engine
from sim.metrics import simulate
from specs.plan import resolve_plan
from sim.program import build_program
from sim.schedules import list_schedule_makespan, make_schedule
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
def _model(layers=16, batch=64):
    return ModelSpec("tiny", layers, 1024, 16, 512, 32000, batch)


def _program(cluster, model, plan_text, f, b, grad_bytes=(), p2p=0.0):
    return fixed_program(cluster, model, plan_text, f, b, grad_bytes, p2p)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 4), (8, 32)])
def test_bubble_gpipe_1f1b(schedule, p, m):
    """With uniform stages and free communication, GPipe and 1F1B take
    (m + p - 1)(f + b): the bubble is (p-1)/m of the ideal m(f + b) (Narayanan et al. 2021)."""
    cluster = load_topology("dgx-a100", nodes=1)
    model = _model(layers=16, batch=m * (8 // p))
    f, b = 0.001, 0.002
    prog = _program(cluster, model, f"pp={p},schedule={schedule}", f, b)
    step, res = run_engine(prog)
    ideal = m * (f + b)
    assert step == pytest.approx((m + p - 1) * (f + b), rel=1e-9)
    assert res.breakdown["bubble"] / ideal == pytest.approx((p - 1) / m, rel=1e-9)
    assert res.breakdown["compute"] == pytest.approx(ideal, rel=1e-9)


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (2, 6, 3)])
def test_bubble_interleaved(p, m, v):
    """Interleaved 1F1B with v chunks per rank (each chunk f/v, b/v): bubble (p-1)/(v*m)."""
    cluster = load_topology("dgx-a100", nodes=1)
    model = _model(layers=p * v * 2, batch=m * (8 // p))
    f, b = 0.003, 0.006
    prog = _program(cluster, model, f"pp={p},vpp={v}", f / v, b / v)
    step, res = run_engine(prog)
    ideal = m * (f + b)
    assert step == pytest.approx(ideal * (1 + (p - 1) / (v * m)), rel=1e-9)
    assert res.bubble_fraction * step / ideal == pytest.approx((p - 1) / (v * m), rel=1e-9)


@pytest.mark.parametrize("schedule,m", [("1f1b", 8), ("gpipe", 8), ("1f1b", 3)])
def test_engine_matches_list_scheduler_with_comm(schedule, m):
    """With a transfer time between stages, the engine's step equals an independent
    pure-Python list scheduler's makespan (sim.schedules.list_schedule_makespan)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = _model(layers=4, batch=2 * m)
    # tp=2, pp=2: each stage is one node; both TP ranks send 1e8 B over their own
    # 80 Gb/s NIC (10 GB/s; PCIe is 50 GB/s): 0.01 s per transfer, no sharing.
    prog = _program(cluster, model, f"tp=2,pp=2,mbs=2,schedule={schedule}", 0.02, 0.04, p2p=1e8)
    step, res = run_engine(prog)
    ref, _ = list_schedule_makespan(make_schedule(schedule, 2, m), 2, 1, 0.02, 0.04, comm_time=0.01)
    assert step == pytest.approx(ref, rel=1e-9)
    assert res.breakdown["pp"] > 0


def _dp_program(backward_s, buckets, bucket_bytes, overlap=True):
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = _model(layers=buckets, batch=4)
    # dp=2 across the two nodes (tp=2 inside each node): one bucket = one all-reduce of
    # S bytes over 2 ranks = 2 flows of S bytes each way on a 10 GB/s NIC path: S/1e10 s.
    text = "tp=2,dp=2,mbs=2" + ("" if overlap else ",overlap_grad_reduce=false")
    return _program(cluster, model, text, 0.0, backward_s, grad_bytes=[bucket_bytes] * buckets)


@pytest.mark.parametrize("buckets,bucket_s", [(4, 0.001), (4, 0.0024), (4, 0.01), (8, 0.005)])
def test_grad_reduction_overlap(buckets, bucket_s):
    """Gradient buckets are reduced as backward produces them. Bucket j is ready at
    (j+1)/K of the last backward (length B); K buckets of reduction time c each finish
    at max(B + c, B/K + K*c), so the exposed time is max(c, K*c - B*(1 - 1/K)): hidden
    except for the last bucket while K*c < B, exposed by the difference beyond it."""
    B = 0.01
    prog = _dp_program(B, buckets, bucket_s * 1e10)
    step, res = run_engine(prog)
    m = prog.pipelines[0].microbatches
    K, c = buckets, bucket_s
    exposed = max(c, K * c - B * (1 - 1 / K))
    assert step == pytest.approx((m - 1) * B + B + exposed, rel=1e-9)
    assert res.exposed_comm_s["dp"] == pytest.approx(exposed, rel=1e-9)


def test_grad_reduction_without_overlap():
    """overlap_grad_reduce=false: every bucket waits for the end of backward, so all
    K*c of reduction is exposed."""
    B, K, c = 0.01, 4, 0.002
    step, res = run_engine(_dp_program(B, K, c * 1e10, overlap=False))
    assert res.exposed_comm_s["dp"] == pytest.approx(K * c, rel=1e-9)


def test_activation_memory_from_schedule():
    """Stage 0 of 1F1B holds p microbatches of activations, the last stage one; each is
    layers x Korthikanti Table 2 bytes (TP + SP + selective: s*b*h*34/t)."""
    cluster = load_topology("dgx-a100", nodes=2)
    model = ModelSpec("m", 32, 4096, 32, 2048, 51200, 256)
    plan = resolve_plan("tp=4,pp=4,mbs=2,sp=true,recompute=selective", model, 16)
    prog = build_program(model, plan, cluster, IDEAL)
    s, b, h, t = 2048, 2, 4096, 4
    per_layer = s * b * h * 34 / t
    assert mem.activation_bytes_per_layer(model, b, t, True, "selective") == per_layer
    acts = [prog.pipelines[0].memory[st]["activations"] for st in range(4)]
    assert acts == pytest.approx([(4 - st) * 8 * per_layer for st in range(4)])


def test_interleaved_memory_factor():
    """Interleaved rank 0 holds (v*p + p - 1) chunk activations = 1F1B's p stages' worth
    times (1 + (p-1)/(p*v)) (Korthikanti et al. 2022, with m >= 2p)."""
    cluster = load_topology("dgx-a100", nodes=1)
    model = ModelSpec("m", 16, 1024, 16, 512, 32000, 64)
    one = build_program(model, resolve_plan("tp=2,pp=4", model, 8), cluster, IDEAL)
    inter = build_program(model, resolve_plan("tp=2,pp=4,vpp=2", model, 8), cluster, IDEAL)
    p, v = 4, 2
    ratio = inter.pipelines[0].memory[0]["activations"] / one.pipelines[0].memory[0]["activations"]
    assert ratio == pytest.approx(1 + (p - 1) / (p * v))


def test_symmetric_replicas_match_explicit_heterogeneity():
    """Simulating one pipeline for identical replicas gives the same step as forcing the
    replicas into separate simulated classes (explicit equal mb_shares change nothing)."""
    cluster = load_topology("dgx-a100", nodes=2)
    model = ModelSpec("m", 8, 2048, 16, 1024, 32000, 32)
    a = simulate(model, resolve_plan("tp=2,pp=2,dp=4,mbs=2", model, 16), cluster, IDEAL)
    b = simulate(model, resolve_plan("tp=2,pp=2,dp=4,mbs=2,mb_shares=4:4:4:4", model, 16), cluster, IDEAL)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)


def test_breakdown_sums_to_step():
    """Every device's breakdown (compute, tp, pp, dp, bubble, idle) adds up to the step time."""
    cluster = load_topology("hetero-a100-v100")
    model = ModelSpec("m", 16, 2048, 16, 1024, 32000, 64)
    res = simulate(model, resolve_plan("tp=8,pp=2", model, cluster.num_devices), cluster, IDEAL)
    for d in res.devices:
        assert sum(d.breakdown_s.values()) == pytest.approx(res.step_time_s, rel=1e-9)
    assert sum(res.breakdown.values()) == pytest.approx(res.step_time_s, rel=1e-9)


def test_overlapped_reduction_slows_compute():
    """A gradient collective overlapping backward slows it by the fabric's
    compute_slowdown s per second of overlap: with 2 buckets and reduction c < B/2,
    bucket 0's reduction [B/2, B/2 + c] overlaps the second half of backward, which
    therefore ends at B + s*c; bucket 1 is then reduced alone, so the step is
    B + s*c + c, and the lost s*c is booked as exposed 'dp' with the last bucket's c."""
    B, c, s = 0.01, 0.002, 0.5
    prog = _dp_program(B, 2, c * 1e10)
    prog.profile = Profile(gpus=IDEAL.gpus, fabrics={"default": FabricEfficiency(
        bw_eff=1.0, call_latency_us=0.0, compute_slowdown=s)})
    step, res = run_engine(prog)
    assert step == pytest.approx(B + s * c + c, rel=1e-9)
    assert res.breakdown["dp"] == pytest.approx(s * c + c, rel=1e-9)


def test_written_out_kernels_match_the_generic_path():
    """The compute stream runs a plain forward or backward kernel and its TP collectives
    written out (sim/pipeline_executor.compute_stream); an executor whose subclass hooks
    _forward takes the generic generators (_forward, _compute, _busy) for every kernel.
    On a real interleaved program (TP, pipeline sends, and chunk 1's gradient buckets
    reduced while chunk 0's plain backward kernels run, slowed by the fabric's
    compute_slowdown), both give the same step time and per-device breakdown."""
    from sim.engine import Engine
    from sim.metrics import summarize
    from sim.pipeline_executor import PipelineExecutor

    class Hooked(PipelineExecutor):
        def _forward(self, key, a, w, label):
            yield from super()._forward(key, a, w, label)

    cluster = load_topology("dgx-a100", nodes=4)
    model = ModelSpec("m", 16, 2048, 16, 1024, 32000, 64)
    plan = resolve_plan("tp=4,pp=2,vpp=2,mbs=1", model, cluster.num_devices)
    profile = Profile(gpus=IDEAL.gpus, fabrics={"default": FabricEfficiency(
        bw_eff=0.8, call_latency_us=5.0, compute_slowdown=0.3)})
    runs = []
    for executor in (PipelineExecutor, Hooked):
        prog = build_program(model, plan, cluster, profile)
        eng = Engine(prog)
        eng.executor = executor(eng.env, eng.net, prog, eng.accountant, eng.reducer)
        step = eng.run()
        runs.append((step, summarize(prog, eng, step)))
    (step, res), (ref_step, ref) = runs
    assert res.breakdown["tp"] > 0 and res.breakdown["pp"] + res.breakdown["bubble"] > 0
    assert res.breakdown["dp"] > 0      # some of it the slowdown of overlapped backward
    assert step == pytest.approx(ref_step, rel=1e-12)
    for d, r in zip(res.devices, ref.devices):
        assert d.breakdown_s == pytest.approx(r.breakdown_s, rel=1e-12, abs=1e-15)
