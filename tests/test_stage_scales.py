"""The model's stage as measured over as priced (RuntimeSettings.forward_scale,
backward_scale, optimizer_scale): what the simulator does with them, how calibration fits
them from the split draws, and that a record's split fields are checked at the edge."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from costmodel.errors import InputError
from costmodel.profile import load_profile, overlay_profile
from costmodel.shapes import ModelSpec
from sim.metrics import simulate
from sim.program import chunk_work
from specs.plan import resolve_plan
from specs.topology import load_topology
from validate.bench_record import load_bench
from validate.calibrate import profile_from_bench, stage_scales
from validate.alive_bench import ALIVE_LAYERS, ALIVE_MICROBATCHES
from engine_fixtures import worker_profile

ROOT = Path(__file__).resolve().parents[1]
TINY = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)
# A saved world-2 calibration of the bundled tiny model on a 2-core CPU host (session 25).
SAVED = ROOT / "results" / "validate-cpu-2026-12-06-s25" / "a-4" / "cpu-w2.bench.json"


def test_scales_multiply_each_chunks_forward_and_backward():
    """chunk_work with forward_scale 1.5 and backward_scale 0.8 gives 1.5 x and 0.8 x what
    it gives with both at 1, for a stage with both ends and one without; optimizer_time_s
    with optimizer_scale 0.25 a quarter, eager or fused; and a one-device plan's simulated
    step (launch-blocking, nothing to overlap) changes by exactly microbatches x (0.5 x
    forward - 0.2 x backward) - 0.75 x Adam: two computations of one number."""
    from costmodel.efficiency import optimizer_time_s
    cluster = load_topology("localhost-cpu", gpus_per_node=1)
    base = worker_profile(eager_adam=True)
    scaled = replace(base, runtime=replace(base.runtime, forward_scale=1.5, backward_scale=0.8,
                                           optimizer_scale=0.25))
    gpu, eff = cluster.devices[0].gpu, base.gpu("default")
    for eager in (True, False):
        rt0, rt1 = (replace(p.runtime, eager_adam=eager) for p in (base, scaled))
        assert optimizer_time_s(1e6, gpu, eff, "fp32", rt1) == pytest.approx(
            0.25 * optimizer_time_s(1e6, gpu, eff, "fp32", rt0), rel=1e-12)
    plan = resolve_plan("dp=1,mbs=1,precision=fp32", TINY, 1)
    for layers, first, last in ((4, True, True), (2, False, False)):
        w0 = chunk_work(TINY, plan, cluster, base, 0, layers, first, last)
        w1 = chunk_work(TINY, plan, cluster, scaled, 0, layers, first, last)
        assert w1.fwd_s == pytest.approx(1.5 * w0.fwd_s, rel=1e-12)
        assert w1.bwd_s == pytest.approx(0.8 * w0.bwd_s, rel=1e-12)
    w0 = chunk_work(TINY, plan, cluster, base, 0, 4, True, True)
    adam = optimizer_time_s(w0.params, gpu, eff, "fp32", base.runtime)
    m = TINY.global_batch_size
    grown = simulate(TINY, plan, cluster, scaled).step_time_s - simulate(TINY, plan, cluster, base).step_time_s
    assert grown == pytest.approx(m * (0.5 * w0.fwd_s - 0.2 * w0.bwd_s) - 0.75 * adam, rel=1e-9)


def _priced(cluster, mapping: dict) -> tuple[float, float, float]:
    """(forward s, backward s) a microbatch and Adam's s a step of the split draws' stage
    under ``mapping``'s profile."""
    from costmodel.efficiency import optimizer_time_s
    prof = overlay_profile(load_profile(None, bundled=cluster.profiles), mapping, "test")
    w = chunk_work(TINY, resolve_plan("precision=fp32", TINY, 1), cluster, prof, 0, ALIVE_LAYERS, True, True)
    gpu = cluster.devices[0].gpu
    return w.fwd_s, w.bwd_s, optimizer_time_s(w.params, gpu, prof.gpu(gpu.name), "fp32", prof.runtime)


def test_calibration_fits_the_measured_over_the_priced_stage():
    """A saved calibration record given split draws 1.3 x, 0.9 x and 0.3 x what its own
    fitted profile prices for the stage's forward, backward and Adam (the median of three
    draws, one an outlier) fits forward_scale 1.3, backward_scale 0.9 and optimizer_scale
    0.3 when asked to (plansim calibrate --stage-scales), and nothing without; the profile
    written with them then prices that stage at what was measured (the scales close the
    loop end to end)."""
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    res = load_bench(SAVED, "file")
    assert not res.split_draws  # recorded before session 26: no scales
    _, plain = profile_from_bench(cluster, res, "test")
    assert "forward_scale" not in plain["runtime"]
    f, b, o = _priced(cluster, plain)
    draw = [1.3 * f, 0.9 * b, 0.3 * o]
    res = replace(res, split_model=asdict(TINY), split_draws=[draw, draw, [9 * f, 9 * b, 9 * o]])
    _, default = profile_from_bench(cluster, res, "test")
    assert default == plain  # measured, not applied by default (mechanism 57)
    _, mapping = profile_from_bench(cluster, res, "test", with_scales=True)
    assert mapping["runtime"]["forward_scale"] == pytest.approx(1.3, abs=1e-4)
    assert mapping["runtime"]["backward_scale"] == pytest.approx(0.9, abs=1e-4)
    assert mapping["runtime"]["optimizer_scale"] == pytest.approx(0.3, abs=1e-4)
    f2, b2, o2 = _priced(cluster, mapping)
    assert (f2, b2, o2) == pytest.approx((1.3 * f, 0.9 * b, 0.3 * o), rel=1e-3)
    assert stage_scales(cluster, replace(res, split_draws=[[1e3 * f, 1e-3 * b, o]]), plain, "test") == \
        {"forward_scale": 10.0, "backward_scale": 0.1, "optimizer_scale": 1.0}  # held inside the profile's bounds


@pytest.mark.parametrize("field,value,named", [
    ("split_draws", [[0.001, 0.002]], "split_draws"),
    ("split_draws", [[0.001, float("nan"), 0.001]], "split_draws[0][1]"),
    ("split_model", {"name": "x", "num_layers": -1}, "num_layers"),
])
def test_hostile_split_fields_are_one_line_errors(tmp_path, field, value, named):
    """A record whose split draws are the wrong width or not finite, or whose split model
    is no model, is refused by plansim calibrate --compute-from with one line naming the
    file and the field, exit 2, no traceback."""
    from validate.microbench import compute_processes, host_cores
    data = json.loads(SAVED.read_text())
    # the conditions --compute-from checks first, as this machine's (the record's were 2 cores)
    data["host_cores"], data["compute_world"] = host_cores(), compute_processes(2, "cpu")
    data["split_model"] = asdict(TINY)
    data["split_draws"] = [[0.002, 0.003, 0.001]]
    data[field] = value
    bad = tmp_path / "bad.bench.json"
    bad.write_text(json.dumps(data))
    p = subprocess.run([sys.executable, "-m", "plansim", "calibrate", "localhost-cpu", "--world", "2", "--model",
                        "tiny", "--compute-from", str(bad), "--out", str(tmp_path / "p.yaml")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert "bad.bench.json" in lines[0] and named in lines[0]
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("value", [0.0, 0.05, 11.0, float("inf")])
def test_profile_refuses_an_absurd_scale(value):
    """A profile's forward_scale outside [0.1, 10] is refused naming the field."""
    with pytest.raises(InputError, match="forward_scale"):
        overlay_profile(load_profile(None), {"runtime": {"forward_scale": value}}, "p.yaml")


def test_split_drawer_times_the_runners_stage():
    """One real draw of the split drawer on the bundled tiny model (one process, the CPU):
    three positive times, the backward longer than the forward (it does about twice the
    forward's arithmetic, costmodel/flops.py); and in one step of the same stage the
    forward, backward and optimizer spans it reads add up to less than the step's wall time."""
    import torch

    from sim.schedules import one_f_one_b
    from validate.host_draws import stage_trainer
    from validate.alive_bench import split_drawer
    torch.manual_seed(0)
    fwd, bwd, opt = split_drawer(torch, torch.device("cpu"), 1, TINY)()
    assert 0 < fwd < bwd and opt > 0
    train = stage_trainer(TINY, ALIVE_LAYERS, ALIVE_MICROBATCHES, torch.device("cpu"),
                          actions=one_f_one_b(1, ALIVE_MICROBATCHES)[0], optimizer=True)[2]
    rec = train()
    spans = rec["detail_s"]["forward"] + rec["detail_s"]["backward"] + rec["detail_s"]["optimizer"]
    assert 0 < spans < rec["wall_s"]
