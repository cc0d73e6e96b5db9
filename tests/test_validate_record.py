"""validate/record.py: the run record's statistics, its JSON, and its trace layout;
validate/ stays importable without torch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reports.trace import STREAM_TID, trace_events
from validate.record import RunRecord, timeline
from sim.result import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]


def _worker(rank, walls, compute, seg_label):
    steps = [{"wall_s": w, "phases_s": {"compute": c, "dp": 0.01}, "detail_s": {"forward": c / 3},
              "bytes_sent": {"dp": 1000.0 * (rank + 1)}} for w, c in zip(walls, compute)]
    return {"rank": rank, "stage": 0, "tp_rank": 0, "dp_rank": rank, "steps": steps,
            "segments": [{"stream": "compute", "cat": "compute", "start_s": 0.0, "end_s": 0.1,
                          "label": seg_label},
                         {"stream": "dp", "cat": "collective", "start_s": 0.05, "end_s": 0.12,
                          "label": "grad c0b0"}],
            "losses": [3.0, 2.0, 1.0, 0.5, 0.25, 0.125][: len(walls)] if rank == 0 else [0.1] * len(walls),
            "peak_memory_bytes": 123456}


def _record():
    # 1 warm-up step (wall 9 s, ignored) then 5 measured steps.
    w0 = _worker(0, [9.0, 1.0, 2.0, 3.0, 4.0, 5.0], [8.0, 0.5, 0.5, 0.5, 0.5, 0.5], "F0.0")
    w1 = _worker(1, [9.0, 1.5, 1.0, 3.5, 4.0, 4.0], [8.0, 0.7, 0.7, 0.7, 0.7, 0.7], "F0.0")
    return RunRecord.from_workers([w0, w1], model="tiny", plan="dp=2", backend="gloo", device="cpu",
                                  steps=5, warmup=1, seed=0)


def test_step_statistics_by_hand():
    """Step time = slowest rank's wall time: [1.5, 2, 3.5, 4, 5] -> median 3.5; numpy's
    linear percentiles: p10 = 1.5 + 0.4 * 0.5 = 1.7, p90 = 4 + 0.6 * 1 = 4.6. Rank 0's idle
    in step 1 is 1.5 - 0.5 - 0.01 = 0.99 (median over steps: step 3: 3.5 - 0.51 = 2.99).
    Losses are summed over the replicas that hold them (their shares of the global mean)."""
    rec = _record()
    assert rec.step_times_s == [1.5, 2.0, 3.5, 4.0, 5.0]
    assert rec.median_step_time_s == 3.5
    assert rec.p10_step_time_s == pytest.approx(1.7)
    assert rec.p90_step_time_s == pytest.approx(4.6)
    r0 = rec.per_rank[0]["phases_s"]
    assert r0["idle"] == pytest.approx(3.5 - 0.51)
    assert set(rec.phases_s) == set(CATEGORIES)
    # mean over ranks of compute (0.5, 0.7) = 0.6 in every step
    assert rec.phases_s["compute"] == pytest.approx(0.6)
    assert rec.detail_s["forward"] == pytest.approx(0.2)
    assert rec.losses == pytest.approx([3.1, 2.1, 1.1, 0.6, 0.35, 0.225])
    assert rec.per_rank[1]["bytes_sent"] == {"dp": 2000.0, "tp": 0.0, "pp": 0.0, "cp": 0.0}


def test_pooled_launches_by_hand():
    """Two launches of the same plan pool their steps: launch A (the record above, steps
    [1.5, 2, 3.5, 4, 5], compute 0.6, probe 4 ms) and launch B (two steps of 10 and 12 s,
    compute 0.9, probe 6 ms, a larger peak): the pooled median of the seven steps is 4,
    compute is weighted by steps (5 x 0.6 + 2 x 0.9) / 7 = 0.6857, the probe is the mean
    5 ms, peak memory the larger, losses and timeline the first launch's; each launch's
    median is kept, in order: 3.5 (of A's five) and 11 (of B's two)."""
    from dataclasses import replace
    a = replace(_record(), speed_probe_s=4e-3)
    wb = [_worker(r, [9.0, 10.0, 12.0], [8.0, 0.9, 0.9], "F0.0") for r in (0, 1)]
    for w in wb:
        w["peak_memory_bytes"] = 999999
    b = replace(RunRecord.from_workers(wb, model="tiny", plan="dp=2", backend="gloo", device="cpu",
                                       steps=2, warmup=1, seed=0), speed_probe_s=6e-3)
    p = RunRecord.pooled([a, b])
    assert p.step_times_s == [1.5, 2.0, 3.5, 4.0, 5.0, 10.0, 12.0]
    assert p.median_step_time_s == 4.0 and p.steps == 7 and p.launches == 2
    assert p.phases_s["compute"] == pytest.approx((5 * 0.6 + 2 * 0.9) / 7)
    assert p.per_rank[0]["phases_s"]["compute"] == pytest.approx((5 * 0.5 + 2 * 0.9) / 7)
    assert p.speed_probe_s == pytest.approx(5e-3)
    assert p.per_rank[1]["peak_memory_bytes"] == 999999
    assert p.losses == a.losses and p.segments == a.segments
    assert p.launch_medians_s == [3.5, 11.0] and a.launch_medians_s == [3.5]
    assert RunRecord.pooled([p, a]).launch_medians_s == [3.5, 11.0, 3.5]  # pooling pooled records keeps every launch
    assert RunRecord.pooled([a]) is a


def test_json_round_trip(tmp_path):
    """write_json/read_json give back an equal record, and no temporary file is left."""
    rec = _record()
    path = tmp_path / "run.json"
    rec.write_json(path)
    assert RunRecord.read_json(path) == rec
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert json.loads(path.read_text())["median_step_time_s"] == 3.5


def test_measured_timeline_uses_the_simulator_trace_layout():
    """reports/trace.trace_events renders a measured step like a simulated one: one
    process per rank, threads named compute/pp/dp, segments on their stream's thread."""
    ev = trace_events(timeline(_record()))
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    assert sorted(procs) == [0, 1] and procs[1].startswith("rank 1 stage 0 cpu")
    threads = {(e["pid"], e["args"]["name"]) for e in ev if e.get("name") == "thread_name"}
    assert threads == {(p, s) for p in (0, 1) for s in STREAM_TID}
    xs = [e for e in ev if e["ph"] == "X"]
    assert {(e["pid"], e["tid"], e["name"]) for e in xs} == {
        (p, STREAM_TID["compute"], "F0.0") for p in (0, 1)} | {(p, STREAM_TID["dp"], "grad c0b0") for p in (0, 1)}
    assert all(e["dur"] > 0 for e in xs)


def test_validate_imports_without_torch():
    """With torch unimportable, the runner modules still import (torch is lazy) and
    asking for a backend raises the one-line install hint (an InputError)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import plansim, validate.runner, validate.record, validate.launch, validate.backend\n"
            "from costmodel.errors import InputError\n"
            "try:\n    validate.backend.pick_backend()\nexcept InputError as e:\n    print('ERR', e)\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "ERR --: torch: plansim validate needs torch: pip install 'plansim[validate]'" in res.stdout


def test_host_counters_per_step_by_hand():
    """validate/runner.host_counters is the difference of two getrusage readings; the
    record keeps each rank's median over the measured steps (the warm-up's page faults,
    when the heap first grows, are left out) and the comparison reports the busiest rank.
    Rank 0 faults [5000 warm-up, 10, 30, 20, 40, 50] -> median of the 5 measured = 30;
    rank 1 [9000, 2, 2, 900, 2, 2] -> 2; the busiest rank's figure is 30."""
    from types import SimpleNamespace
    from validate.compare import Comparison
    from validate.runner import host_counters
    got = host_counters(SimpleNamespace(ru_minflt=100, ru_nivcsw=7), SimpleNamespace(ru_minflt=1124, ru_nivcsw=9))
    assert got == {"minor_faults": 1024, "involuntary_switches": 2}
    w0 = _worker(0, [9.0, 1.0, 2.0, 3.0, 4.0, 5.0], [8.0] + [0.5] * 5, "F0.0")
    w1 = _worker(1, [9.0, 1.5, 1.0, 3.5, 4.0, 4.0], [8.0] + [0.7] * 5, "F0.0")
    for w, faults in ((w0, [5000, 10, 30, 20, 40, 50]), (w1, [9000, 2, 2, 900, 2, 2])):
        for s, f in zip(w["steps"], faults):
            s["host"] = {"minor_faults": f, "involuntary_switches": 1}
    rec = RunRecord.from_workers([w0, w1], model="tiny", plan="dp=2", backend="gloo", device="cpu",
                                 steps=5, warmup=1, seed=0)
    assert rec.per_rank[0]["host_per_step"]["minor_faults"] == 30
    assert rec.per_rank[1]["host_per_step"]["minor_faults"] == 2
    c = Comparison(plan="dp=2", world=2, measured_step_time_s=3.5, predicted_step_time_s=3.0,
                   p10_step_time_s=1.7, p90_step_time_s=4.6, phases={}, record=rec.to_dict())
    assert c.host_per_step() == {"involuntary_switches": 1.0, "minor_faults": 30.0}
