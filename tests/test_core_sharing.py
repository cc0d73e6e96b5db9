"""Host processes time-sharing fewer cores (sim/core_sharing.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel import flops as fl
from costmodel.efficiency import ops_time_s
from costmodel.gpus import get_gpu
from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim.core_sharing import next_slowdown, slowed_profile
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import load_topology
from engine_fixtures import worker_profile

TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)


def _profile(cores: int, call_us: float = 5.0) -> Profile:
    return worker_profile(call_latency_us=call_us, host_cores=cores)


def test_slowed_profile_scales_every_op_by_f():
    """A device at 1/f speed: every op's time (roofline compute or memory time, kernel
    overhead, host issue cost) is f times the unslowed one, worked through
    costmodel.efficiency.ops_time_s independently of the scaling."""
    gpu = get_gpu("CPU")
    base = _profile(2)
    ops = fl.layer_forward_ops(TINY, 1, 1, False, 4) + fl.layer_backward_ops(TINY, 1, 1, False, 4)
    t1 = ops_time_s(ops, gpu, base.gpu("CPU"), "fp32", base.runtime)
    f = 1.7
    slow = slowed_profile(base, f)
    assert ops_time_s(ops, gpu, slow.gpu("CPU"), "fp32", slow.runtime) == pytest.approx(f * t1, rel=1e-12)


def test_next_slowdown_closed_form():
    """f = max(1, n/c - W/C): all n busy all the time gives n/c; waiting as long as
    computing frees one core's worth per process."""
    assert next_slowdown(2.0, 1.0, 0.0) == 2.0
    assert next_slowdown(2.0, 1.0, 0.5) == 1.5
    assert next_slowdown(2.0, 1.0, 3.0) == 1.0


def test_busy_waits_keep_the_cores_taken():
    """With a share b of each wait still on a core, saturated cores give
    f = n/c - (1 - b n/c) W/C within [1, n/c]: 4 processes on 2 cores, C = 1, W = 3:
    b = 0.2 -> 2 - 0.6 x 3 = 0.2 -> 1; b = 0.4 -> 2 - 0.2 x 3 = 1.4; b = 0.5 (the waits
    alone fill both cores) -> 2 whatever W; b = 0.7 cannot slow compute beyond n/c -> 2.
    With as many processes as cores (n/c = 1) nothing is slowed, busy or not."""
    assert next_slowdown(2.0, 1.0, 3.0, 0.2) == 1.0
    assert next_slowdown(2.0, 1.0, 3.0, 0.4) == pytest.approx(1.4)
    assert next_slowdown(2.0, 1.0, 3.0, 0.5) == 2.0
    assert next_slowdown(2.0, 1.0, 30.0, 0.7) == 2.0
    assert next_slowdown(1.0, 1.0, 3.0, 0.9) == 1.0


def test_four_processes_on_two_cores_fixed_point():
    """dp=4 on a 4-device host with 2 cores: the step's compute is slowed by the f that
    satisfies f = max(1, 2 - W/C) for the simulated step (C the unslowed compute, W the
    rest of the step), between 1 and 2; with 4 cores (or no core count) nothing changes."""
    cluster = load_topology("localhost-cpu")
    plan = resolve_plan("dp=4,precision=fp32", TINY, 4)
    free = simulate(TINY, plan, cluster, _profile(0))
    four = simulate(TINY, plan, cluster, _profile(4))
    assert four.step_time_s == pytest.approx(free.step_time_s, rel=1e-12)
    shared = simulate(TINY, plan, cluster, _profile(2))
    f = shared.core_slowdown
    assert 1.0 < f <= 2.0
    C = free.breakdown["compute"]
    assert shared.breakdown["compute"] == pytest.approx(f * C, rel=1e-9)
    W = shared.step_time_s - shared.breakdown["compute"]
    assert f == pytest.approx(next_slowdown(2.0, C, W), rel=1e-2)
    # Waits that keep half a core each (b n/c = 1): the cores stay full, f = n/c = 2.
    busy = _profile(2)
    busy = replace(busy, runtime=replace(busy.runtime, comm_busy_fraction=0.5))
    full = simulate(TINY, plan, cluster, busy)
    assert full.core_slowdown == pytest.approx(2.0, rel=1e-3)
    assert full.breakdown["compute"] == pytest.approx(2.0 * C, rel=1e-3)
