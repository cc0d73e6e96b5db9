"""`plansim calibrate` and `plansim validate`: error paths, and one short real smoke run."""
from __future__ import annotations

import json
import math
import sys

import pytest

from costmodel.errors import InputError

from plansim.cli import main
from specs.model import load_model
from plansim.cmd_validate import profile_for, with_runner_precision
from specs.plan import plan_world_size as plan_world


def _no_torch(monkeypatch):
    # A None entry in sys.modules makes `import torch` raise ImportError, as without torch.
    monkeypatch.setitem(sys.modules, "torch", None)


def test_validate_without_torch_says_how_to_install(monkeypatch, capsys):
    """Without torch, validate stops before running anything: one line naming the pip
    command, exit 2 (no traceback)."""
    _no_torch(monkeypatch)
    assert main(["validate", "localhost-cpu", "--model", "tiny", "--plan", "dp=2"]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and len(err.strip().splitlines()) == 1


def test_runner_checks_import_without_torch():
    """`plansim search --validate` checks plans with validate.runner.check_supported, which
    reads validate.gpt: both must import without torch (a module-level torch version check
    in validate/gpt.py once made them raise ModuleNotFoundError). In a fresh interpreter,
    with torch blocked."""
    import subprocess
    code = ("import sys; sys.modules['torch'] = None\n"
            "from specs.model import load_model\nfrom specs.plan import resolve_plan\n"
            "from validate.runner import check_supported\n"
            "m = load_model('tiny'); check_supported(m, resolve_plan('tp=2', m, 2))\nprint('ok')")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr[-400:]


def test_calibrate_without_torch_says_how_to_install(monkeypatch, capsys, tmp_path):
    """Same for calibrate from microbenchmarks; no profile file is written."""
    _no_torch(monkeypatch)
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "localhost-cpu", "--world", "2", "--out", str(out)]) == 2
    assert "pip install" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("world", ["0", "5", "-1"])
def test_calibrate_bad_world(world, capsys, tmp_path):
    """localhost-cpu's node has 4 devices: --world must be in [1, 4]; the message says so."""
    assert main(["calibrate", "localhost-cpu", "--world", world, "--out", str(tmp_path / "p.yaml")]) == 2
    assert "must be an integer in [1, 4] (devices of one localhost-cpu node)" in capsys.readouterr().err


def test_validate_plan_too_big_for_the_host(capsys):
    """tp=2,dp=4 needs 8 processes, more than localhost-cpu's 4 devices: exit 2, the range named."""
    assert main(["validate", "localhost-cpu", "--plan", "tp=2,dp=4"]) == 2
    assert "must be an integer in [1, 4] (devices of one localhost-cpu node)" in capsys.readouterr().err


@pytest.mark.parametrize("launches", ["0", "101"])
def test_validate_bad_launches(launches, capsys):
    """--launches outside 1..100: exit 2 before anything runs, the range named."""
    assert main(["validate", "localhost-cpu", "--plan", "dp=2", "--launches", launches]) == 2
    assert "--launches" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--plan", "dp=2", "--steps", "99999999999999"], "--steps: 99999999999999: must be an integer in [1, 10000]"),
    (["--plan", "dp=2", "--warmup", "999999999"], "--warmup: 999999999: must be an integer in [0, 10000]"),
    (["--plan", "dp=2", "--timeout", "nan"], "--timeout: nan: must be a finite number in (0, 86400] (seconds)"),
    (["--plan", "dp=2", "--timeout", "inf"], "--timeout: inf: must be a finite number in (0, 86400]"),
    (["--plan", "dp=2", "--timeout", "-1"], "--timeout: -1: must be a finite number in (0, 86400]"),
    (["--plan", "dp=2", "--timeout", "0"], "--timeout: 0: must be a finite number in (0, 86400]"),
    (["--plans", "dp=2", "dp=2"], "--plans: dp=2: the same plan as 'dp=2'"),
    (["--plans", "dp=2", "tp=1,dp=2,mbs=1"], "--plans: tp=1,dp=2,mbs=1: the same plan as 'dp=2'"),
    (["--plan", "dp=2", "--profile", "2="], "--profile: 2=: no file after '='; give WORLD=FILE"),
])
def test_validate_bad_flags_refused_before_any_run(argv, needle, capsys, monkeypatch):
    """Steps or warm-up steps beyond 10,000 (before: a run that never ends), a timeout that
    is not a finite positive number of seconds (before: a ValueError traceback from the
    launcher, or every rank 'did not finish within -1 s'), the same plan twice in --plans
    (before: run twice and ranked against itself) and WORLD= with no file (before: silently
    the uncalibrated profile) are each one line, exit 2, before any worker starts."""
    import validate.runner
    monkeypatch.setattr(validate.runner, "run_plan", lambda *a, **k: pytest.fail("a worker was started"))
    assert main(["validate", "localhost-cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_validate_plan_file_that_is_not_a_mapping(tmp_path, capsys):
    """A plan YAML holding a list or a scalar is one line naming the file and what is
    expected (before: AttributeError traceback from the runner-precision check)."""
    for i, text in enumerate(["- tp\n- 2\n", "just text\n"]):
        plan = tmp_path / f"plan{i}.yaml"
        plan.write_text(text, encoding="utf-8")
        assert main(["validate", "localhost-cpu", "--plan", str(plan)]) == 2
        err = capsys.readouterr().err
        assert f"{plan}: expected a mapping of plan fields" in err and len(err.strip().splitlines()) == 1


def test_validate_profile_for_no_plan_refused(capsys):
    """--profile 9=FILE when no plan runs in 9 processes: one line naming the option, the
    world and the plans' worlds, before any process starts (the file is never read)."""
    assert main(["validate", "localhost-cpu", "--model", "tiny", "--plans", "dp=2", "tp=2,dp=2",
                 "--profile", "9=nowhere.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--profile: 9=nowhere.yaml: no plan runs in 9 processes; the plans run in 2, 4" in err
    assert "\n" not in err


def test_calibrate_heterogeneous_topology_refused(capsys, tmp_path):
    """The validator calibrates one host of one node type: a two-group topology is an input error."""
    assert main(["calibrate", "hetero-a100-v100", "--world", "2", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "one host" in capsys.readouterr().err


def test_one_node_of_a_cluster_topology():
    """A cluster file (dgx-a100, many nodes of 8 GPUs) is cut to the one host the validator
    runs on: --world 4 gives one node of 4 A100s."""
    from plansim.cmd_calibrate import resolve_world
    cluster, world = resolve_world("dgx-a100", 4)
    assert (world, cluster.num_devices, len(cluster.nodes), cluster.devices[0].gpu.name) == (4, 4, 1, "A100-SXM4-80GB")


def test_plan_world_and_profile_mapping():
    """Processes = tp*pp*dp with dp defaulting to 1; 'W=FILE' profiles apply to W processes."""
    assert plan_world("tp=2") == 2 and plan_world("pp=2,schedule=gpipe") == 2
    assert plan_world("tp=2,dp=2") == 4 and plan_world("dp=2,compress=topk:0.1") == 2
    assert profile_for(["a.yaml", "4=b.yaml"]) == {None: "a.yaml", 4: "b.yaml"}


def test_calibrate_and_validate_smoke(tmp_path, capsys):
    """A short real run (2 processes, quick sweep, 3 steps): calibrate writes a profile that
    validate then uses (in two launches, pooled); the JSON has the contract's fields and
    finite, positive numbers. (No accuracy assertion: timings depend on the machine.)"""
    pytest.importorskip("torch")
    pytest.importorskip("validate.runner")
    prof = tmp_path / "w2.yaml"
    assert main(["calibrate", "localhost-cpu", "--world", "2", "--quick", "--model", "tiny", "--out", str(prof)]) == 0
    capsys.readouterr()
    # The pipeline handoff streams ran (handoff_bench.posted_rows): both figures finite, the
    # busy sender's > 0 (its receiver waits for a computing process), the blocked sender's
    # >= 0 (a message already there may cost the round nothing more: measured 0 us here once).
    from costmodel.profile import load_profile as _load
    fab = _load(str(prof)).fabric("loopback")
    assert math.isfinite(fab.send_recv_posted_busy_us) and fab.send_recv_posted_busy_us > 0
    assert math.isfinite(fab.send_recv_posted_idle_us) and fab.send_recv_posted_idle_us >= 0
    # The probe's draws: the compute worker's and one per collective launch that draws (8 at
    # world 2: validate/microbench.DRAW_LAUNCHES), each positive; the profile's probe is
    # their median.
    import statistics

    from validate.bench_record import bench_record_path, load_bench
    from validate.microbench import DRAW_LAUNCHES, POSTED_LAUNCHES
    bench = load_bench(bench_record_path(prof), "bench")
    assert DRAW_LAUNCHES <= POSTED_LAUNCHES
    assert len(bench.probe_draws_s) == 1 + DRAW_LAUNCHES and min(bench.probe_draws_s) > 0
    assert _load(str(prof)).runtime.speed_probe_us == pytest.approx(statistics.median(bench.probe_draws_s) * 1e6,
                                                                     abs=0.01)
    # The 2-rank all-reduce after compute is timed in every handoff launch too, the other
    # collectives' calls in the after-compute launches only (microbench.HANDOFF_LAUNCH_OPS).
    from validate.microbench import AFTER_COMPUTE_LAUNCHES
    draws = {(op, nb): len(ss) for op, n, nb, ss in bench.launch_samples if op.endswith("_after_compute")}
    assert draws and all(v == (POSTED_LAUNCHES if op == "all_reduce_after_compute" else AFTER_COMPUTE_LAUNCHES)
                         for (op, _), v in draws.items())
    # The overhead chain's draws: four spread over the compute worker and one at the start of
    # each collective launch that draws (microbench._pool_overhead_draws), each positive;
    # each figure is the median of its draws.
    assert len(bench.overhead_draws) == 4 + DRAW_LAUNCHES and min(min(d) for d in bench.overhead_draws) > 0
    for i, o in enumerate(bench.overhead):
        assert o.seconds == pytest.approx(statistics.median(d[i] for d in bench.overhead_draws), rel=1e-12)
    # Activation checkpointing's region cost: two draws of the chain under recompute none,
    # full and selective in the compute worker, each step positive; the profile's figures
    # are the record's (host_draws.checkpoint_region_us of the draws' medians), and a
    # checkpointed region costs the runner something on top of its recomputed ops.
    assert len(bench.recompute_draws) == 2 and min(min(d) for d in bench.recompute_draws) > 0
    rt = _load(str(prof)).runtime
    assert (rt.checkpoint_full_region_us, rt.checkpoint_selective_region_us) == (
        round(bench.checkpoint_region_us["full"], 1), round(bench.checkpoint_region_us["selective"], 1))
    assert rt.checkpoint_full_region_us > 0 and rt.checkpoint_selective_region_us > 0
    # FSDP's unit cost: two draws of plain and zero=3 training at the two widths, each step
    # positive; the profile's figures are the record's (host_draws.fsdp_unit_costs of
    # the draws' medians), and gathering units costs the runner something fixed.
    assert len(bench.fsdp_draws) == 2 and min(min(d) for d in bench.fsdp_draws) > 0
    assert (rt.fsdp_unit_us, rt.fsdp_unit_us_per_mib) == (
        round(bench.fsdp_unit["us"], 1), round(bench.fsdp_unit["us_per_mib"], 1))
    assert rt.fsdp_unit_us > 0
    # Compute against the activations held: one draw of the alive stage at each depth,
    # each step positive; the profile's figures are the record's (alive_bench.alive_fit
    # of the draws' medians), the knee at or above the shallowest order's figure.
    from validate.alive_bench import ALIVE_DEPTHS, alive_fit
    assert len(bench.alive_draws) == 1 and all(len(d) == len(ALIVE_DEPTHS) and min(d) > 0 for d in bench.alive_draws)
    fit = alive_fit([statistics.median(d[i] for d in bench.alive_draws) for i in range(len(ALIVE_DEPTHS))],
                    load_model("tiny"))
    assert fit == pytest.approx(bench.alive)
    assert (rt.alive_knee_mib, rt.alive_slowdown_per_doubling) == (
        round(bench.alive["knee_mib"], 3), round(bench.alive["per_doubling"], 4))
    assert rt.alive_knee_mib > 0 and 0 <= rt.alive_slowdown_per_doubling <= 1
    # The call probe's calibrated figure is the record's 32 KiB 2-rank after-compute row.
    from validate.probe import call_probe_figure
    row = [c.seconds for c in bench.collectives if (c.op, c.n, c.nbytes) == ("all_reduce_after_compute", 2, 32768)]
    assert len(row) == 1 and rt.call_probe_us == round(row[0] * 1e6, 1) == round(call_probe_figure(bench) * 1e6, 1) > 0
    # The record keeps the MiB held at each depth, so a refit of the saved record
    # (microbench.fit_draw_figures, benchmarks/repredict.py --refit) needs no model and gives
    # back exactly what the calibration wrote.
    from validate.alive_bench import alive_held_mib
    from validate.microbench import fit_draw_figures
    assert bench.alive_held_mib == pytest.approx(alive_held_mib(load_model("tiny")), rel=1e-12)
    again = fit_draw_figures(bench)
    assert again.alive == bench.alive and again.fsdp_unit == bench.fsdp_unit
    rep = tmp_path / "report"
    assert main(["validate", "localhost-cpu", "--model", "tiny", "--plan", "dp=2",
                 "--profile", str(prof), "--steps", "3", "--warmup", "1", "--launches", "2", "--json",
                 "--report", str(rep)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["launches"] == 2 and d["measured_steps"] == 6  # two launches of 3 steps, pooled
    # every step kept, and each launch's median is the median of its three steps
    assert len(d["measured_step_times_s"]) == 6 and len(d["launch_medians_s"]) == 2
    for k, med in enumerate(d["launch_medians_s"]):
        assert med == pytest.approx(sorted(d["measured_step_times_s"][3 * k:3 * k + 3])[1])
    # Activations kept for backward, measured in the warm-up step: dp=2 of tiny keeps 2,297,856
    # B by the cost model (4 layers x 525,312 + the output end's 196,608; fp32, no dropout,
    # fused attention) and 4,612 B more for real (costmodel/memory.py leaves out LayerNorm's
    # fp32 mean and rstd, 9 norms x 2 x 64 tokens x 4 B, and the loss's 4-byte weight sum).
    am = d["activation_memory"]
    assert am["predicted_bytes"] == 4 * 525_312 + 196_608 == 2_297_856
    assert am["measured_bytes"] == 2_297_856 + 9 * 2 * 64 * 4 + 4
    # The report: table, both traces (measured and simulated, same layout), calibration curves.
    for name in ("index.html", "report.md", "validation.csv", "trace-1-measured.json", "trace-1-simulated.json"):
        assert (rep / name).is_file()
    # the CSV's activation columns are the JSON's figures in MiB
    import csv
    row = next(csv.DictReader((rep / "validation.csv").read_text().splitlines()))
    assert float(row["activations_predicted_MiB"]) == pytest.approx(2_297_856 / 2**20, abs=5e-4)
    assert float(row["activations_measured_MiB"]) == pytest.approx(am["measured_bytes"] / 2**20, abs=5e-4)
    assert "Calibration curves" in (rep / "index.html").read_text()
    measured = json.loads((rep / "trace-1-measured.json").read_text())["traceEvents"]
    assert {e["pid"] for e in measured if e.get("ph") == "X"} == {0, 1}  # one process per rank
    for key in ("measured_step_time_s", "predicted_step_time_s", "error_pct"):
        assert math.isfinite(d[key])
    assert d["measured_step_time_s"] > 0 and d["predicted_step_time_s"] > 0
    assert set(d["phases"]) >= {"compute", "dp"}
    assert all(set(v) == {"measured_s", "predicted_s"} for v in d["phases"].values())
    # The speed probe: timed at calibration (the profile's speed_probe_us) and before the
    # run; the prediction is the simulation with the profile's compute slowed by the ratio,
    # recomputed here from the two probes (validate/probe.py, sim/core_sharing.slowed_profile).
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from sim.core_sharing import slowed_profile
    from sim.metrics import simulate
    from specs.plan import resolve_plan
    from validate.probe import drift_factor
    probe = d["speed_probe"]
    cluster, _ = resolve_world("localhost-cpu", 2, "--plan", "")
    profile = load_profile(str(prof), bundled=cluster.profiles)
    assert probe["calibrated_s"] == pytest.approx(profile.runtime.speed_probe_us * 1e-6) and probe["calibrated_s"] > 0
    assert probe["run_s"] > 0
    f = drift_factor(probe["run_s"], profile.runtime.speed_probe_us)
    assert probe["drift_factor"] == (None if f is None else pytest.approx(f)) and probe["applied"] == (f is not None)
    model = load_model("tiny")
    plan = resolve_plan({"dp": 2, "precision": "fp32"}, model, 2)
    used = slowed_profile(profile, f) if f is not None else profile
    # The call probe likewise: timed at calibration (call_probe_us) and beside the run, the
    # fabric's call costs scaled so that the profile prices the probe's row at what the probes
    # read (validate/probe.call_drift, anchored_call_factor, sim/core_sharing.slowed_calls).
    from sim.core_sharing import slowed_calls
    from validate.calibrate import collective_time_s
    from validate.probe import CALL_PROBE_BYTES, anchored_call_factor, call_drift
    calls = d["call_probe"]
    assert calls["calibrated_s"] == pytest.approx(profile.runtime.call_probe_us * 1e-6) and calls["calibrated_s"] > 0
    assert len(calls["launches_s"]) == 2 and all(x > 0 for pair in calls["launches_s"] for x in pair)
    node = cluster.nodes[0]

    def row_s(p):  # the probe's row as calibration's fit prices it
        return collective_time_s("all_reduce", CALL_PROBE_BYTES, 2, node.intra_bw_Bps, node.intra_latency_s,
                                 p.fabric(node.intra_kind))
    assert calls["priced_s"] == pytest.approx(row_s(profile), rel=1e-9) and calls["priced_s"] > 0
    ratio = call_drift([(calls["launches_s"], profile.runtime.call_probe_us)])[0]
    cf = anchored_call_factor(ratio, profile.runtime.call_probe_us, row_s(profile), row_s(slowed_calls(profile, 0.0)))
    assert calls["drift_factor"] == (None if cf is None else pytest.approx(cf)) and calls["applied"] == (cf is not None)
    if cf is not None and cf != ratio:  # anchored: the row priced at the probes' median
        assert row_s(slowed_calls(profile, cf)) == pytest.approx(ratio * profile.runtime.call_probe_us * 1e-6)
    used = slowed_calls(used, cf) if cf is not None else used
    assert d["predicted_step_time_s"] == pytest.approx(simulate(model, plan, cluster, used).step_time_s, rel=1e-9)


def test_calibrate_and_validate_one_process_smoke(tmp_path, capsys):
    """The one-device path, which benchmarks/calibrate_cuda.sh takes on a machine with one
    GPU: calibrate at world 1 (no collectives to time) and validate two one-process plans
    with that profile. Each plan's activations kept for backward are the hand-worked
    figures of tiny at microbatch 1 (64 tokens x 128 hidden, fp32): without recomputation 4
    layers x 525,312 B + the output end's 196,608 B = 2,297,856 B (the same as a dp=2 rank's,
    test_calibrate_and_validate_smoke), with full recomputation each layer keeps only its
    input, 4 x 64 x 128 x 4 B + 196,608 B = 327,680 B; the prediction is the simulation with
    the profile slowed by the speed probe's factor, recomputed here."""
    pytest.importorskip("torch")
    pytest.importorskip("validate.runner")
    prof = tmp_path / "w1.yaml"
    assert main(["calibrate", "localhost-cpu", "--world", "1", "--quick", "--model", "tiny", "--out", str(prof)]) == 0
    capsys.readouterr()
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from sim.core_sharing import slowed_profile
    from sim.metrics import simulate
    from specs.plan import resolve_plan
    from validate.probe import validation_drift
    cluster, _ = resolve_world("localhost-cpu", 1, "--plan", "")
    profile = load_profile(str(prof), bundled=cluster.profiles)
    assert profile.runtime.speed_probe_us > 0 and "in 1 process(es) at once" in profile.runtime.source
    assert main(["validate", "localhost-cpu", "--model", "tiny", "--plans", "mbs=1", "recompute=full",
                 "--profile", str(prof), "--steps", "2", "--warmup", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["world"] for p in d["plans"]] == [1, 1]
    model = load_model("tiny")
    # one speed factor for the validation: the median over both plans' probes
    f = validation_drift([(p["speed_probe"]["launches_s"], profile.runtime.speed_probe_us) for p in d["plans"]])
    used = slowed_profile(profile, f) if f is not None else profile
    # 4 x 525,312 + 196,608 B; 4 x (64 x 128 x 4 B) + 196,608 B (the docstring)
    kept = {"mbs=1": 2_297_856, "recompute=full": 327_680}
    for p, (text, saved) in zip(d["plans"], kept.items()):
        assert p["measured_step_time_s"] > 0 and math.isfinite(p["error_pct"])
        assert p["activation_memory"]["predicted_bytes"] == saved
        assert p["call_probe"]["drift_factor"] is None  # one process: no call to probe
        assert p["speed_probe"]["drift_factor"] == (None if f is None else pytest.approx(f))
        plan = resolve_plan(with_runner_precision(text), model, 1)
        assert p["predicted_step_time_s"] == pytest.approx(simulate(model, plan, cluster, used).step_time_s, rel=1e-9)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_cuda_script_refuses_without_cuda(tmp_path):
    """benchmarks/calibrate_cuda.sh on a machine without CUDA stops at once with exit 2 and
    a message, writing no profile."""
    import subprocess
    if _cuda():
        pytest.skip("this machine has CUDA; the refusal path is for CPU-only machines")
    pytest.importorskip("torch")
    p = subprocess.run(["bash", "benchmarks/calibrate_cuda.sh", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "no CUDA device" in p.stderr
    assert not list(tmp_path.glob("*.yaml"))


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (GPU-only test)")
def test_cuda_script_calibrates_and_validates(tmp_path):
    """On a CUDA machine the prepared script writes a profile named after the GPU and date
    whose source names the GPU, and a validation table."""
    import subprocess
    p = subprocess.run(["bash", "benchmarks/calibrate_cuda.sh", str(tmp_path)], capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stderr[-2000:]
    profiles = [q for q in tmp_path.glob("*-20*.yaml")]
    assert len(profiles) == 1
    assert "nccl" in profiles[0].read_text()
    assert (tmp_path / "report" / "validation.json").is_file()


def test_calibrate_runs_dispatches_to_fit_runs(monkeypatch, tmp_path, capsys):
    """`calibrate --runs CSV --out P.yaml` hands the CSV and --folds to
    validate.fit_runs.calibrate_from_runs, writes its profile_yaml() to P.yaml and prints
    format_summary(fit). (The fit itself is validate/fit_runs.py's, tested there; a stand-in
    module records the call so this test checks only the wiring.)"""
    import types
    calls = {}

    class Fit:
        def profile_yaml(self):
            return "name: fitted\n"

    def calibrate_from_runs(csv, *, folds=5, **kw):
        calls.update(csv=csv, folds=folds)
        return Fit()

    mod = types.SimpleNamespace(calibrate_from_runs=calibrate_from_runs, format_summary=lambda f: "SUMMARY LINE")
    monkeypatch.setitem(sys.modules, "validate.fit_runs", mod)
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--runs", "runs.csv", "--folds", "3", "--out", str(out)]) == 0
    assert calls == {"csv": "runs.csv", "folds": 3}
    assert out.read_text() == "name: fitted\n"
    assert "SUMMARY LINE" in capsys.readouterr().out


def test_runner_precision_reaches_plan_files(tmp_path):
    """The runner computes in fp32, so the simulated twin of a plan must be fp32 whether the
    plan comes as a string or as a YAML file (a file used to keep the bf16 default, so the
    prediction counted half the bytes the run moved); another precision is refused."""
    path = tmp_path / "p.yaml"
    path.write_text("tp: 2\n")
    assert with_runner_precision(str(path)) == {"tp": 2, "precision": "fp32"}
    assert with_runner_precision("dp=2")["precision"] == "fp32"
    with pytest.raises(InputError):
        with_runner_precision("dp=2,precision=bf16")
    assert plan_world(with_runner_precision(str(path))) == 2


def test_search_validate_top_plans(capsys, monkeypatch):
    """`plansim search --validate 2` on a 2-process host runs the search's two best plans
    that the runner implements for real: the JSON carries both, in the search's order
    after the skipped ones (each named with its reason), each predicted at the runner's
    precision (fp32) exactly as `plansim simulate` of that plan gives, with a Spearman
    correlation in [-1, 1] over the two. The plans' inputs (profiles included) are checked
    and read once, before the search's report, and reused for the runs; both plans (one
    process count) run in one shared launch."""
    pytest.importorskip("torch")
    pytest.importorskip("validate.runner")
    import plansim.cmd_validate as cv
    import validate.runner as vr
    calls, shared = [], []
    real_prepare = cv.prepare_plans
    monkeypatch.setattr(cv, "prepare_plans", lambda *a, **k: calls.append(a) or real_prepare(*a, **k))
    real_run_plans = vr.run_plans
    monkeypatch.setattr(vr, "run_plans", lambda model, plans, **k: shared.append(len(plans))
                        or real_run_plans(model, plans, **k))
    from pathlib import Path
    from costmodel.profile import load_profile
    from sim.metrics import simulate
    from specs.model import load_model
    from specs.plan import resolve_plan
    from specs.topology import load_topology
    topo = str(Path(__file__).parent / "data" / "localhost-cpu-2.yaml")
    assert main(["search", topo, "--model", "tiny", "--top", "10", "--validate", "2",
                 "--validate-steps", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = d["validation"]["plans"]
    skipped = [x["plan"] for x in d["validation"]["skipped"]]
    # each skipped plan is one the runner refuses, named with the runner's own reason
    from validate.runner import check_supported
    for x in d["validation"]["skipped"]:
        with pytest.raises(InputError) as err:
            check_supported(load_model("tiny"), resolve_plan(x["plan"], load_model("tiny"), 2))
        assert err.value.message in x["reason"]
    wanted = [r["plan"] for r in d["ranked"] if r["plan"] not in skipped][:2]
    assert [p["plan"].replace(",precision=fp32", "") for p in got] == wanted  # search plans are bf16, the default
    assert [r["plan"] for r in d["ranked"]].index(wanted[-1]) == len(skipped) + 1
    model, cluster = load_model("tiny"), load_topology(topo)
    for p in got:
        sim = simulate(model, resolve_plan(p["plan"], model, 2), cluster, load_profile(None, bundled=cluster.profiles))
        assert p["predicted_step_time_s"] == pytest.approx(sim.step_time_s, rel=1e-9)
        assert p["measured_step_time_s"] > 0
    assert -1.0 <= d["validation"]["spearman"] <= 1.0
    assert len(calls) == 1
    assert shared == [2]


def test_search_validate_out_of_range(capsys):
    """--validate K beyond the simulated plans is an input error (exit 2) before any run."""
    from pathlib import Path
    topo = str(Path(__file__).parent / "data" / "localhost-cpu-2.yaml")
    assert main(["search", topo, "--model", "tiny", "--top", "1", "--validate", "999"]) == 2
    assert "--validate" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--validate", "999"], "--validate: 999: must be in [1, "),
    (["--validate", "1", "--validate-steps", "0"], "--validate-steps: 0: must be an integer in [1, 10000]"),
    (["--validate", "1", "--validate-steps", "100000000"], "--validate-steps: 100000000: must be an integer"),
    (["--validate", "-1"], "--validate: -1: must be an integer in [0, 1000]"),
], ids=["k-beyond-the-plans", "steps-0", "steps-1e8", "k-negative"])
def test_search_validate_checked_before_the_report_is_written(tmp_path, capsys, monkeypatch, argv, needle):
    """A bad --validate K or --validate-steps with --report: exit 2, one line, and no report
    folder, with nothing run. Before: both were checked only after the search had written
    its report (exit 2 with the report left behind), and --validate-steps 100000000 was
    accepted and started the real runs."""
    import plansim.cmd_validate as cv

    def no_run(*_, **__):
        raise AssertionError("a real run started")
    monkeypatch.setattr(cv, "validate_plans", no_run)
    out = tmp_path / "r"
    assert main(["search", "dgx-a100", "--nodes", "1", "--model", "tiny", "--top", "1", *argv,
                 "--report", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and not out.exists()


def test_search_validate_on_a_cluster_the_runner_cannot_be_writes_no_report(tmp_path, capsys):
    """--validate on a heterogeneous topology (the validator runs one host of one node type)
    is refused before the search's report is written. Before: the report was written, then
    the validation's own check failed (exit 2 with the report left behind)."""
    out = tmp_path / "r"
    assert main(["search", "hetero-a100-v100", "--model", "tiny", "--validate", "1", "--report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "one host of one node type" in err and err.count("\n") == 1 and not out.exists()


def test_ranking_lists_swapped_pairs_with_their_measured_gap():
    """Three plans measured 100, 105 and 200 ms, predicted 110, 100 and 300 ms: only the
    first two are ordered the other way round, measured 5.0 % apart (of the faster); the
    JSON and the printed ranking both name that pair and nothing else."""
    from validate.compare import Comparison, Ranking, format_ranking
    comps = [Comparison(f"p{i}", 2, m * 1e-3, q * 1e-3, m * 1e-3, m * 1e-3, {})
             for i, (m, q) in enumerate([(100, 110), (105, 100), (200, 300)])]
    r = Ranking(comps)
    assert not r.same_order()
    assert [(i, j) for i, j, _ in r.swapped_pairs()] == [(0, 1)]
    assert r.swapped_pairs()[0][2] == pytest.approx(5.0)
    d = r.to_dict()["swapped_pairs"]
    assert d == [{"plans": ["p0", "p1"], "measured_gap_pct": pytest.approx(5.0), "told_apart": True}]
    text = format_ranking(r)
    assert "swapped: p0 / p1 (measured 5.0 % apart)" in text and text.count("swapped:") == 1


def _comp(name: str, launch_medians_ms: list[float], predicted_ms: float):
    from validate.compare import Comparison
    import statistics
    m = statistics.median(launch_medians_ms) * 1e-3
    return Comparison(name, 2, m, predicted_ms * 1e-3, m, m, {},
                      record={"launch_medians_s": [x * 1e-3 for x in launch_medians_ms],
                              "launches": len(launch_medians_ms)})


def test_ranking_resolved_order_ignores_swaps_between_overlapping_launches():
    """Launch medians a = (60, 66), b = (63, 70), c = (80, 84) ms; predicted 65, 62, 90.
    a and b overlap (63 <= 66): a measured tie, so predicting b before a is no error;
    c is told apart from both. Strict order fails (a measured 63 before b 66.5), the
    order of the plans the runs tell apart holds. Predicting c at 61 instead swaps c with
    a and with b, both told apart: the resolved order then fails too."""
    from validate.compare import Ranking, format_ranking
    r = Ranking([_comp("a", [60, 66], 65), _comp("b", [63, 70], 62), _comp("c", [80, 84], 90)])
    assert not r.same_order() and r.resolved_order()
    assert r.ties() == [(0, 1)] and r.told_apart(0, 2) and r.told_apart(1, 2)
    assert [(i, j) for i, j, _ in r.swapped_pairs()] == [(0, 1)]
    d = r.to_dict()
    assert d["resolved_order"] is True and d["measured_ties"] == [["a", "b"]]
    assert d["swapped_pairs"][0]["told_apart"] is False
    text = format_ranking(r)
    assert "(measured 5.6 % apart; a measured tie)" in text  # (66.5 - 63) / 63
    assert "tell apart: yes (1 of 3 pairs measured as ties)" in text
    r2 = Ranking([_comp("a", [60, 66], 65), _comp("b", [63, 70], 62), _comp("c", [80, 84], 61)])
    assert not r2.resolved_order()
    assert sorted((i, j) for i, j, _ in r2.swapped_pairs() if r2.told_apart(i, j)) == [(0, 2), (1, 2)]


def test_ranking_single_launch_uses_the_step_spread():
    """With one launch a plan's measured range is its steps' p10..p90: 100 (95..104) and
    103 (101..108) ms overlap, a tie; 100 and 110 (105..115) do not."""
    from validate.compare import Comparison, Ranking
    a = Comparison("a", 2, 0.100, 0.1, 0.095, 0.104, {})
    b = Comparison("b", 2, 0.103, 0.1, 0.101, 0.108, {})
    c = Comparison("c", 2, 0.110, 0.1, 0.105, 0.115, {})
    r = Ranking([a, b, c])
    assert not r.told_apart(0, 1) and r.told_apart(0, 2) and not r.told_apart(1, 2)


@pytest.mark.parametrize("plan, short", [
    ("tp=1,pp=2,dp=1,mbs=1,schedule=1f1b,precision=fp32", "pp=2,schedule=1f1b"),
    ("tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,precision=fp32", "dp=2"),
    ("tp=2,pp=1,dp=2,mbs=1,schedule=1f1b,compress=topk:0.1,precision=fp32", "tp=2,dp=2,compress=topk:0.1"),
    # whole fields only: degrees and microbatch sizes that start with 1 stay
    ("tp=16,pp=12,dp=128,mbs=16,schedule=1f1b,precision=fp32", "tp=16,pp=12,dp=128,mbs=16,schedule=1f1b"),
])
def test_short_plan_drops_only_the_shared_fields(plan, short):
    """short_plan leaves out mbs=1, degrees of 1, the precision, and 1F1B where there is no
    pipeline, and nothing else (pp=12 is a pipeline; tp=16 is not tp=1)."""
    from validate.compare import short_plan
    assert short_plan(plan) == short


@pytest.mark.parametrize("record, needle", [
    ("[1, 2]", "not a calibration's microbenchmarks (TypeError)"),
    ('{"backend": "gloo"}', "not a calibration's microbenchmarks (no 'world' field)"),
    ("[" * 100_000, "JSON nested too deeply"),
    ('{"world": 2, "backend": "gloo", "threads": 1, "gpu": 5}', "gpu: 5: expected a name"),
    ("\x00\x01", "binary content"),
])
def test_validate_report_checks_the_calibration_record_before_any_run(tmp_path, record, needle, capsys,
                                                                       monkeypatch):
    """plansim validate --report draws the calibration curves from the .bench.json beside
    each profile; a damaged record is one line naming it, exit 2, before any worker starts
    and with no report folder written (before: a traceback after the runs, from the
    report's own json.loads)."""
    import validate.runner
    monkeypatch.setattr(validate.runner, "run_plan", lambda *a, **k: pytest.fail("a worker was started"))
    prof = tmp_path / "p.yaml"
    prof.write_text("gpus:\n  default:\n    hbm_eff: 0.5\n", encoding="utf-8")
    (tmp_path / "p.bench.json").write_text(record, encoding="utf-8")
    rep = tmp_path / "rep"
    assert main(["validate", "localhost-cpu", "--model", "tiny", "--plan", "dp=2", "--profile", str(prof),
                 "--report", str(rep)]) == 2
    err = capsys.readouterr().err.strip()
    assert "p.bench.json" in err and needle in err and len(err.splitlines()) == 1, err
    assert not rep.exists()


def test_launch_spread_by_hand_and_noted_beyond_the_tolerance():
    """Launch medians 512.1 and 371.2 ms (conf-10's tp=2): 512.1 / 371.2 - 1 = 37.96 %,
    beyond the 15 % tolerance, so the plan's text carries a note and the JSON the figure;
    medians 60 and 66 ms are 10 % apart (no note); one launch has no spread (None)."""
    from validate.compare import format_comparison
    wide = _comp("tp=2", [512.1, 371.2], 516.5)
    assert wide.launch_spread_pct() == pytest.approx(37.958, abs=1e-3)
    assert wide.to_dict()["launch_spread_pct"] == pytest.approx(37.958, abs=1e-3)
    assert "launches 38 % apart" in format_comparison(wide)
    narrow = _comp("dp=2", [60.0, 66.0], 62.0)
    assert narrow.launch_spread_pct() == pytest.approx(10.0)
    assert "apart" not in format_comparison(narrow)
    assert _comp("one", [70.0], 70.0).launch_spread_pct() is None


def test_shared_launches_run_each_plan_as_its_own_launch_would(capsys):
    """--shared-launches: each launch runs the plans of one process count one after another
    in one set of processes. Every plan still gets its own record per launch (2 launches of
    2 steps pooled: 4 steps, 2 launch medians), plans come back in the order given whatever
    their world size, and a plan's losses are the ones it computes alone in fresh
    processes (validate.runner.run_plan; same seed: the same numbers), so running after
    another plan changed nothing it computes. With no profile given, the progress lines
    start with a note naming the uncalibrated process counts and the calibrate command."""
    pytest.importorskip("torch")
    from plansim.cmd_validate import validate_plans
    from specs.model import load_model
    from specs.plan import resolve_plan
    from validate.runner import run_plan

    plans = ["pp=2,schedule=gpipe", "dp=4", "dp=2"]
    notes: list[str] = []
    comps = validate_plans("localhost-cpu", "tiny", plans, {}, steps=2, warmup=1, seed=0, timeout_s=240,
                           record=False, launches=2, shared=True, progress=notes.append)
    assert notes[0].startswith("note: no --profile for the 2, 4-process plans")
    # one calibration per process count, each world's profile named for --profile
    assert "plansim calibrate localhost-cpu --world 2 --model tiny --out cpu-w2.yaml" in notes[0]
    assert "plansim calibrate localhost-cpu --world 4 --model tiny --out cpu-w4.yaml" in notes[0]
    assert notes[0].endswith("then --profile 2=cpu-w2.yaml --profile 4=cpu-w4.yaml")
    assert not any(n.startswith("note:") for n in notes[1:])
    assert [c.world for c in comps] == [2, 4, 2]
    model = load_model("tiny")
    for text, c in zip(plans, comps):
        rec = c.record
        plan = resolve_plan(with_runner_precision(text), model, plan_world(text))
        assert c.plan == plan.to_string()  # the records of a launch went to their own plans
        assert rec["launches"] == 2 and rec["steps"] == 4 and len(rec["launch_medians_s"]) == 2
        assert len(rec["losses"]) == 3  # the first launch's: warm-up + measured steps
        if text != "dp=4":
            alone = run_plan(model, plan, steps=2, warmup=1, seed=0, timeout_s=240)
            assert rec["losses"] == pytest.approx(alone.losses, rel=1e-6, abs=0)


def test_peak_memory_is_the_runs_own_after_a_reset():
    """With --shared-launches a process runs several plans; each run's CPU peak must be
    its own, not the process's since it started. After 256 MiB were written and freed,
    the high-water mark read back is at least 240 MiB above the baseline; after
    validate.runner._reset_peak_memory it is back within 64 MiB of the process's resident
    size (Linux: /proc/self/clear_refs; skipped where it cannot be written)."""
    import os
    from validate.runner import _peak_memory_bytes, _reset_peak_memory
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("no writable /proc/self/clear_refs (not Linux, or not allowed)")

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    _reset_peak_memory("cpu", None)
    base = rss()
    big = b"\x01" * (256 * 1024 * 1024)  # written: every page resident
    del big
    assert _peak_memory_bytes("cpu", None) >= base + 240 * 1024 * 1024
    _reset_peak_memory("cpu", None)
    assert _peak_memory_bytes("cpu", None) <= rss() + 64 * 1024 * 1024


def test_shared_launch_error_names_the_plan(monkeypatch):
    """In a launch several plans share, a run's own error names its plan (the launch
    reports only the rank); a peer's failure (a gloo transport error) is passed on as it
    is, so the launch still blames the rank that failed first; a launch of one plan is
    unchanged."""
    pytest.importorskip("torch")
    import validate.runner as vr
    from specs.model import load_model
    from specs.plan import resolve_plan
    model = load_model("tiny")
    plans = [resolve_plan(p, model, 2) for p in ("dp=2", "tp=2")]
    runs = [(model, p, vr.RunConfig(steps=1, warmup=0, seed=0, backend="gloo")) for p in plans]

    def fake(rank, world, model, plan, cfg, exc):
        if plan.tp == 2:
            raise exc
        return {"rank": rank}
    monkeypatch.setattr(vr, "_worker", lambda *a: fake(*a, ValueError("boom")))
    with pytest.raises(RuntimeError) as err:
        vr._worker_many(0, 2, runs)
    assert str(err.value).startswith(f"plan {plans[1].to_string()}: ValueError: boom")
    monkeypatch.setattr(vr, "_worker", lambda *a: fake(*a, RuntimeError("[gloo] Connection closed by peer")))
    with pytest.raises(RuntimeError, match=r"^\[gloo\] Connection closed by peer$"):
        vr._worker_many(0, 2, runs)
    monkeypatch.setattr(vr, "_worker", lambda *a: fake(*a, ValueError("boom")))
    with pytest.raises(ValueError, match="^boom$"):
        vr._worker_many(0, 2, runs[1:])


def test_phases_by_stage_by_hand():
    """Pipeline plans get per-stage pairs: measured, the mean over a stage's ranks (two
    ranks of stage 1 at 10 and 20 ms of bubble: 15); predicted, the mean over that stage's
    simulated devices weighted by the devices each stands for (3 x 4 ms and 1 x 8 ms of
    compute: 5 ms). No pipeline (one stage): nothing."""
    from sim.result import CATEGORIES, DeviceResult
    from validate.compare import phases_by_stage

    def ph(**kw):
        return {c: kw.get(c, 0.0) for c in CATEGORIES}

    def dev(stage, represents, **kw):
        return DeviceResult(rank=0, stage=stage, pipeline="p", gpu="CPU", represents=represents,
                            breakdown_s=ph(**kw), busy_s=0.0, memory_gib={}, peak_memory_gib=0.0,
                            capacity_gib=1.0, fits_memory=True)

    class Sim:
        devices = [dev(0, 3, compute=0.004), dev(0, 1, compute=0.008), dev(1, 4, bubble=0.002)]

    per_rank = [{"stage": 0, "phases_s": ph(compute=0.006)}, {"stage": 1, "phases_s": ph(bubble=0.010)},
                {"stage": 1, "phases_s": ph(bubble=0.020)}]
    got = phases_by_stage(per_rank, Sim())
    assert got[0]["compute"] == {"measured_s": pytest.approx(0.006), "predicted_s": pytest.approx(0.005)}
    assert got[1]["bubble"] == {"measured_s": pytest.approx(0.015), "predicted_s": pytest.approx(0.002)}
    assert phases_by_stage([{"stage": 0, "phases_s": ph(compute=1.0)}], Sim()) == {}


def test_saved_activations_pairs_the_busiest_rank():
    """compare.saved_activations: the busiest measured rank's pair and error (rank 1: 110
    measured, 100 predicted: -9.09 %), every rank's pair; {} when no rank measured (no
    warm-up step); context parallelism reported but marked not comparable."""
    from types import SimpleNamespace

    from validate.compare import saved_activations
    rec = SimpleNamespace(per_rank=[{"rank": 0, "saved_activation_bytes": 90},
                                    {"rank": 1, "saved_activation_bytes": 110}])
    plan = SimpleNamespace(cp=1)
    got = saved_activations(rec, {0: 95.0, 1: 100.0}, plan)
    assert (got["rank"], got["measured_bytes"], got["predicted_bytes"]) == (1, 110, 100.0)
    assert got["error_pct"] == pytest.approx(100 * (100 / 110 - 1))
    assert got["per_rank"] == [[0, 90, 95.0], [1, 110, 100.0]] and "not_comparable" not in got
    none = SimpleNamespace(per_rank=[{"rank": 0, "saved_activation_bytes": 0}])
    assert saved_activations(none, {0: 95.0}, plan) == {}
    assert "ring attention" in saved_activations(rec, {0: 95.0, 1: 100.0}, SimpleNamespace(cp=2))["not_comparable"]


def test_validate_refuses_a_topology_of_other_devices(capsys):
    """On a host without CUDA the plans run on its CPU: validating against dgx-a100 would set
    an A100 node's prediction beside a CPU measurement. One line naming the devices and
    localhost-cpu, exit 2, in seconds and before any worker starts (it launched a real run)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the plans would run on GPUs")
    from plansim.cli import main
    assert main(["validate", "dgx-a100", "--plan", "tp=2", "--steps", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "A100-SXM4-80GB" in err and "localhost-cpu" in err


def test_a_second_profile_for_one_world_is_refused():
    """--profile 2=A --profile 2=B ran with B (the last silently won); now refused naming
    both. One per world size, plus one for all plans, is still fine."""
    from plansim.cmd_validate import profile_for
    with pytest.raises(InputError) as exc:
        profile_for(["2=a.yaml", "2=b.yaml"])
    assert "a second profile for world 2 (first: 'a.yaml')" in str(exc.value)
    with pytest.raises(InputError):
        profile_for(["a.yaml", "b.yaml"])
    assert profile_for(["2=a.yaml", "4=b.yaml", "c.yaml"]) == {2: "a.yaml", 4: "b.yaml", None: "c.yaml"}


def test_validate_refuses_a_plan_the_host_memory_cannot_hold(capsys, monkeypatch):
    """A CPU plan whose processes would hold more than the host has available is refused
    before any worker starts: exit 2, one line with the need (processes x the memory
    model's peak under the runner's facts, worked out here from simulate) and what the host
    has. With 16 MiB available, tiny at dp=2 (about 15 MiB a process) is refused."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the plans would run on GPUs")
    from dataclasses import replace

    import plansim.cmd_validate as cv
    import validate.runner as vr
    from sim.metrics import simulate
    from validate.profile_file import runtime_facts
    monkeypatch.setattr(cv, "available_memory_bytes", lambda: 16 * 2**20)
    monkeypatch.setattr(vr, "run_plan", lambda *a, **k: pytest.fail("a worker was started"))
    monkeypatch.setattr(vr, "run_plans", lambda *a, **k: pytest.fail("a worker was started"))
    (plan, cluster, profile, _), = cv.prepare_plans("localhost-cpu", "tiny", ["dp=2"], {})
    runner = replace(profile, runtime=replace(profile.runtime, **runtime_facts("cpu")))
    need_mib = 2 * simulate(load_model("tiny"), plan, cluster, runner).peak_memory_gib * 1024
    assert 16 < need_mib < 1024
    assert main(["validate", "localhost-cpu", "--plan", "dp=2", "--steps", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"about {need_mib:.0f} MiB" in err and "has 16 MiB available" in err


def test_a_failed_run_is_one_line_with_exit_1(capsys, monkeypatch):
    """A worker that dies (here: reported as killed by SIGKILL, as the kernel's OOM killer
    does) ends plansim validate with one line naming the rank, exit 1, no traceback."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the plans would run on GPUs")
    import validate.runner as vr
    from validate.launch import WorkerError

    def die(*a, **k):
        raise WorkerError(1, "killed by SIGKILL (exit code -9)")
    monkeypatch.setattr(vr, "run_plan", die)
    assert main(["validate", "localhost-cpu", "--plan", "dp=2", "--steps", "1", "--warmup", "0"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "plansim: error: rank 1: killed by SIGKILL (exit code -9)"
    assert "Traceback" not in err
