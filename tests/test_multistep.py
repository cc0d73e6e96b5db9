"""Multi-step simulation (sim/multistep.py) against closed forms: steps back to back,
scenario events (slow device, slow NIC, stall, lost node), cross-step overlap
(layerwise update/gather, one-step-delayed gradients) and the adaptive controller."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from costmodel.errors import InputError
from costmodel.profile import FabricEfficiency, GpuEfficiency, Profile, load_profile
from costmodel.shapes import ModelSpec
from plansim.cli import main
from sim.adaptive_control import ControllerSettings, SimController, layer_state_bytes
from sim.metrics import simulate
from sim.multistep import simulate_steps
from sim.program import build_program
from specs.model import load_model
from specs.plan import resolve_plan
from specs.scenario import load_scenario
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
# Ideal links, no call cost, no compute slowdown by overlapping collectives.
IDEAL = Profile(gpus={"default": GpuEfficiency()},
                fabrics={"default": FabricEfficiency(bw_eff=1.0, call_latency_us=0.0, compute_slowdown=0.0)})


def _scenario(tmp_path, cluster, text):
    path = tmp_path / "sc.yaml"
    path.write_text(text)
    return load_scenario(path, cluster)


def _hand(cluster, f_layer, b_layer, grad_bytes=(), optimizer_s=0.0, params=None):
    """program_fn: a real program whose chunks take layers * f_layer / b_layer per
    microbatch, no TP time, the given gradient buckets, ``optimizer_s`` per stage."""
    def build(plan):
        prog = build_program(_MODEL, plan, cluster, IDEAL)
        for pipe in prog.pipelines:
            for key, w in pipe.chunks.items():
                pipe.chunks[key] = replace(w, fwd_s=w.layers * f_layer, bwd_s=w.layers * b_layer, fwd_tp_s=0.0,
                                           bwd_tp_s=0.0, p2p_bytes=0.0, grad_buckets=tuple(grad_bytes),
                                           params=w.params if params is None else params)
            pipe.optimizer_s = (optimizer_s,) * plan.pp
        return prog
    return build


_MODEL = ModelSpec("m", 4, 1024, 16, 512, 32000, 8)


def _run(cluster, plan_text, steps, build, scenario=None, controller=None):
    plan = resolve_plan(plan_text, _MODEL, cluster.num_devices)
    return simulate_steps(_MODEL, plan, cluster, IDEAL, steps, scenario, controller, program_fn=build)


def _times(res):
    return [s.step_time_s for s in res.steps]


# ---------------------------------------------------------------- back to back
def test_synchronous_steps_repeat_the_single_step():
    """Without a scenario and with the synchronous plan, every step of a data-parallel run
    (pp=1, all replicas finish together) takes exactly the single-step simulation's time."""
    cluster = load_topology("dgx-a100", nodes=2)
    model = load_model("gpt3-1.3b")
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan("tp=2,dp=8,mbs=4", model, 16)
    one = simulate(model, plan, cluster, profile).step_time_s
    res = simulate_steps(model, plan, cluster, profile, 3)
    assert _times(res) == pytest.approx([one] * 3, rel=1e-9)
    assert res.total_time_s == pytest.approx(3 * one, rel=1e-9)


# ---------------------------------------------------------------- cross-step overlap
@pytest.mark.parametrize("opt_s,exposed_s", [(0.02, 0.005), (0.08, 0.05)])
def test_layerwise_update_hides_what_the_first_layers_cover(opt_s, exposed_s):
    """overlap_step=layerwise, one device, L=4 layers, m=8 microbatches, forward f=0.01 s
    and backward 0.02 s per layer, optimizer O per step (u = O/L per layer). The next
    step's first forward of layer j starts at max(its previous layer's end, R + (j+1)u),
    so it ends R + max(u + L f, L u + f) after the backward: the exposed update is
    X = max(u + L f, L u + f) - L f instead of L u (hides (L-1) min(u, f)). Step 1 ends
    at its backward, steps 2..N-1 take m L (f+b) + X, the last adds its own full update.
    By hand, m L (f+b) = 8 x 4 x 0.03 = 0.96 s and
      O = 0.02: u = 0.005, X = max(0.005 + 0.04, 0.02 + 0.01) - 0.04 = 0.005 s
                (saves 0.015 s = 3 x min(0.005, 0.01) of the synchronous 0.02 s);
      O = 0.08: u = 0.02,  X = max(0.02 + 0.04, 0.08 + 0.01) - 0.04 = 0.05 s
                (saves 0.03 s = 3 x min(0.02, 0.01) of the synchronous 0.08 s)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1, nodes=1)
    f, b, N = 0.01, 0.02, 5
    build = _hand(cluster, f, b, optimizer_s=opt_s)
    base = 0.96  # 8 microbatches x 4 layers x (0.01 + 0.02) s
    res = _run(cluster, "mbs=1,overlap_step=layerwise", N, build)
    assert _times(res) == pytest.approx([base] + [base + exposed_s] * (N - 2) + [base + exposed_s + opt_s],
                                        rel=1e-9)
    sync = _run(cluster, "mbs=1", N, build)
    assert _times(sync) == pytest.approx([base + opt_s] * N, rel=1e-9)


def test_layerwise_zero1_gathers_layer_by_layer():
    """ZeRO-1, dp=2 across two nodes (each GPU on its own 10 GB/s NIC): a layer's update
    takes o = O/L, then its all-gather over 2 ranks moves half its bf16 bytes, g = P*2/2 /
    1e10 s, one after another on the stage's DP stream. With g >= o layer j's weights are
    ready at R + o + (j+1) g; the next forward's first microbatch ends at
    R + max_j(U_j + (L-j) f)."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    f, b, L, m, O = 0.01, 0.02, 4, 4, 0.004
    P = 4e8  # parameters per chunk -> 1e8 per layer, 2e8 bytes, g = 0.01 s
    g = P / L * 2 / 2 / 1e10
    o = O / L
    build = _hand(cluster, f, b, optimizer_s=O, params=P)
    res = _run(cluster, "dp=2,mbs=1,zero=1,overlap_step=layerwise", 3, build)
    ends = [o + (j + 1) * g + (L - j) * f for j in range(L)]
    X = max(ends) - L * f
    base = m * L * (f + b)
    assert _times(res)[1] == pytest.approx(base + X, rel=1e-9)
    sync = _run(cluster, "dp=2,mbs=1,zero=1", 3, build)
    # Synchronous: the whole update, then the whole stage's gather (L layers' bytes).
    assert _times(sync)[1] == pytest.approx(base + O + L * g, rel=1e-9)


def test_delayed_gradients_hide_the_reduction():
    """overlap_step=delayed, dp=2 over the NICs, one gradient bucket reduced in c = S/1e10 s
    once backward ends, optimizer O. Synchronous: every step m B + c + O. Delayed: the
    reduction of step t runs beside step t+1, whose end applies it; step 1 has nothing to
    apply; the last applies the previous update while its own reduction runs (c > O
    here), then its own: m B + c + O. N steps take N m B + (N-1) O + c, against
    N (m B + c + O) synchronously."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    f, b, L, m, O, N = 0.0, 0.01, 4, 4, 0.003, 6
    S = 2e8
    c = S / 1e10
    build = _hand(cluster, f, b, grad_bytes=[S], optimizer_s=O)
    mB = m * L * b
    sync = _run(cluster, "dp=2,mbs=1", N, build)
    assert _times(sync) == pytest.approx([mB + c + O] * N, rel=1e-9)
    res = _run(cluster, "dp=2,mbs=1,overlap_step=delayed", N, build)
    assert _times(res) == pytest.approx([mB] + [mB + O] * (N - 2) + [mB + c + O], rel=1e-9)
    assert res.total_time_s == pytest.approx(N * mB + (N - 1) * O + c, rel=1e-9)


# ---------------------------------------------------------------- scenario events
def test_slow_nic_stall_and_speed(tmp_path):
    """dp=2 across two nodes, one bucket of c = 0.02 s. Node 0's NICs at half rate from
    step 2: both ring flows cross them, so the exposed reduction doubles (2c). Device 1
    stalls 0.5 s at step 3: its replica starts late and the other waits at the reduction
    (+0.5 s). Device 0 at 50 % speed from step 4: its backward doubles."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    b, L, m, S = 0.01, 4, 4, 2e8
    c = S / 1e10
    sc = _scenario(tmp_path, cluster, """
events:
  - {kind: link_bandwidth, node: 0, factor: 0.5, step: 2, last_step: 2}
  - {kind: stall, device: 1, duration_s: 0.5, step: 3}
  - {kind: compute_speed, device: 0, factor: 0.5, step: 4}
""")
    res = _run(cluster, "dp=2,mbs=1", 4, _hand(cluster, 0.0, b, grad_bytes=[S]), sc)
    mB = m * L * b
    assert _times(res) == pytest.approx([mB + c, mB + 2 * c, mB + c + 0.5, 2 * mB + c], rel=1e-9)
    assert res.steps[1].events == ["node 0 links at 50% bandwidth from step 2 to step 2"]


def test_node_lost_stops_the_run(tmp_path):
    """A lost node ends the run before its step, with one line naming the node, its
    devices and the replica/stage it held; the steps before it are reported."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    sc = _scenario(tmp_path, cluster, "events:\n  - {kind: node_lost, node: 1, step: 3}\n")
    res = _run(cluster, "dp=2,mbs=1", 5, _hand(cluster, 0.001, 0.002), sc)
    assert len(res.steps) == 2
    assert res.stopped.startswith("stopped before step 3: lost node 1 (devices 1-1: replica 1 stage 0)")


@pytest.mark.parametrize("text,needle", [
    ("events:\n  - {kind: compute_speed, node: 0, factor: 0, step: 1}\n",
     "events.0.factor: 0: must be a finite number in [0.001, 1000]"),
    ("events:\n  - {kind: slow, node: 0, step: 1}\n", "events.0.kind: 'slow'; allowed: 'compute_speed'"),
    ("events:\n  - {kind: stall, device: 0, duration_s: 1}\n", "events.0: give exactly one of step"),
    ("events:\n  - {kind: stall, device: 9, duration_s: 1, step: 2}\n",
     "events.0.device: 9: must be a rank in [0, 1]"),
    ("events:\n  - {kind: node_lost, device: 0, step: 2}\n", "node_lost needs node"),
    ("events:\n  - {kind: compute_speed, node: 0, factor: 0.5, step: 4, last_step: 2}\n",
     "last_step=2 is before step=4"),
    ("evnts: []\n", "evnts: unknown field; allowed: name, description, events"),
])
def test_bad_scenario_files(tmp_path, capsys, text, needle):
    """A bad scenario file is one line naming the file, the field and what is allowed;
    the command line exits 2 with nothing on stdout."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    with pytest.raises(InputError, match=None) as err:
        _scenario(tmp_path, cluster, text)
    assert needle in str(err.value) and str(tmp_path / "sc.yaml") in str(err.value)
    code = main(["simulate", str(DATA / "two-nodes.yaml"), "--model", "gpt3-125m", "--plan", "tp=2,dp=2",
                 "--scenario", str(tmp_path / "sc.yaml")])
    out, errtext = capsys.readouterr()
    assert code == 2 and out == "" and errtext.count("\n") == 1


# ---------------------------------------------------------------- adaptive
def test_dp2_half_speed_hand_times():
    """Two DP ranks, rank 1 at half speed (the shipped scenario), 16 microbatches of
    f+b = 0.03 s: unslowed 8 x 0.03; fixed equal split 2x that; the adaptive controller
    settles on 11:5 (its integer min-max: max(11 x 1, 5 x 2) = 11), 11/8 of unslowed,
    the integer neighbour of the continuous ideal 4/3."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    sc = load_scenario(ROOT / "scenarios" / "dp2-half-speed.yaml", cluster)
    model = load_model("tiny")  # 4 layers, 16 sequences: 16 microbatches of 1
    plan = resolve_plan("dp=2", model, 2)
    S = 1e6  # one gradient bucket: c = S / 1e10 s exposed after the last backward
    c = S / 1e10
    build = lambda p: _hand_build(model, p, cluster, 0.0025, 0.005, S)  # noqa: E731
    unit = 4 * (0.0025 + 0.005)
    fixed = simulate_steps(model, plan, cluster, IDEAL, 6, sc, program_fn=build)
    assert _times(fixed) == pytest.approx([16 * unit + c] * 6, rel=1e-9)
    ctl = SimController(model, plan, cluster, IDEAL, ControllerSettings(noise=0.02, seed=1))
    ad = simulate_steps(model, plan, cluster, IDEAL, 10, sc, ctl, program_fn=build)
    assert ad.steps[-1].mb_shares == [11, 5]
    assert ad.steps[-1].step_time_s == pytest.approx(11 * unit + c, rel=1e-9)
    assert len(ctl.decisions) == 1


def _hand_build(model, plan, cluster, f_layer, b_layer, bucket):
    prog = build_program(model, plan, cluster, IDEAL)
    for pipe in prog.pipelines:
        for key, w in pipe.chunks.items():
            pipe.chunks[key] = replace(w, fwd_s=w.layers * f_layer, bwd_s=w.layers * b_layer, fwd_tp_s=0.0,
                                       bwd_tp_s=0.0, grad_buckets=(bucket,))
        pipe.optimizer_s = (0.0,) * plan.pp
    return prog


def test_dp2_half_speed_tiny_model_on_localhost():
    """The shipped 2-rank scenario with the tiny model's real costs on localhost-cpu (the
    simulation the real adaptive run is compared with): the fixed split takes about 2x the
    unslowed step (compute doubles, the all-reduce does not), and the adaptive run settles
    within 10 % of the ideal 4/3 with no further moves under 5 % timing noise."""
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    model = load_model("tiny")
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan("dp=2", model, 2)
    sc = load_scenario(ROOT / "scenarios" / "dp2-half-speed.yaml", cluster)
    base = simulate_steps(model, plan, cluster, profile, 2).steps[-1].step_time_s
    fixed = simulate_steps(model, plan, cluster, profile, 3, sc).steps[-1].step_time_s
    assert 1.9 <= fixed / base <= 2.0
    ctl = SimController(model, plan, cluster, profile, ControllerSettings(noise=0.05, seed=3))
    ad = simulate_steps(model, plan, cluster, profile, 30, sc, ctl)
    tail = [s.step_time_s / base for s in ad.steps[10:]]
    assert all(abs(r - 4 / 3) <= 0.1 * 4 / 3 for r in tail)
    assert len({tuple(s.mb_shares) for s in ad.steps[10:]}) == 1  # no oscillation
    assert len(ctl.decisions) <= 2


def test_pipeline_lever_moves_layers_and_pays_the_migration(tmp_path):
    """pp=2 on two nodes (one stage each, dp=1), 4 layers 2:2, stage 1 at 50 % speed:
    the controller moves one layer to stage 0 (3:1, max(3, 2) < max(2, 4) layer-times) and
    the engine moves its weights and Adam state over the 10 GB/s NIC path first:
    layer_state_bytes / 1e10 seconds, reported as the step's migration."""
    cluster = load_topology(str(DATA / "two-nodes.yaml"), gpus_per_node=1)
    sc = _scenario(tmp_path, cluster, "events:\n  - {kind: compute_speed, node: 1, factor: 0.5, step: 1}\n")
    plan = resolve_plan("pp=2,mbs=1", _MODEL, 2)
    ctl = SimController(_MODEL, plan, cluster, IDEAL, ControllerSettings(noise=0.0))
    res = simulate_steps(_MODEL, plan, cluster, IDEAL, 8, sc, ctl, program_fn=_hand(cluster, 0.01, 0.02))
    moved = [s for s in res.steps if s.decision]
    assert len(moved) == 1 and moved[0].layers == [3, 1]
    assert moved[0].migration_s == pytest.approx(layer_state_bytes(_MODEL, plan) / 1e10, rel=1e-9)
    assert res.steps[-1].step_time_s < res.steps[0].step_time_s


# ---------------------------------------------------------------- recovery, CLI, report, search
def _slow_node_runs(steps=30):
    """gpt3-1.3b on 16 DGX A100 nodes, tp=8,pp=2,dp=8 (a node is one stage of one
    replica), node 1 (replica 0, stage 1) at 60 % from step 3: adaptive, fixed, unslowed."""
    from sim.multistep import compare_runs
    from specs.scenario import ScenarioFile, resolve_scenario
    cluster = load_topology("dgx-a100", nodes=16)
    model = load_model("gpt3-1.3b")
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan("tp=8,pp=2,dp=8,mbs=2", model, cluster.num_devices)
    sc = resolve_scenario(ScenarioFile.model_validate(
        {"events": [{"kind": "compute_speed", "node": 1, "factor": 0.6, "step": 3}]}), cluster, "test")
    ad = simulate_steps(model, plan, cluster, profile, steps, sc, SimController(model, plan, cluster, profile))
    fixed = simulate_steps(model, plan, cluster, profile, steps, sc)
    unslowed = simulate_steps(model, plan, cluster, profile, 2)
    return ad, fixed, unslowed, compare_runs(ad, fixed, unslowed, sc)


def test_adaptive_recovers_a_slow_node():
    """The issue's 175B case in small (run in full by benchmarks/adaptive_175b.py): one
    node of eight replicas' pipelines at 60 % from step 3. The fixed plan loses throughput
    from step 3 on; the adaptive run, paying its transition steps, recovers at least 70 %
    of it. The throughputs compared are re-derived here from the runs' step times and the
    batch's tokens (gpt3-1.3b: 512 sequences x 2048 tokens = 1,048,576 per step), not
    taken from compare_runs; the formula itself is pinned by hand below."""
    ad, fixed, unslowed, cmp = _slow_node_runs()
    assert cmp.from_step == 3
    tokens = 512 * 2048
    assert load_model("gpt3-1.3b").global_batch_size * load_model("gpt3-1.3b").seq_length == tokens
    window = lambda run: tokens * (len(run.steps) - 2) / sum(s.step_time_s for s in run.steps[2:])  # noqa: E731
    ref = tokens / unslowed.steps[-1].step_time_s
    assert cmp.unslowed_tokens_per_s == pytest.approx(ref, rel=1e-9)
    assert cmp.fixed_tokens_per_s == pytest.approx(window(fixed), rel=1e-9)
    assert cmp.adaptive_tokens_per_s == pytest.approx(window(ad), rel=1e-9)
    assert window(fixed) < 0.8 * ref
    assert cmp.recovered_frac >= 0.7
    assert ad.steps[-1].mb_shares[0] < ad.steps[-1].mb_shares[1]  # the slowed replica got fewer microbatches


def test_compare_runs_hand_worked():
    """compare_runs on runs written by hand, 1000 tokens a step, the event at step 3 of 6:
    unslowed 1 s/step -> 1000 tok/s; fixed 2 s/step from step 3 -> 4000/8 s = 500 tok/s;
    adaptive 2, 1.5, 1.25, 1.25 s in steps 3-6 -> 4000/6 s = 666.67 tok/s; recovered
    (666.67 - 500) / (1000 - 500) = 1/3. With nothing lost (fixed = unslowed) it is None."""
    from sim.multistep import RunResult, StepRecord, compare_runs

    def run(times, event_at=3):
        steps = [StepRecord(i + 1, 0.0, t, t, 1000 / t, [1], [1], ["slow"] if i + 1 == event_at else [], "", 0.0, [])
                 for i, t in enumerate(times)]
        return RunResult("t", "m", "p", "s", False, len(times), steps, None, sum(times), 0.0)
    unslowed = run([1.0, 1.0], event_at=0)
    cmp = compare_runs(run([1.0, 1.0, 2.0, 1.5, 1.25, 1.25]), run([1.0, 1.0, 2.0, 2.0, 2.0, 2.0]), unslowed, None)
    assert cmp.from_step == 3
    assert cmp.unslowed_tokens_per_s == pytest.approx(1000.0)
    assert cmp.fixed_tokens_per_s == pytest.approx(500.0)
    assert cmp.adaptive_tokens_per_s == pytest.approx(4000 / 6)
    assert cmp.recovered_frac == pytest.approx(1 / 3)
    assert compare_runs(unslowed, unslowed, unslowed, None).recovered_frac is None


def test_report_is_deterministic_and_shows_the_recovery(tmp_path):
    """The multi-step report renders the same bytes twice, states the recovered share and
    lists every step (with the fixed plan's throughput beside it)."""
    from reports.multistep import render, write_multistep_report
    ad, fixed, unslowed, cmp = _slow_node_runs(8)
    a, b = render(ad, cmp), render(ad, cmp)
    assert a == b
    md = a["report.md"].decode()
    assert f"recovers {cmp.recovered_frac:.1%}" in md
    import csv
    import io
    rows = list(csv.reader(io.StringIO(a["steps.csv"].decode())))
    assert len(rows) == 1 + len(ad.steps)
    col = rows[0].index("fixed tokens/s")
    assert [r[col] for r in rows[1:]] == [f"{s.tokens_per_s:.0f}" for s in fixed.steps]
    paths = write_multistep_report(tmp_path / "r", ad, cmp)
    assert sorted(p.name for p in paths) == ["index.html", "report.md", "steps.csv"]


def test_cli_steps_json(capsys):
    """`simulate --steps 3 --scenario FILE --json`: one JSON object with per-step step
    times, per-device busy time and the allocation used each step."""
    import json
    path = ROOT / "scenarios" / "dp2-half-speed.yaml"
    code = main(["simulate", str(DATA / "two-nodes.yaml"), "--model", "gpt3-125m", "--plan", "tp=2,dp=2",
                 "--steps", "3", "--scenario", str(path), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    d = json.loads(out)
    assert [s["step"] for s in d["steps"]] == [1, 2, 3]
    s = d["steps"][0]
    assert s["mb_shares"] == [128, 128] and s["layers"] == [12]  # 256 sequences, mbs=1
    assert {dev["rank"] for dev in s["devices"]} == {0, 2}
    slow = [dev for dev in s["devices"] if dev["rank"] == 0][0]  # device 1 is TP peer of rank 0
    fast = [dev for dev in s["devices"] if dev["rank"] == 2][0]
    assert slow["busy_s"] > 1.5 * fast["busy_s"]
    assert d["total_time_s"] == pytest.approx(sum(x["step_time_s"] for x in d["steps"]))


def test_search_margin_for_stale_gradients():
    """A delayed-gradient plan ranks above its synchronous twin only when its step is more
    than the lossy margin shorter (like top-k); layerwise overlap needs no margin."""
    from search.search import _rank_key
    from sim.result import StepResult

    def res(plan, step):
        return StepResult("t", "m", plan, 1, step, 1 / step, 0, 0, 0, 0, 1, True, 0, 0, {}, {}, [])
    sync = res("tp=1,pp=1,dp=2,mbs=1,schedule=1f1b", 1.0)
    for step, above in ((0.97, False), (0.94, True)):
        stale = res("tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,overlap_step=delayed", step)
        ranked = sorted([sync, stale], key=lambda r: _rank_key(r, 0.05))
        assert (ranked[0] is stale) == above
    lw = res("tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,overlap_step=layerwise", 0.99)
    assert sorted([sync, lw], key=lambda r: _rank_key(r, 0.05))[0] is lw


def test_adaptive_text_summary_without_a_scenario(capsys):
    """`simulate --adaptive` without a scenario (nothing slows the run, so there is no lost
    throughput to recover: recovered_frac is None) prints its text summary, saying so,
    exit 0. Before: the summary formatted None with '.1%' and the command died with a
    TypeError traceback (exit 1); --json and --report already coped."""
    code = main(["simulate", str(DATA / "two-nodes.yaml"), "--model", "gpt3-125m", "--plan", "tp=2,dp=2",
                 "--steps", "3", "--adaptive"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "the fixed plan lost no throughput" in out and err == ""


def test_scenario_event_after_the_last_step_is_refused(capsys):
    """An event at step 3 of a 2-step run would never happen, and the run would pass for the
    scenario's outcome: refused naming the event's step and --steps (it was ignored)."""
    from plansim.cli import main
    assert main(["simulate", "dgx-a100", "--nodes", "16", "--model", "gpt3-125m", "--scenario", "slow-node-175b",
                 "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "events.0.step: 3 is after the run's last step (2, --steps)" in err
