"""validate/probe.py: the host-speed probe and the drift factor the validator applies."""
from __future__ import annotations

import pytest

from validate.compare import compare, format_comparison
from validate.probe import DRIFT_MAX, DRIFT_MIN, drift_factor
from validate.record import RunRecord


def test_drift_factor_by_hand():
    """4.4 ms during the run against 4,000 us at calibration: the host computes 1.1x slower.
    Unknown probes (0) and ratios outside [0.5, 2] give None (not applied)."""
    assert drift_factor(4.4e-3, 4000.0) == pytest.approx(1.1)
    assert drift_factor(3.0e-3, 4000.0) == pytest.approx(0.75)
    assert drift_factor(0.0, 4000.0) is None and drift_factor(4e-3, 0.0) is None
    assert drift_factor(4e-3 * DRIFT_MAX * 1.01, 4000.0) is None
    assert drift_factor(4e-3 * DRIFT_MIN * 0.99, 4000.0) is None


def _worker(rank, probes):
    steps = [{"wall_s": 1.0 + rank, "phases_s": {"compute": 0.5}, "detail_s": {}, "bytes_sent": {}}]
    out = {"rank": rank, "stage": 0, "tp_rank": 0, "dp_rank": rank, "steps": steps, "segments": [],
           "losses": [1.0] if rank == 0 else [], "peak_memory_bytes": 1}
    if probes is not None:
        out["probe_s"] = probes
    return out


def test_record_probe_is_the_median_of_the_launch_probes_before_and_after():
    """Rank 0 probed 6 ms before its steps and 2 ms after, rank 1 5 and 5 ms, rank 2 3 and
    3 ms: the launch's probes are the medians over ranks, 5 ms before (6, 5, 3) and 3 ms
    after (2, 5, 3), and the record's probe their median, (5 + 3) / 2 = 4 ms. Pooled with
    a second launch whose ranks all probed 9 and 8 ms, the four draws 3, 5, 8, 9 give
    (5 + 8) / 2 = 6.5 ms (the mean of the launches' before probes, the rule until
    2026-12-03, would say 7). A record without probes has 0; a worker that probed only
    before its steps gives that probe."""
    ws = [_worker(0, [6e-3, 2e-3]), _worker(1, [5e-3, 5e-3]), _worker(2, [3e-3, 3e-3])]
    rec = RunRecord.from_workers(ws, model="tiny", plan="dp=3", backend="gloo", device="cpu",
                                 steps=1, warmup=0, seed=0)
    assert rec.launch_probes_s == [[pytest.approx(5e-3), pytest.approx(3e-3)]]
    assert rec.speed_probe_s == pytest.approx(4e-3)
    assert RunRecord.pooled([rec, rec]).launch_probes_s == [rec.launch_probes_s[0]] * 2
    other = RunRecord.from_workers([_worker(r, [9e-3, 8e-3]) for r in range(3)], model="tiny", plan="dp=3",
                                   backend="gloo", device="cpu", steps=1, warmup=0, seed=0)
    assert RunRecord.pooled([rec, other]).speed_probe_s == pytest.approx(6.5e-3)
    assert RunRecord.pooled([RunRecord.pooled([rec, other]), rec]).speed_probe_s == pytest.approx(5e-3)
    old = RunRecord.from_workers([_worker(0, None)], model="tiny", plan="dp=1", backend="gloo",
                                 device="cpu", steps=1, warmup=0, seed=0)
    assert old.speed_probe_s == 0.0 and old.launch_probes_s == []
    before_only = RunRecord.from_workers([_worker(0, [7e-3])], model="tiny", plan="dp=1", backend="gloo",
                                         device="cpu", steps=1, warmup=0, seed=0)
    assert before_only.speed_probe_s == pytest.approx(7e-3) and before_only.launch_probes_s == []


def test_comparison_reports_the_drift():
    """The text and the JSON say what the probe found and whether the prediction used it."""
    from types import SimpleNamespace
    rec = RunRecord.from_workers([_worker(0, [4.4e-3, 4.4e-3])], model="tiny", plan="dp=1", backend="gloo",
                                 device="cpu", steps=1, warmup=0, seed=0)
    sim = SimpleNamespace(step_time_s=1.0, breakdown={"compute": 1.0})  # what compare() reads
    c = compare(rec, sim, drift=1.1, drift_applied=True, calibrated_probe_s=4e-3)
    assert "4.40 ms during the run, 4.00 ms at calibration (compute predicted x1.100)" in format_comparison(c)
    assert c.to_dict()["speed_probe"] == {"run_s": pytest.approx(4.4e-3), "calibrated_s": 4e-3,
                                          "launches_s": [[4.4e-3, 4.4e-3]], "drift_factor": 1.1, "drift_plans": 1,
                                          "applied": True}
    pooled = compare(rec, sim, drift=1.1, drift_applied=True, calibrated_probe_s=4e-3, drift_plans=8)
    assert "(compute predicted x1.100, the median over the 8 plans' probes)" in format_comparison(pooled)
    off = compare(rec, sim, drift=1.1, drift_applied=False, calibrated_probe_s=4e-3)
    assert "(not applied)" in format_comparison(off)


def test_validation_drift_is_one_median_over_every_plans_probes():
    """Two plans calibrated at 10 ms and one at 5 ms (another process count): the ratios of
    their probes are 1.0, 1.2 | 0.9, 1.5 | 1.2, 1.4 (6 and 7 ms over 5), and every plan
    gets their median (1.2 + 1.2) / 2 = 1.2, not its own (1.1, 1.2, 1.3). A plan without
    launch probes, or a profile without a calibrated probe, leaves no pooled factor (None),
    and so does a median outside [DRIFT_MIN, DRIFT_MAX]."""
    from validate.probe import validation_drift
    plans = [([[10e-3, 12e-3]], 10_000.0), ([[9e-3, 15e-3]], 10_000.0), ([[6e-3, 7e-3]], 5_000.0)]
    assert validation_drift(plans) == pytest.approx(1.2)
    assert validation_drift(plans + [([], 10_000.0)]) is None
    assert validation_drift(plans + [([[1e-3, 1e-3]], 0.0)]) is None
    assert validation_drift([([[30e-3, 30e-3]], 10_000.0)]) is None  # 3x: not drift
    assert validation_drift([]) is None


def test_call_drift_pools_the_probes_of_the_plans_of_one_profile():
    """Two plans of a profile calibrated at 1,000 us probed [1, 2] and [3, 1.5] ms: ratios
    1, 2, 3, 1.5, and both get their median (1.5 + 2) / 2 = 1.75, not their own (1.5 and
    2.25). A plan of another profile (2,000 us) that probed [1, 1.2] ms gets its own 0.55.
    A plan without probes, or a profile without the calibrated figure (0, a profile
    calibrated before session 28), gets None, and so does a factor outside
    [DRIFT_MIN, DRIFT_MAX] (4,000 us against 100: x40, another host)."""
    from validate.probe import call_drift
    got = call_drift([([[1e-3, 2e-3]], 1000.0), ([[3e-3, 1.5e-3]], 1000.0), ([[1e-3, 1.2e-3]], 2000.0),
                      ([], 1000.0), ([[1e-3, 1e-3]], 0.0), ([[4e-3, 4e-3]], 100.0)])
    assert got[:3] == [pytest.approx(1.75), pytest.approx(1.75), pytest.approx(0.55)]
    assert got[3:] == [None, None, None]


def test_record_keeps_each_launchs_call_probes():
    """The call probe of a launch is the median over ranks of [before, after] (ranks 0-3
    probed 1/4, 2/2, 3/3, 9/1 ms: medians 2.5 and 2.5 ms); pooled launches keep each
    launch's pair; an odd world keeps none."""
    ws = [_worker(r, [1e-3, 1e-3]) for r in range(4)]
    for w, probes in zip(ws, ([1e-3, 4e-3], [2e-3, 2e-3], [3e-3, 3e-3], [9e-3, 1e-3])):
        w["call_probe_s"] = probes
    rec = RunRecord.from_workers(ws, model="tiny", plan="dp=4", backend="gloo", device="cpu",
                                 steps=1, warmup=0, seed=0)
    assert rec.launch_call_probes_s == [[pytest.approx(2.5e-3), pytest.approx(2.5e-3)]]
    assert RunRecord.pooled([rec, rec]).launch_call_probes_s == rec.launch_call_probes_s * 2
    odd = RunRecord.from_workers(ws[:3], model="tiny", plan="dp=3", backend="gloo", device="cpu",
                                 steps=1, warmup=0, seed=0)
    assert odd.launch_call_probes_s == []


def test_comparison_reports_the_call_drift():
    """The text and the JSON say what the call probe read, against what calibration timed
    and what the profile prices that row at, and whether the prediction's call costs were
    scaled."""
    from types import SimpleNamespace
    ws = [_worker(r, [4e-3, 4e-3]) for r in range(2)]
    for w in ws:
        w["call_probe_s"] = [2.4e-3, 2.6e-3]
    rec = RunRecord.from_workers(ws, model="tiny", plan="tp=2", backend="gloo", device="cpu",
                                 steps=1, warmup=0, seed=0)
    sim = SimpleNamespace(step_time_s=1.0, breakdown={"compute": 1.0})
    c = compare(rec, sim, call_drift=1.25, call_drift_applied=True, calibrated_call_probe_s=2e-3,
                priced_call_probe_s=2.2e-3)
    assert ("call probe: 2.50 ms a 2-rank all-reduce after compute during the run, 2.00 ms at calibration, "
            "2.20 ms as the profile prices it (call costs predicted x1.250, from the median over the probes of "
            "the plans of 2 processes)") in format_comparison(c)
    assert c.to_dict()["call_probe"] == {"launches_s": [[2.4e-3, 2.6e-3]], "calibrated_s": 2e-3, "priced_s": 2.2e-3,
                                         "drift_factor": 1.25, "applied": True}
    off = compare(rec, sim, call_drift=None, calibrated_call_probe_s=2e-3)
    assert f"(outside {DRIFT_MIN:g}..{DRIFT_MAX:g}, not applied)" in format_comparison(off)


def test_slowed_calls_scales_call_costs_and_nothing_else():
    """x1.5 on a calibrated-like fabric: the generic and each collective's call cost, the
    per-rank cost and the fitted per-step latency are 1.5 times theirs; an unset one stays
    unset, bandwidth and the pipeline handoffs' measured figures stay as they were, and
    the GPUs and runtime are untouched. x1 gives back the same profile."""
    from dataclasses import replace as dc_replace

    from costmodel.profile import load_profile
    from sim.core_sharing import slowed_calls
    prof = load_profile(None)
    fab = dc_replace(prof.fabric("loopback"), call_latency_us=100.0, all_reduce_call_us=1200.0,
                     all_gather_call_us=None, hop_latency_us=40.0, call_us_per_rank=8.0,
                     send_recv_preposted_us=300.0, bw_eff=0.3)
    prof = dc_replace(prof, fabrics={**prof.fabrics, "loopback": fab})
    got = slowed_calls(prof, 1.5).fabrics["loopback"]
    assert (got.call_latency_us, got.all_reduce_call_us, got.hop_latency_us, got.call_us_per_rank) == \
        (pytest.approx(150.0), pytest.approx(1800.0), pytest.approx(60.0), pytest.approx(12.0))
    assert got.all_gather_call_us is None and got.bw_eff == 0.3 and got.send_recv_preposted_us == 300.0
    assert slowed_calls(prof, 1.5).gpus == prof.gpus and slowed_calls(prof, 1.5).runtime == prof.runtime
    assert slowed_calls(prof, 1.0) is prof


def _anchor_case():
    """localhost-cpu at 2 processes with session 32 `a-1`'s fitted loopback fabric (bw_eff
    0.061, hop 153.309 us, all-reduce call 1,562.196 us) and its calibrated call probe
    (1,659.5 us)."""
    from dataclasses import replace

    from costmodel.profile import FabricEfficiency, load_profile
    from plansim.cmd_calibrate import resolve_world
    cluster, _ = resolve_world("localhost-cpu", 2, "--world", "")
    base = load_profile(None, bundled=cluster.profiles)
    fab = FabricEfficiency(bw_eff=0.061, call_latency_us=1127.405, hop_latency_us=153.309,
                           all_reduce_call_us=1562.196)
    profile = replace(base, fabrics={**base.fabrics, "loopback": fab},
                      runtime=replace(base.runtime, call_probe_us=1659.5))
    return cluster, profile


def test_call_probe_price_by_hand():
    """The profile prices the probe's row (32 KiB, 2 ranks, ring all-reduce on loopback at
    10 GB/s x 0.061) at 2(n-1)/n x 32,768 B / 0.61 GB/s = 53.72 us of bandwidth, plus
    2(n-1) x 153.309 us of steps, plus the 1,562.196 us call: 1,922.53 us, the fitted
    figure `a-1`'s calibration printed for that row (1,922.5). The part slowed_calls does not
    scale is the bandwidth term alone. A profile without a calibrated probe has no price."""
    from dataclasses import replace

    from validate.probe import call_probe_price_s
    cluster, profile = _anchor_case()
    priced, fixed = call_probe_price_s(profile, cluster)
    bw_us = 32768 / (10e9 * 0.061) * 1e6
    assert fixed * 1e6 == pytest.approx(bw_us, rel=1e-9) and bw_us == pytest.approx(53.72, abs=0.01)
    assert priced * 1e6 == pytest.approx(bw_us + 2 * 153.309 + 1562.196, rel=1e-9)
    assert priced * 1e6 == pytest.approx(1922.53, abs=0.01)
    bare = replace(profile, runtime=replace(profile.runtime, call_probe_us=0.0))
    assert call_probe_price_s(bare, cluster) == (0.0, 0.0)


def test_anchored_factor_prices_the_row_at_what_the_probes_read():
    """The probes read 1.82 ms against 1,659.5 us at calibration (call_drift: 1.0967). The
    anchored factor is (1,820 - 53.72) / (1,922.53 - 53.72) = 0.9451 by hand, and the
    profile slowed by it (sim/core_sharing.slowed_calls) prices the row, through the
    calibration's own formula, at 1,820 us: what the probes read, where the unanchored
    factor prices it at 1.0967 x 1,868.81 + 53.72 = 2,103.3 us. None stays None, a missing
    price leaves the factor as it is, and so does an anchor outside [DRIFT_MIN,
    DRIFT_MAX] (a fit that prices the row 4x what calibration timed)."""
    from sim.core_sharing import slowed_calls
    from validate.calibrate import collective_time_s
    from validate.probe import CALL_PROBE_BYTES, anchored_call_factor, call_drift, call_probe_price_s
    cluster, profile = _anchor_case()
    f = call_drift([([[1.82e-3, 1.82e-3]], 1659.5)])[0]
    assert f == pytest.approx(1.82 / 1.6595)
    priced, fixed = call_probe_price_s(profile, cluster)
    got = anchored_call_factor(f, 1659.5, priced, fixed)
    assert got == pytest.approx((1820 - 53.72) / (1922.53 - 53.72), rel=1e-4)
    assert got == pytest.approx(0.9451, abs=1e-4)
    node = cluster.nodes[0]

    def row_us(p):
        return collective_time_s("all_reduce", CALL_PROBE_BYTES, 2, node.intra_bw_Bps, node.intra_latency_s,
                                 p.fabric(node.intra_kind)) * 1e6
    assert row_us(slowed_calls(profile, got)) == pytest.approx(1820.0, rel=1e-9)
    assert row_us(slowed_calls(profile, f)) == pytest.approx(2103.3, abs=0.1)
    assert anchored_call_factor(None, 1659.5, priced, fixed) is None
    assert anchored_call_factor(f, 1659.5, 0.0, 0.0) == f
    assert anchored_call_factor(f, 1659.5, 4 * 1659.5e-6, fixed) == f
