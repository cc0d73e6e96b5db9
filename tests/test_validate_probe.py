"""validate/probe.py: the host-speed probe and the drift factor the validator applies."""
from __future__ import annotations

import pytest

from validate.compare import compare, format_comparison
from validate.probe import DRIFT_MAX, DRIFT_MIN, drift_factor
from validate.record import RunRecord


def test_drift_factor_by_hand():
    """4.4 ms before the run against 4,000 us at calibration: the host computes 1.1x slower.
    Unknown probes (0) and ratios outside [0.5, 2] give None (not applied)."""
    assert drift_factor(4.4e-3, 4000.0) == pytest.approx(1.1)
    assert drift_factor(3.0e-3, 4000.0) == pytest.approx(0.75)
    assert drift_factor(0.0, 4000.0) is None and drift_factor(4e-3, 0.0) is None
    assert drift_factor(4e-3 * DRIFT_MAX * 1.01, 4000.0) is None
    assert drift_factor(4e-3 * DRIFT_MIN * 0.99, 4000.0) is None


def test_drift_factor_counts_only_a_probe_outside_calibrations_range():
    """Calibration's draws 7,000-11,000 us around a median of 8,500: a run probe of 10 ms
    or 7.5 ms is inside that spread, factor 1 (no drift); 12.1 ms is 1.1x the slowest draw,
    factor 1.1 (not 12.1/8.5 = 1.42); 5.6 ms is 0.8x the fastest, factor 0.8. A range
    that does not hold the median is ignored (the ratio to the median, as without one)."""
    assert drift_factor(10e-3, 8500.0, 7000.0, 11000.0) == 1.0
    assert drift_factor(7.5e-3, 8500.0, 7000.0, 11000.0) == 1.0
    assert drift_factor(12.1e-3, 8500.0, 7000.0, 11000.0) == pytest.approx(1.1)
    assert drift_factor(5.6e-3, 8500.0, 7000.0, 11000.0) == pytest.approx(0.8)
    assert drift_factor(12.1e-3, 8500.0, 9000.0, 11000.0) == pytest.approx(12.1 / 8.5)


def test_profile_range_of_the_probe_is_checked(tmp_path):
    """A profile's probe range must hold its median: lo 9,000 > median 8,500 is an input
    error naming the file and runtime.speed_probe_lo_us; a range that holds it loads."""
    from costmodel.errors import InputError
    from costmodel.profile import load_profile
    bad = tmp_path / "bad.yaml"
    bad.write_text("runtime:\n  speed_probe_us: 8500\n  speed_probe_lo_us: 9000\n  speed_probe_hi_us: 11000\n")
    with pytest.raises(InputError) as info:
        load_profile(str(bad))
    assert "bad.yaml" in str(info.value) and "runtime.speed_probe_lo_us" in str(info.value)
    good = tmp_path / "good.yaml"
    good.write_text("runtime:\n  speed_probe_us: 8500\n  speed_probe_lo_us: 7000\n  speed_probe_hi_us: 11000\n")
    assert load_profile(str(good)).runtime.speed_probe_hi_us == 11000.0


def _worker(rank, probes):
    steps = [{"wall_s": 1.0 + rank, "phases_s": {"compute": 0.5}, "detail_s": {}, "bytes_sent": {}}]
    out = {"rank": rank, "stage": 0, "tp_rank": 0, "dp_rank": rank, "steps": steps, "segments": [],
           "losses": [1.0] if rank == 0 else [], "peak_memory_bytes": 1}
    if probes is not None:
        out["probe_s"] = probes
    return out


def test_record_probe_is_the_median_over_ranks_of_the_probe_before_the_steps():
    """Rank 0 probed 6 ms before its steps and 2 ms after, rank 1 5 and 5 ms, rank 2 3 and
    3 ms: the record's probe is the median of the before probes 6, 5, 3 = 5 ms (the
    median of the means 4, 5, 3 would be 4 ms); a record without probes has 0."""
    ws = [_worker(0, [6e-3, 2e-3]), _worker(1, [5e-3, 5e-3]), _worker(2, [3e-3, 3e-3])]
    rec = RunRecord.from_workers(ws, model="tiny", plan="dp=3", backend="gloo", device="cpu",
                                 steps=1, warmup=0, seed=0)
    assert rec.speed_probe_s == pytest.approx(5e-3)
    # the launch's probes kept for analysis: medians of the befores (5) and the afters (2, 5, 3 -> 3)
    assert rec.launch_probes_s == [[pytest.approx(5e-3), pytest.approx(3e-3)]]
    assert RunRecord.pooled([rec, rec]).launch_probes_s == [rec.launch_probes_s[0]] * 2
    old = RunRecord.from_workers([_worker(0, None)], model="tiny", plan="dp=1", backend="gloo",
                                 device="cpu", steps=1, warmup=0, seed=0)
    assert old.speed_probe_s == 0.0 and old.launch_probes_s == []


def test_comparison_reports_the_drift():
    """The text and the JSON say what the probe found and whether the prediction used it."""
    from types import SimpleNamespace
    rec = RunRecord.from_workers([_worker(0, [4.4e-3, 4.4e-3])], model="tiny", plan="dp=1", backend="gloo",
                                 device="cpu", steps=1, warmup=0, seed=0)
    sim = SimpleNamespace(step_time_s=1.0, breakdown={"compute": 1.0})  # what compare() reads
    c = compare(rec, sim, drift=1.1, drift_applied=True, calibrated_probe_s=4e-3)
    assert "4.40 ms before the run, 4.00 ms at calibration (compute predicted x1.100)" in format_comparison(c)
    assert c.to_dict()["speed_probe"] == {"run_s": pytest.approx(4.4e-3), "calibrated_s": 4e-3,
                                          "launches_s": [[4.4e-3, 4.4e-3]], "drift_factor": 1.1, "applied": True}
    off = compare(rec, sim, drift=1.1, drift_applied=False, calibrated_probe_s=4e-3)
    assert "(not applied)" in format_comparison(off)
