"""ZeRO-3/FSDP's own host cost per unit taken into use (RuntimeSettings.fsdp_unit_us,
fsdp_unit_us_per_mib): what the simulator charges for it, and how calibration derives it
from the runner's FSDP at two widths."""
from __future__ import annotations

import pytest

from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim.core_sharing import slowed_profile
from sim.program import chunk_work
from specs.plan import resolve_plan
from specs.topology import load_topology
from validate.host_draws import FSDP_MICROBATCHES, FSDP_MODELS, fsdp_unit_costs
from engine_fixtures import worker_profile

TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)


def _profile(unit_us: float = 0.0, per_mib: float = 0.0, blocking: bool = True) -> Profile:
    return worker_profile(launch_blocking=blocking, fsdp_unit_us=unit_us, fsdp_unit_us_per_mib=per_mib)


def _work(plan_text: str, profile: Profile):
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    plan = resolve_plan(plan_text, TINY, 2)
    return chunk_work(TINY, plan, cluster, profile, 0, 4, True, True)


def test_each_unit_adds_its_host_time_forward_and_backward():
    """tiny at zero=3, fp32 weights: a layer unit holds 12h^2 + 13h = 198,272 weights
    (793,088 B = 0.756348 MiB), the outer unit V*h + s*h + 2h = 73,984 (295,936 B = 0.282227
    MiB). At 100 us + 50 us/MiB: 4 x (100 + 37.8174) + (100 + 14.1113) = 665.38 us more in
    the forward of one microbatch and as much in its backward, by hand."""
    base = _work("dp=2,zero=3,precision=fp32", _profile())
    got = _work("dp=2,zero=3,precision=fp32", _profile(100.0, 50.0))
    per = 4 * (100 + 50 * 793_088 / 2**20) + (100 + 50 * 295_936 / 2**20)
    assert per == pytest.approx(665.38, abs=0.01)
    assert got.fwd_s - base.fwd_s == pytest.approx(per * 1e-6, rel=1e-9)
    assert got.bwd_s - base.bwd_s == pytest.approx(per * 1e-6, rel=1e-9)


def test_only_zero3_pays_it():
    """ZeRO-1 and plain data parallelism gather nothing per layer: the figures change nothing."""
    for plan in ("dp=2,zero=1,precision=fp32", "dp=2,precision=fp32"):
        a, b = _work(plan, _profile()), _work(plan, _profile(100.0, 50.0))
        assert (a.fwd_s, a.bwd_s) == (b.fwd_s, b.bwd_s)


def test_hides_under_asynchronous_kernels():
    """With asynchronous launches (a GPU's host runs ahead of its kernels) the unit's host
    time only counts where the host is the bottleneck: a wide layer's kernels on an A100
    take far longer than 100 us of host work, so the layer's time does not change. (The part
    per MiB is left at 0 here: a 16k-wide layer's unit is 6 GiB, and 50 us/MiB of it would
    be longer than the kernels; bundled GPU runtimes leave both parts at 0.)"""
    wide = ModelSpec("wide", 2, 16384, 128, 2048, 51200, 8)
    cluster = load_topology("dgx-a100", nodes=1)
    plan = resolve_plan("dp=8,zero=3,mbs=1", wide, 8)
    a = chunk_work(wide, plan, cluster, _profile(blocking=False), 0, 2, False, False)
    b = chunk_work(wide, plan, cluster, _profile(100.0, 0.0, blocking=False), 0, 2, False, False)
    assert (a.fwd_s, a.bwd_s) == pytest.approx((b.fwd_s, b.bwd_s), rel=1e-12)


def test_slowed_profile_scales_unit_cost():
    """A device at 1/f speed pays f times a unit's host time, as every other per-op cost."""
    slow = slowed_profile(_profile(100.0, 50.0), 1.5)
    assert (slow.runtime.fsdp_unit_us, slow.runtime.fsdp_unit_us_per_mib) == (150.0, 75.0)


def test_calibration_solves_both_parts():
    """fsdp_unit_costs against numbers made by hand: the width-8 chain holds 4 x 872 + 112 =
    3,600 weights (14,400 B = 0.0137329 MiB), the width-64 one 4 x 49,984 + 5,248 = 205,184
    (820,736 B = 0.782715 MiB), 5 units each. At 80 us + 300 us/MiB a unit's use adds
    404.12 us a round (all 5 units) for the first and 634.81 us for the second; a step of
    FSDP_MICROBATCHES = 8 microbatches takes each round twice a microbatch. The solve gives
    back 80 and 300."""
    from costmodel.memory import stage_params
    assert [stage_params(m, m.num_layers, 1, True, True) for m in FSDP_MODELS] == [3_600, 205_184]
    assert FSDP_MICROBATCHES == 8
    rounds = [5 * 80 + 300 * 14_400 / 2**20, 5 * 80 + 300 * 820_736 / 2**20]
    assert rounds == pytest.approx([404.12, 634.81], abs=0.01)
    steps = []
    for e in rounds:
        steps += [0.01, 0.01 + e * 2 * 8 * 1e-6]
    got = fsdp_unit_costs(steps)
    assert got["us"] == pytest.approx(80.0, rel=1e-9) and got["us_per_mib"] == pytest.approx(300.0, rel=1e-9)


def test_calibration_never_negative():
    """A draw where FSDP looks cheaper than plain training (noise) gives 0, not a negative cost."""
    got = fsdp_unit_costs([0.010, 0.009, 0.020, 0.019])
    assert got == {"us": 0.0, "us_per_mib": 0.0}



def test_calibration_inverts_what_the_simulator_charges():
    """Steps made from the simulator's own charge (chunk_work of each FSDP draw model as one
    zero=3 chunk holding every layer and both ends, at 80 us + 300 us/MiB against none,
    forward plus backward, FSDP_MICROBATCHES microbatches a step) are fitted back to 80
    and 300: the fit divides by the units the simulator charges (sim/program.fsdp_units),
    whatever their layout."""
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    steps = []
    for m in FSDP_MODELS:
        plan = resolve_plan("dp=2,zero=3,precision=fp32", m, 2)
        base, got = (chunk_work(m, plan, cluster, p, 0, m.num_layers, True, True)
                     for p in (_profile(), _profile(80.0, 300.0)))
        extra = (got.fwd_s - base.fwd_s) + (got.bwd_s - base.bwd_s)
        steps += [0.01, 0.01 + FSDP_MICROBATCHES * extra]
    got = fsdp_unit_costs(steps)
    assert got["us"] == pytest.approx(80.0, rel=1e-9) and got["us_per_mib"] == pytest.approx(300.0, rel=1e-9)
