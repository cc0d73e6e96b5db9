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


@pytest.mark.parametrize("layer_s,gather_s", [(0.004, 0.001), (0.001, 0.003), (0.002, 0.002)])
def test_fsdp_prefetch_closed_form(layer_s, gather_s):
    """tp=2 inside each node, dp=2 across the two nodes, zero=3, GPipe on one stage: all m
    forwards (L layers of c seconds each) run before any backward, so no reduce-scatter
    competes with the forward gathers. A layer's all-gather over 2 ranks sends half of
    its bf16 weights (params/L * 2 B / 2) on each rank's own 10 GB/s NIC: g seconds.
    Forward phase end = m*L*c + g + (m*L - 1) * max(0, g - c)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", LAYERS, 1024, 16, 512, 32000, 8)
    params = gather_s * NIC_BPS * LAYERS  # per chunk: params/L * 2 B / 2 per flow = g * NIC_BPS
    prog = fixed_program(cluster, model, "tp=2,dp=2,mbs=1,zero=3,schedule=gpipe",
                         LAYERS * layer_s, LAYERS * layer_s, params=params)
    m = prog.pipelines[0].microbatches
    eng = Engine(prog, record=True)
    eng.run()
    fwd_end = max(sg.end_s for sg in eng.segments if sg.stream == "compute" and sg.label.startswith("F")
                  and sg.cat == "compute")
    n = m * LAYERS
    expected = n * layer_s + gather_s + (n - 1) * max(0.0, gather_s - layer_s)
    assert fwd_end == pytest.approx(expected, rel=1e-9)
    exposed = sum(sg.end_s - sg.start_s for sg in eng.segments
                  if sg.cat == "dp" and sg.label.startswith("fsdp gather F"))
    assert exposed == pytest.approx(gather_s + (n - 1) * max(0.0, gather_s - layer_s), rel=1e-9)
