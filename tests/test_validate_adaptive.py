"""Real adaptive runs (validate/adaptive_run.py) stay exact while the controller moves work.

One launch of 2 gloo processes runs the tiny model twice with rank 1 slowed to a quarter
speed (validate/slowdown.py: dp by the default quota pause, pp by three extra
forward+backward passes whose gradients are discarded; a quarter rather than a half so the
controller's direction cannot be hidden by the timing noise of a shared host):
- data parallel: samples per rank re-allocated every step from measured busy times;
- 2-stage pipeline: layers moved between the stages, weights and Adam state sent for real.
Both are compared with the single-process reference (validate/reference.py) with the
tolerances of tests/test_validate_correctness.py: losses of every step to 1e-5 relative,
weights after the last step normwise to 1e-3 of the reference's own update.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.errors import InputError  # noqa: E402
from specs.model import load_model  # noqa: E402
from validate.adaptive_run import AdaptiveConfig, run_adaptive_many  # noqa: E402
from validate.gpt import full_weights  # noqa: E402
from validate.migrate import owners  # noqa: E402
from validate.reference import reference_run  # noqa: E402
from validate.slowdown import extra_passes, parse_slow_rank  # noqa: E402

LOSS_RTOL = 1e-5
UPDATE_RTOL = 1e-3
GRAD_ATOL = 1e-9
WARMUP, STEPS = 1, 4  # the first step carries one-off start-up costs: not observed
MODEL = load_model("tiny")


@pytest.fixture(scope="module")
def runs():
    torch.set_num_threads(1)
    cfgs = [AdaptiveConfig(mode="dp", steps=STEPS, warmup=WARMUP, slow_rank=1, speed=0.25, backend="gloo",
                           capture=True),
            AdaptiveConfig(mode="pp", steps=STEPS, warmup=WARMUP, slow_rank=1, speed=0.25, mbs=4,
                           backend="gloo", capture=True)]
    dp, pp = run_adaptive_many(MODEL, cfgs, timeout_s=240)
    return {"dp": dp, "pp": pp, "ref": reference_run(MODEL, WARMUP + STEPS)}


def _check_exact(rec, ref):
    np.testing.assert_allclose(rec.losses, ref["losses"], rtol=LOSS_RTOL)
    init = {n: t.numpy() for n, t in full_weights(MODEL, 0).items()}
    assert set(rec.weights) == set(ref["weights"])
    for name, w in rec.weights.items():
        if np.abs(ref["grads"][name]).max() <= GRAD_ATOL:
            continue  # zero gradient (key bias): Adam's step there is the sign of roundoff
        update = np.linalg.norm(ref["weights"][name] - init[name])
        assert np.linalg.norm(w - ref["weights"][name]) <= UPDATE_RTOL * update, name


def test_dp_rebalanced_samples_keep_gradients_exact(runs):
    """The slow rank is given fewer samples after the first observed step (shares sum to
    the global batch of 16, never equal again), and every step's loss and the final
    weights equal the single-process reference's: the reduction weights each rank by its
    sample count."""
    rec = runs["dp"]
    assert rec.units[0] == [8, 8]
    for u in rec.units[1:]:
        assert sum(u) == 16 and u[0] > u[1], rec.units
    assert rec.decisions[0]["act"] is True
    _check_exact(rec, runs["ref"])


def test_pp_layers_moved_for_real_keep_the_model_exact(runs):
    """The controller moves a layer off the slow stage ((2, 2) -> (3, 1) in the end), the
    move sends one layer's weights and both Adam moments (3 x 198,272 fp32 values =
    2,379,264 bytes per layer, counted by hand from layer_params: 4*128*128 + 2*128*512
    weights + 128*9 + 512 biases and norms), and the model after the move computes the
    reference's losses and ends with its weights."""
    rec = runs["pp"]
    assert rec.migrations, rec.decisions
    assert rec.units[-1] == [3, 1] or rec.migrations[-1]["to"] == [3, 1], rec.units
    layer_values = 4 * 128 * 128 + 2 * 128 * 512 + 128 * 9 + 512
    for m in rec.migrations:
        moved = sum(abs(a - b) for a, b in zip(m["from"], m["to"])) // 2
        assert m["bytes"] == moved * 3 * layer_values * 4
    _check_exact(rec, runs["ref"])


def test_slow_rank_parsing_and_extra_passes():
    """'1:0.5' is rank 1 at half speed: one extra pass; 0.4 -> 1.5 extra passes; 1.0 none;
    malformed or out-of-range specs raise InputError naming --slow-rank."""
    assert parse_slow_rank("1:0.5", 2) == (1, 0.5)
    assert extra_passes(0.5) == (1, 0.0)
    assert extra_passes(1.0) == (0, 0.0)
    whole, frac = extra_passes(0.4)
    assert whole == 1 and frac == pytest.approx(0.5)
    for bad in ("1", "a:0.5", "1:0", "1:1.5", "2:0.5", "-1:0.5", "1:0.049", "1:nan", "1:inf"):
        with pytest.raises(InputError, match="--slow-rank"):
            parse_slow_rank(bad, 2)
    # the bounds themselves are allowed: the slowest rank (0.05) and the last process
    assert parse_slow_rank("1:0.05", 2) == (1, 0.05)
    with pytest.raises(InputError, match=r"rank: 2: must be an integer in \[0, 1\]"):
        parse_slow_rank("2:0.5", 2)


def test_layer_owners():
    """Contiguous split (3, 1) gives layers 0-2 to stage 0 and layer 3 to stage 1."""
    assert owners((3, 1)) == [0, 0, 0, 1]
    assert owners((2, 2)) == [0, 0, 1, 1]


def _rec(times, units=None, adaptive=False, slow_rank=1, speed=0.5, mode="dp", mbs=1):
    from validate.adaptive_run import AdaptiveRecord
    n = len(times)
    return AdaptiveRecord(mode=mode, world=2, slow_rank=slow_rank, speed=speed, adaptive=adaptive, mbs=mbs,
                          steps=n, warmup=0, step_times_s=list(times), busy_s=[[0.0, 0.0]] * n,
                          units=units or [[8, 8]] * n, decisions=[], migrations=[], losses=[])


def test_done_when_figures_hand_worked():
    """Unslowed 100 ms, fixed 200 ms, adaptive 140 ms (medians after the first step, whose
    500 ms are left out): ideal = 100 * 2 / (1 + 0.5) = 133.3 ms (4/3), adaptive +5.0 % above
    it; the best integer split of 16 samples at speeds (1, 0.5) is 11:5, 11/8 x 100 = 137.5 ms."""
    from validate.adaptive_figures import figures
    f = figures(_rec([0.5, 0.1, 0.1, 0.1]), _rec([0.5, 0.2, 0.2, 0.2]),
                _rec([0.5, 0.15, 0.14, 0.14], units=[[8, 8], [11, 5], [11, 5], [11, 5]], adaptive=True), settle=1)
    assert f.unslowed_s == pytest.approx(0.1) and f.fixed_s == pytest.approx(0.2)
    assert f.ideal_s == pytest.approx(0.4 / 3)
    assert f.adaptive_s == pytest.approx(0.14)
    assert f.error_vs_ideal_pct == pytest.approx(5.0)
    assert f.best_units == (11, 5) and f.integer_ideal_s == pytest.approx(0.1375)
    assert f.to_dict()["ideal_ratio"] == pytest.approx(4 / 3)


def test_prediction_against_single_step_closed_form():
    """Replayed allocations: an unslowed equal split is simulate()'s single step itself;
    with rank 1 at half speed (the scenario's compute_speed event) the equal split takes
    that step plus one more of rank 1's simulated compute (compute / 0.5 - compute, a
    closed form from the independent single-step simulation), and 11:5 is faster than the
    equal split. The simulator's adaptive
    run of the same scenario ends at 11:5 (the best integer split of 16 at speeds 1, 0.5)."""
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from sim.metrics import simulate
    from specs.plan import resolve_plan
    from validate.adaptive_figures import predict_adaptive, predict_replay
    cluster, _ = resolve_world("localhost-cpu", 2)
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan({"dp": 2, "mbs": 1, "overlap_grad_reduce": False, "precision": "fp32"}, MODEL, 2)
    res = simulate(MODEL, plan, cluster, profile)
    compute = max(d.breakdown_s["compute"] for d in res.devices)
    assert compute > 0
    assert predict_replay(MODEL, _rec([1.0], slow_rank=None, speed=1.0), cluster, profile) == \
        pytest.approx([res.step_time_s], rel=1e-6)
    slow = predict_replay(MODEL, _rec([1.0, 1.0], units=[[8, 8], [11, 5]]), cluster, profile)
    assert slow[0] == pytest.approx(res.step_time_s + compute, rel=1e-3)
    assert slow[1] < slow[0]
    times, units = predict_adaptive(MODEL, _rec([1.0] * 8), cluster, profile)
    assert len(times) == 8 and units[-1] == [11, 5] and times[-1] < times[0]


def test_pipeline_prediction_moves_a_layer_off_the_slow_stage():
    """Pipeline replay: with stage 1 at half speed, 3:1 layers is predicted faster than
    2:2 (the slow stage's 2 layers cost 4 layer-times, 3:1 costs max(3, 2)); the simulator's
    own adaptive run of the scenario moves to 3:1 as the real controller does."""
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from validate.adaptive_figures import predict_adaptive, predict_replay
    cluster, _ = resolve_world("localhost-cpu", 2)
    profile = load_profile(None, bundled=cluster.profiles)
    rec = _rec([1.0, 1.0], units=[[2, 2], [3, 1]], mode="pp", mbs=4)
    even, moved = predict_replay(MODEL, rec, cluster, profile)
    assert moved < even
    _, units = predict_adaptive(MODEL, _rec([1.0] * 6, units=[[2, 2]] * 6, mode="pp", mbs=4), cluster, profile)
    assert units[-1] == [3, 1]


@pytest.mark.parametrize("argv", [["--slow-rank", "2:0.5"], ["--slow-rank", "1:2"], ["--settle", "16"],
                                  ["--world", "5"], ["--mode", "pp", "--slow-by", "quota"]])
def test_cli_bad_input_exits_2_before_running(argv, capsys):
    """A slow rank outside the 2 processes, a speed above 1, a settle window as long as the
    run, more processes than the localhost-cpu node has (4), or the quota slowdown for a
    pipeline (its backward runs inside validate/pp.py, out of the pause's reach): exit 2 with a one-line
    message, before any process starts."""
    from plansim.cli import main
    assert main(["validate-adaptive", "localhost-cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1


def test_pp_on_nccl_refused():
    """An adaptive pipeline run on NCCL is refused before any process starts with a
    one-line message naming --mode (its layer moves receive into host buffers); the main
    runner accepts pipeline plans on NCCL (validate/p2p_order.py), and a gloo pipeline and
    an NCCL data-parallel config pass the check."""
    from specs.plan import resolve_plan
    from validate.adaptive_run import check_configs
    from validate.runner import check_supported
    with pytest.raises(InputError) as ad:
        check_configs(MODEL, [AdaptiveConfig(mode="pp", world=2, mbs=4, backend="nccl")])
    assert str(ad.value) == ("--mode: pp: adaptive pipeline runs move layers through host buffers, which "
                             "NCCL cannot fill: gloo only for now; set PLANSIM_BACKEND=gloo")
    check_supported(MODEL, resolve_plan("pp=2", MODEL, 2))
    check_configs(MODEL, [AdaptiveConfig(mode="pp", world=2, mbs=4, backend="gloo")])
    check_configs(MODEL, [AdaptiveConfig(mode="dp", world=2, backend="nccl")])


@pytest.mark.parametrize("argv,needle", [
    (["--steps", "100000000"], "--steps: 100000000: must be an integer in [1, 10000]"),
    (["--warmup", "100000000"], "--warmup: 100000000: must be an integer in [0, 10000]"),
    (["--timeout", "nan"], "--timeout: nan: must be a finite number in (0, 86400]"),
    (["--timeout", "-5"], "--timeout: -5.0: must be a finite number in (0, 86400]"),
    (["--timeout", "inf"], "--timeout: inf: must be a finite number"),
    (["--mbs", "0"], "--mbs: 0: must be an integer in [1, "),
    (["--mbs", "-1"], "--mbs: -1: must be an integer in [1, "),
    (["--seed", "-1"], "--seed: -1: must be an integer in [0, "),
    (["--seed", "100000000000000000000000"], "--seed: 100000000000000000000000: must be an integer in [0, "),
    (["--world", "0"], "--world: 0: must be an integer in [2, "),
    (["--world", "-1"], "--world: -1: must be an integer in [2, "),
    (["--out", ""], "--out: empty path"),
], ids=["steps-1e8", "warmup-1e8", "timeout-nan", "timeout-negative", "timeout-inf", "mbs-0", "mbs-negative",
        "seed-negative", "seed-1e23", "world-0", "world-negative", "out-empty"])
def test_cli_absurd_flags_refused_before_any_run(argv, needle, capsys, monkeypatch, tmp_path):
    """Absurd numbers and an empty --out are refused with one line naming the flag and the
    allowed range, before any process starts. Before: --steps/--warmup 10^8, --timeout
    nan/-5/inf, --mbs 0 (taken as the default), --seed -1 or 10^23 and --out '' (no record
    written, silently) all went on to start the real runs; --world 0 was reported as
    '--slow-rank: rank: 1: must be an integer in [0, -1]'."""
    import validate.adaptive_run as ar
    from plansim.cli import main

    def no_run(*_, **__):
        raise AssertionError("the real runs started")
    monkeypatch.setattr(ar, "run_adaptive_many", no_run)
    monkeypatch.chdir(tmp_path)
    assert main(["validate-adaptive", "localhost-cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
