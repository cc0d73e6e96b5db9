"""Compute that slows with the activations a stage holds (RuntimeSettings.alive_knee_mib,
alive_slowdown_per_doubling): the schedule statistic, the factor, what the program charges
for it, and how calibration fits it."""
from __future__ import annotations

import math

import pytest

from costmodel.errors import InputError
from costmodel.profile import Profile, RuntimeSettings, load_profile
from sim.program import build_program
from sim.schedules import Action, gpipe, mean_alive, one_f_one_b
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import load_topology
from validate.alive_bench import (ALIVE_DEPTHS, ALIVE_MICROBATCHES, alive_fit, alive_model, alive_stage_bytes,
                                   fit_alive_law)
from engine_fixtures import worker_profile

MIB = 2**20
TINY = load_model("tiny")


def test_mean_alive_by_hand():
    """Bytes held when each action starts, averaged over the list: GPipe of 4 holds 0, 1,
    2, 3 before its forwards and 4, 3, 2, 1 before its backwards (16 / 8 = 2 microbatches);
    1F1B one deep 0, 1, 0, 1 (0.5); two chunks of 1 and 10 bytes, F0 F1 B1 B0: 0, 1, 11, 1
    (13 / 4)."""
    assert mean_alive(gpipe(1, 4)[0], [3.0]) == 6.0
    assert mean_alive(one_f_one_b(1, 2)[0], [3.0]) == 1.5
    acts = [Action(0, "F", 0), Action(1, "F", 0), Action(1, "B", 0), Action(0, "B", 0)]
    assert mean_alive(acts, [1.0, 10.0]) == 3.25
    assert mean_alive([], [1.0]) == 0.0


def test_alive_factor_by_hand():
    """1 + 0.05 x log2(8 MiB / 2 MiB) = 1.10; at or below the knee, or unmeasured, 1."""
    rt = RuntimeSettings(alive_knee_mib=2.0, alive_slowdown_per_doubling=0.05)
    assert rt.alive_factor(8 * MIB) == pytest.approx(1.10, abs=1e-12)
    assert rt.alive_factor(2 * MIB) == 1.0 and rt.alive_factor(0.5 * MIB) == 1.0
    assert RuntimeSettings().alive_factor(100 * MIB) == 1.0


def _profile(knee: float, slope: float) -> Profile:
    return worker_profile(flash_attention=True, dropout=False, alive_knee_mib=knee, alive_slowdown_per_doubling=slope)


def _chunks(plan_text: str, profile: Profile) -> dict:
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    plan = resolve_plan(plan_text, TINY, 2)
    return build_program(TINY, plan, cluster, profile).pipelines[0].chunks


def test_gpipe_stage_computes_slower_by_hand():
    """tiny at pp=2, GPipe, 16 microbatches, fp32: stage 0 holds 1,050,624 B a microbatch
    (the memory model's figure; the runner measured 2,105,344 B with two alive), on average
    8 microbatches over its 32 actions (before its forwards 0..15, 120 in all; before its
    backwards 16..1, 136). At a knee of 1 MiB and 0.02 a doubling its forward and backward
    take 1 + 0.02 x log2(8 x 1,050,624 / 2^20) = 1.060056 times as long; under 1F1B the
    same stage holds 0, 1, fourteen times 2 and 1, then 2 and 1 (46 / 32 = 1.4375 microbatches,
    1.44 MiB): 1.010528."""
    plain = _chunks("pp=2,schedule=gpipe,precision=fp32", _profile(1.0, 0.0))
    slow = _chunks("pp=2,schedule=gpipe,precision=fp32", _profile(1.0, 0.02))
    want = 1 + 0.02 * math.log2(8 * 1_050_624 / MIB)
    assert want == pytest.approx(1.060056, abs=1e-6)
    assert slow[(0, 0)].fwd_s / plain[(0, 0)].fwd_s == pytest.approx(want, rel=1e-12)
    assert slow[(0, 0)].bwd_s / plain[(0, 0)].bwd_s == pytest.approx(want, rel=1e-12)
    assert slow[(0, 0)].params == plain[(0, 0)].params
    f1b = _chunks("pp=2,schedule=1f1b,precision=fp32", _profile(1.0, 0.02))
    f1b_plain = _chunks("pp=2,schedule=1f1b,precision=fp32", _profile(1.0, 0.0))
    assert mean_alive(one_f_one_b(2, 16)[0], [1.0]) == 1.4375
    assert f1b[(0, 0)].fwd_s / f1b_plain[(0, 0)].fwd_s == pytest.approx(1.010528, abs=1e-6)


def test_search_estimate_charges_the_same_factor():
    """The search's closed-form estimate (search/costs.CostTables) slows each stage's
    compute by the factor the program charges: tiny at pp=2 GPipe, stage 0 by 1.060056 as
    worked by hand above, forward and backward, in the estimate and the program alike; and
    at tp=2 x pp=2 (4 ranks) only the compute, not the TP collectives, in both."""
    from search.costs import CostTables
    for text, world in (("pp=2,schedule=gpipe,precision=fp32", 2), ("pp=2,tp=2,schedule=gpipe,precision=fp32", 4)):
        cluster = load_topology("localhost-cpu", gpus_per_node=world)
        plan = resolve_plan(text, TINY, world)
        est = {k: CostTables(TINY, cluster, _profile(1.0, k)).pipelines(plan)[0].stages for k in (0.0, 0.02)}
        prog = {k: build_program(TINY, plan, cluster, _profile(1.0, k)).pipelines[0].chunks for k in (0.0, 0.02)}
        for s in range(2):
            plain, slow = prog[0.0][(s, 0)], prog[0.02][(s, 0)]
            factor = slow.fwd_s / plain.fwd_s
            assert factor > 1.0 and slow.bwd_s / plain.bwd_s == pytest.approx(factor, rel=1e-12)
            assert slow.fwd_tp_s == plain.fwd_tp_s and slow.bwd_tp_s == plain.bwd_tp_s
            e0, e1 = est[0.0][s], est[0.02][s]
            assert e1.tp_s == e0.tp_s and (e0.tp_s > 0) == (world == 4)
            assert e1.fwd_s - e0.fwd_s == pytest.approx((factor - 1) * plain.fwd_s, rel=1e-9)
            assert e1.bwd_s - e0.bwd_s == pytest.approx((factor - 1) * plain.bwd_s, rel=1e-9)
        if world == 2:
            assert prog[0.02][(0, 0)].fwd_s / prog[0.0][(0, 0)].fwd_s == pytest.approx(1.060056, abs=1e-6)


def test_small_footprints_are_not_slowed():
    """dp=2 holds one microbatch of four layers at most (half of it on average), below a
    knee of 4 MiB: its compute is unchanged."""
    plain = _chunks("dp=2,precision=fp32", _profile(4.0, 0.0))
    slow = _chunks("dp=2,precision=fp32", _profile(4.0, 0.5))
    assert slow[(0, 0)].fwd_s == plain[(0, 0)].fwd_s and slow[(0, 0)].bwd_s == plain[(0, 0)].bwd_s


def test_alive_fit_recovers_a_law():
    """Step times made from a known law (knee a half-octave above the shallowest order's
    figure, 0.04 a doubling) are fitted back to it; flat or falling times fit no slowdown."""
    per_mb = alive_stage_bytes(TINY)
    xs = [mean_alive(one_f_one_b(d, ALIVE_MICROBATCHES)[0], [per_mb]) for d in ALIVE_DEPTHS]
    knee = xs[0] * 2**0.5
    steps = [0.08 * (1 + 0.04 * max(0.0, math.log2(x / knee))) for x in xs]
    got = alive_fit(steps, TINY)
    assert got["knee_mib"] == pytest.approx(knee / MIB, rel=1e-9)
    assert got["per_doubling"] == pytest.approx(0.04, rel=1e-9)
    assert alive_fit([0.08] * len(xs), TINY)["per_doubling"] == 0.0
    assert alive_fit([0.08 - 0.001 * i for i in range(len(xs))], TINY)["per_doubling"] == 0.0


def test_a_refit_of_a_record_uses_its_own_draws():
    """microbench.fit_draw_figures, what calibration runs once its draws are taken and a
    refit of a saved record runs: draws made from a known alive law (held MiB as tiny's
    stage holds them, knee a half-octave above the shallowest, 0.04 a doubling) and from
    FSDP costs of 80 us + 300 us/MiB (the simulator's own charge, tests/test_fsdp_unit_cost)
    are fitted back to them; a record without the held MiB (written before they were kept)
    keeps its saved alive figures; the record given is not changed."""
    from validate.bench_record import MicrobenchResult
    from validate.alive_bench import alive_held_mib
    from validate.host_draws import fsdp_unit_costs
    from validate.microbench import fit_draw_figures
    held = alive_held_mib(TINY)
    knee = held[0] * 2**0.5
    steps = [0.08 * (1 + 0.04 * max(0.0, math.log2(h / knee))) for h in held]
    saved = {"knee_mib": 9.0, "per_doubling": 0.5}
    rec = MicrobenchResult(world=2, backend="gloo", threads=1, alive_draws=[steps, steps], alive=dict(saved),
                           alive_held_mib=list(held), fsdp_draws=[[0.01, 0.02, 0.01, 0.03]] * 2)
    got = fit_draw_figures(rec)
    assert got.alive["knee_mib"] == pytest.approx(knee, rel=1e-9)
    assert got.alive["per_doubling"] == pytest.approx(0.04, rel=1e-9)
    assert got.fsdp_unit == fsdp_unit_costs([0.01, 0.02, 0.01, 0.03])
    assert rec.alive == saved and rec.fsdp_unit == {}
    old = MicrobenchResult(world=2, backend="gloo", threads=1, alive_draws=[steps], alive=dict(saved))
    assert fit_draw_figures(old).alive == saved


def test_alive_draws_only_where_cheap():
    """The draws run three layers of the model itself, so only of a small one: tiny
    (1.69 MiB a microbatch: 3 x 525,312 B + 196,608 B of the output end, by the memory
    model), not GPT-3 1.3B or a model of two layers."""
    assert alive_stage_bytes(TINY) == 3 * 525_312 + 196_608
    assert alive_model(TINY) is TINY
    assert alive_model(load_model("gpt3-1.3b")) is None
    assert alive_model(None) is None


def test_profile_bounds_the_figures(tmp_path):
    """A slowdown of more than the whole compute per doubling is refused with one line."""
    p = tmp_path / "p.yaml"
    p.write_text("runtime: {alive_slowdown_per_doubling: 1.5}\n")
    with pytest.raises(InputError, match=r"runtime.alive_slowdown_per_doubling: 1.5: must be a finite number in \[0, 1\]"):
        load_profile(str(p))


def test_alive_fit_keeps_two_depths_above_its_knee():
    """One noisy deepest draw cannot set the slope alone. The medians of a real world-2
    calibration (Xeon host, session 20: 1.000, 0.985, 1.004, 1.051 x at tiny's 0.85, 3.8,
    7.2 and 10.1 MiB) fitted a knee of 8.0 MiB and 0.151 a doubling when the knee could
    reach the deepest depth. The knee now stays at or below the second depth, 3.8 MiB:
    the scan's best is 3.38 MiB (0.845 x 2^2, a whole number of quarter-octaves), with
    the slope by least squares through the three depths above it, z = log2(A/3.38) =
    0.170, 1.087, 1.585 against -0.0141, +0.0052, +0.0520: sum(z y) / sum(z^2) = 0.0230
    a doubling, so a stage holding 40 MiB is charged 1 + 0.0230 log2(40/3.38) = 1.082,
    not 1.35."""
    held = [0.84521484375, 3.803466796875, 7.184326171875, 10.142578125]
    steps = [0.054218, 0.053455, 0.054498, 0.057040]  # seconds, the medians of its two draws
    got = fit_alive_law(steps, held)
    assert got["knee_mib"] == pytest.approx(0.84521484375 * 4, rel=1e-9)
    ys = [t / steps[0] - 1 for t in steps]
    zs = [max(0.0, math.log2(h / got["knee_mib"])) for h in held]
    assert got["per_doubling"] == pytest.approx(sum(z * y for z, y in zip(zs, ys)) / sum(z * z for z in zs), rel=1e-9)
    assert got["per_doubling"] == pytest.approx(0.0230, abs=5e-4)
    assert 1 + got["per_doubling"] * math.log2(40 / got["knee_mib"]) < 1.09


class _Grad:
    """Stands in for torch in the drawers: only torch.enable_grad() is used."""

    @staticmethod
    def enable_grad():
        import contextlib
        return contextlib.nullcontext()


def _switch_costs(slow_s: float, fast_s: float):
    """Two functions whose call takes ``slow_s`` right after the other one ran and
    ``fast_s`` otherwise: the transient a deep order leaves for the next call."""
    import time
    last = [None]

    def make(name):
        def f():
            time.sleep(slow_s if last[0] not in (None, name) else fast_s)
            last[0] = name
        return f
    return [make("a"), make("b")]


def test_settled_drawer_leaves_out_the_call_after_a_switch():
    """The alive draws time each depth after an untimed call of its own: with two functions
    that take 80 ms right after the other one and 40 ms otherwise (longer than a window,
    so one call a window, as the alive orders), the settled drawer reports about 40 ms for
    both, where unsettled windows (every call right after a switch) report about 80."""
    from validate.bench_timing import interleaved_drawer
    settled = interleaved_drawer(_Grad, _switch_costs(0.080, 0.040), 3, None, settle=True)()
    assert all(0.039 < t < 0.065 for t in settled), settled
    interleaved = interleaved_drawer(_Grad, _switch_costs(0.080, 0.040), 3, None)()
    assert all(t > 0.075 for t in interleaved), interleaved
