"""ZeRO-3 / FSDP with prefetch in the engine against the closed form: layer i+1's weights
are all-gathered while layer i computes, so the exposed gather time is the first layer's
gather plus, for every later layer, max(0, gather - the previous layer's compute)."""
from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.shapes import ModelSpec
from engine_fixtures import fixed_program
from sim.engine import Engine
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
NIC_BPS = 10e9  # tests/data/two-nodes.yaml: one 80 Gb/s NIC per GPU, zero latency
LAYERS = 4


def _fsdp_run(layer_s: float, gather_s: float, **runtime):
    """tp=2 inside each node, dp=2 across the two nodes, zero=3, GPipe on one stage, each
    of LAYERS layers c = layer_s per microbatch and gathered in g = gather_s (half of its
    bf16 weights on each rank's own 10 GB/s NIC), with ``runtime`` settings replaced.
    Returns (microbatches, engine, end of the forward phase)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", LAYERS, 1024, 16, 512, 32000, 8)
    params = gather_s * NIC_BPS * LAYERS  # per chunk: params/L * 2 B / 2 per flow = g * NIC_BPS
    prog = fixed_program(cluster, model, "tp=2,dp=2,mbs=1,zero=3,schedule=gpipe",
                         LAYERS * layer_s, LAYERS * layer_s, params=params)
    if runtime:
        prog = _with_runtime(prog, **runtime)
    eng = Engine(prog, record=True)
    eng.run()
    fwd_end = max(sg.end_s for sg in eng.segments if sg.stream == "compute" and sg.label.startswith("F")
                  and sg.cat == "compute")
    return prog.pipelines[0].microbatches, eng, fwd_end


@pytest.mark.parametrize("layer_s,gather_s", [(0.004, 0.001), (0.001, 0.003), (0.002, 0.002)])
def test_fsdp_prefetch_closed_form(layer_s, gather_s):
    """tp=2 inside each node, dp=2 across the two nodes, zero=3, GPipe on one stage: all m
    forwards (L layers of c seconds each) run before any backward, so no reduce-scatter
    competes with the forward gathers. A layer's all-gather over 2 ranks sends half of
    its bf16 weights (params/L * 2 B / 2) on each rank's own 10 GB/s NIC: g seconds.
    Forward phase end = m*L*c + g + (m*L - 1) * max(0, g - c)."""
    m, eng, fwd_end = _fsdp_run(layer_s, gather_s)
    n = m * LAYERS
    expected = n * layer_s + gather_s + (n - 1) * max(0.0, gather_s - layer_s)
    assert fwd_end == pytest.approx(expected, rel=1e-9)
    exposed = sum(sg.end_s - sg.start_s for sg in eng.segments
                  if sg.cat == "dp" and sg.label.startswith("fsdp gather F"))
    assert exposed == pytest.approx(gather_s + (n - 1) * max(0.0, gather_s - layer_s), rel=1e-9)


def _with_runtime(prog, **settings):
    """``prog`` with its profile's runtime fields replaced (the FSDP policy is read when
    the engine runs)."""
    from dataclasses import replace
    prog.profile = replace(prog.profile, runtime=replace(prog.profile.runtime, **settings))
    return prog


@pytest.mark.parametrize("layer_s,gather_s", [(0.004, 0.001), (0.001, 0.003)])
def test_fsdp_keep_gathered_gathers_once_per_step(layer_s, gather_s):
    """fsdp_reshard_after_forward=never (TorchTitan's policy with pp > 1): a layer gathered
    for the first microbatch's forward stays resident for the step, so only the first
    forward's L layers are gathered: the forward phase ends at
    m*L*c + g + (L - 1) * max(0, g - c), exposed gather g + (L - 1) * max(0, g - c), and no
    backward gather is issued."""
    m, eng, fwd_end = _fsdp_run(layer_s, gather_s, fsdp_reshard_after_forward="never")
    assert m > 1
    exposed = gather_s + (LAYERS - 1) * max(0.0, gather_s - layer_s)
    assert fwd_end == pytest.approx(m * LAYERS * layer_s + exposed, rel=1e-9)
    got = sum(sg.end_s - sg.start_s for sg in eng.segments if sg.cat == "dp" and sg.label.startswith("fsdp gather"))
    assert got == pytest.approx(exposed, rel=1e-9)


@pytest.mark.parametrize("layer_s,gather_s", [(0.004, 0.001), (0.001, 0.003)])
def test_fsdp_deeper_prefetch_queues_gathers(layer_s, gather_s):
    """fsdp_prefetch_layers=3: gathers run one after another on the communication stream
    (not side by side halving each other's bandwidth), so with equal layers the forward
    phase ends exactly where one-layer prefetch ends: n*c + g + (n - 1) * max(0, g - c)."""
    m, _, fwd_end = _fsdp_run(layer_s, gather_s, fsdp_prefetch_layers=3)
    n = m * LAYERS
    assert fwd_end == pytest.approx(n * layer_s + gather_s + (n - 1) * max(0.0, gather_s - layer_s), rel=1e-9)


def test_outer_weights_are_a_unit_of_their_own(monkeypatch):
    """ZeRO-3 of tiny on one stage (first and last): the chunk's weights outside its layers
    are gathered as a unit before its layers, worked by hand. A layer holds QKV 128x384 +
    384, projection 128x128 + 128, fc1 128x512 + 512, fc2 512x128 + 128 and two LayerNorms
    (2 x 256): 198,272 parameters; outside them the tied 512 x 128 embedding, the 64 x 128
    positions and the final LayerNorm (256): 73,984. Every microbatch's forward and
    backward then issue 1 + 4 gathers, the outer share first, and each pass's shares sum to
    the chunk's weights."""
    from costmodel.profile import default_profile
    from sim.gradient_reducer import GradientReducer
    from sim.program import build_program
    from specs.model import load_model
    from specs.plan import resolve_plan
    model = load_model("tiny")
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    prog = build_program(model, resolve_plan("dp=2,zero=3,precision=fp32", model, 2), cluster, default_profile())
    w = prog.pipelines[0].chunks[(0, 0)]
    assert (w.params, w.outer_params) == (4 * 198_272 + 73_984, 73_984)
    calls = []
    real = GradientReducer.zero3_gather_layer

    def spy(self, stage, work, share, label):
        calls.append((label, share))
        return real(self, stage, work, share, label)
    monkeypatch.setattr(GradientReducer, "zero3_gather_layer", spy)
    Engine(prog).run()
    m = prog.pipelines[0].microbatches
    assert len(calls) == 2 * m * 5  # forward and backward of every microbatch, 5 units each
    outer, layer = 73_984 / w.params, 198_272 / w.params
    for k in range(0, len(calls), 5):
        assert [c[1] for c in calls[k:k + 5]] == pytest.approx([outer] + [layer] * 4, rel=1e-12)
