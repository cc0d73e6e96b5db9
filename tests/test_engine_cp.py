"""Context parallelism in the engine against closed forms: ring attention hides the K/V
exchange behind the block attention when the exchange is shorter, and exposes exactly the
difference otherwise; the all-to-all variant exposes its all-to-alls whole."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.context_parallel import ring_attention_s
from costmodel.shapes import ModelSpec
from engine_fixtures import fixed_program, run_engine
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
NIC_BPS = 10e9  # tests/data/two-nodes.yaml: one 80 Gb/s NIC per GPU, zero latency


def _cp_program(plan_text, f, b, a_f, a_b, x_f, x_b, batch=8):
    """A program whose chunks take f / b seconds (cp block attentions of a_f / a_b each
    included) and exchange bytes that take x_f / x_b seconds on a NIC."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    model = ModelSpec("tiny", 2, 1024, 16, 512, 32000, batch)
    prog = fixed_program(cluster, model, plan_text, f, b)
    for pipe in prog.pipelines:
        for key, w in pipe.chunks.items():
            pipe.chunks[key] = replace(w, cp_fwd_block_s=a_f, cp_bwd_block_s=a_b,
                                       cp_fwd_bytes=x_f * NIC_BPS, cp_bwd_bytes=x_b * NIC_BPS)
    return prog


@pytest.mark.parametrize("plan_text,cp", [("tp=2,cp=2,mbs=1", 2), ("tp=1,cp=4,mbs=1", 4)])
@pytest.mark.parametrize("a_f,x_f,a_b,x_b", [
    (0.004, 0.001, 0.008, 0.002),   # exchange shorter than the block: hidden
    (0.001, 0.003, 0.002, 0.005),   # longer: exposed by x - a on each of the cp-1 steps
    (0.002, 0.002, 0.003, 0.0045),  # hidden forward, exposed backward
])
def test_ring_attention_closed_form(plan_text, cp, a_f, x_f, a_b, x_b):
    """One replica, m microbatches of forward f and backward b (each holding cp block
    attentions) and ring steps whose transfer takes x (bytes / the 10 GB/s NIC, the cp
    ranks' rings crossing nodes on their own NICs): the step is
    m * (f + b + (cp-1) * (max(0, x_f - a_f) + max(0, x_b - a_b))), i.e. every pass is
    ring_attention_s plus the non-attention compute."""
    f, b = 0.01 + cp * a_f, 0.02 + cp * a_b
    prog = _cp_program(plan_text, f, b, a_f, a_b, x_f, x_b)
    m = prog.pipelines[0].microbatches
    step, res = run_engine(prog)
    per_mb = (f - cp * a_f + ring_attention_s(cp, a_f, x_f)) + (b - cp * a_b + ring_attention_s(cp, a_b, x_b))
    assert step == pytest.approx(m * per_mb, rel=1e-9)
    exposed = m * (cp - 1) * (max(0.0, x_f - a_f) + max(0.0, x_b - a_b))
    assert res.exposed_comm_s["cp"] == pytest.approx(exposed, rel=1e-9, abs=1e-12)
    assert res.devices[0].represents == 4  # tp*cp = 4 devices per simulated one


def test_all_to_all_is_exposed():
    """cp_comm=a2a (Ulysses): the all-to-all before attention is not overlapped. With
    cp=2 each rank sends its whole share (x seconds on its NIC) to the other, so every
    pass adds x: step = m * (f + x_f + b + x_b)."""
    a_f, a_b, x_f, x_b = 0.002, 0.004, 0.003, 0.001
    f, b = 0.01 + 2 * a_f, 0.02 + 2 * a_b
    prog = _cp_program("tp=2,cp=2,cp_comm=a2a,mbs=1", f, b, a_f, a_b, x_f, x_b)
    m = prog.pipelines[0].microbatches
    step, res = run_engine(prog)
    assert step == pytest.approx(m * (f + x_f + b + x_b), rel=1e-9)
    assert res.exposed_comm_s["cp"] == pytest.approx(m * (x_f + x_b), rel=1e-9)
