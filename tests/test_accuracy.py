"""Accuracy against published training runs (validate/accuracy.py, `plansim accuracy`, the
accuracy report) and the framework behaviours those runs rely on (blocking pipeline sends,
all-reduced ZeRO-1 gradients, NIC-spreading reduce-scatter).

The guard: over validate/data/published_runs.csv (Korthikanti et al. 2022 and BigScience
BLOOM rows, cited in the file) the mean absolute percentage error stays <= 2.8 % and the
Spearman rank correlation of the BLOOM sweep stays >= 0.82, a small margin over today's
2.47 % and 0.841 (issue 8: a guard at 4x slack let wrong wiring through).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from costmodel.errors import InputError
from costmodel.shapes import ModelSpec
from engine_fixtures import fixed_program, run_engine
from plansim.cli import main
from reports.accuracy import FILES, render, write_accuracy_report
from costmodel.profile import RUNTIMES
from validate.accuracy import (DEFAULT_ROWS, NETWORKS, load_rows, mape, row_plan_text, row_profile_names,
                          run_accuracy, spearman)
from specs.plan import resolve_plan
from sim.schedules import list_schedule_makespan, make_schedule
from specs.topology import load_topology

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------ the rows
def test_rows_load_with_their_configuration():
    """The project's copy holds the 32 published rows: 9 K22 (Megatron-LM 2022, fp16, HDR), 14
    BLOOM (DeepSpeed, bf16, ZeRO-1, Omni-Path), 13 of them the 2022-02-25 sweep with 64 heads
    (chronicles-prequel.md), the main run split 5:6x10:5 (type:transformer|embedding), and the
    9 rows of Megatron-LM's H100 table (Megatron-Core, bf16, distributed optimizer, NDR)."""
    rows = load_rows()
    assert DEFAULT_ROWS.is_file() and len(rows) == 32
    assert len({r.run_id for r in rows}) == 32
    mc = [r for r in rows if r.run_id.startswith("mc24-")]
    assert len(mc) == 9 and all(r.runtime == "megatron-core" and r.network == "NDR400x8" and r.zero == 1
                                and r.seq_length == 4096 and r.vocab_size == 131072 for r in mc)
    assert [r.figure for r in mc] == [408.8, 465.9, 489.1, 459.6, 419.7, 420.5, 432.8, 474.4, 459.9]
    k22 = [r for r in rows if r.run_id.startswith("k22-")]
    sweep = [r for r in rows if r.run_id.startswith("bloom-sweep-")]
    assert len(k22) == 9 and len(sweep) == 13
    assert all(r.precision == "fp16" and r.runtime == "megatron-lm-2022" and r.network == "HDR200x8" for r in k22)
    assert all(r.num_attention_heads == 64 and r.zero == 1 and r.precision == "bf16" for r in sweep)
    final = next(r for r in rows if r.run_id == "bloom-176b-final")
    assert sum(int(x) for x in final.layers_per_stage.split(":")) == final.num_layers == 70
    for r in rows:
        assert r.tp * r.pp * r.dp == r.nodes * r.gpus_per_node
        assert r.network in NETWORKS and r.runtime in RUNTIMES


def test_row_inputs_follow_the_row():
    """A row becomes a plan string with its layout and the framework defaults (rank order
    tp-dp-pp, NIC-spreading collectives), and the bundled profiles of its fabric/framework."""
    rows = {r.run_id: r for r in load_rows()}
    r = rows["k22-175b-present"]
    text = row_plan_text(r)
    assert text.split(",")[:6] == ["tp=8", "pp=8", "dp=1", "mbs=1", "recompute=selective", "precision=fp16"]
    assert "vpp=3" in text and "sp=true" in text and "placement=tp-dp-pp" in text
    plan = resolve_plan(text, ModelSpec("m", 96, 12288, 96, 2048, 51200, 64), 64)
    assert plan.schedule == "interleaved" and plan.vpp == 3 and plan.placement == "tp-dp-pp"
    assert row_profile_names(r) == ("a100-ib-hdr", "runtime-megatron-lm-2022")
    f = rows["bloom-176b-final"]
    assert "layers=5:6:6:6:6:6:6:6:6:6:6:5" in row_plan_text(f) and "overlap_grad_reduce=false" in row_plan_text(f)
    assert row_profile_names(f) == ("a100-opa", "runtime-megatron-deepspeed", "runtime-deepspeed-bf16-optimizer")
    assert row_profile_names(rows["bloom-sweep-a"]) == ("a100-opa", "runtime-megatron-deepspeed")


HEADER = ("run_id,source,gpu,nodes,gpus_per_node,network,num_layers,hidden_size,num_attention_heads,"
          "seq_length,vocab_size,global_batch_size,tp,pp,dp,mbs,vpp,sp,recompute,zero,precision,"
          "figure_kind,figure,runtime,overlap_grad_reduce,layers_per_stage")
GOOD = "x1,test,A100-SXM4-80GB,1,8,HDR200x8,4,1024,16,512,32000,16,8,1,1,2,1,false,full,0,fp16,iter_time_s,0.5,megatron-lm-2022,true,"


@pytest.mark.parametrize("row,field", [
    (GOOD.replace(",0.5,", ",-1,"), "x1.figure"),
    (GOOD.replace("HDR200x8", "Ethernet"), "x1.network"),
    (GOOD.replace("megatron-lm-2022", "jax"), "x1.runtime"),
    (GOOD.replace(",false,full", ",maybe,full"), "x1.sp"),
    (GOOD.replace(",4,1024,", ",four,1024,"), "x1.num_layers"),
    (GOOD.replace("iter_time_s", "tokens"), "x1.figure_kind"),
])
def test_bad_rows_name_the_row_and_column(tmp_path, row, field):
    """A bad value raises one InputError naming the run and the column."""
    f = tmp_path / "rows.csv"
    f.write_text("# comment\n" + HEADER + "\n" + row + "\n")
    with pytest.raises(InputError) as err:
        load_rows(f)
    assert err.value.field == field
    f.write_text(HEADER + "\n" + GOOD + "\n" + GOOD + "\n")
    with pytest.raises(InputError, match="given twice"):
        load_rows(f)


# ------------------------------------------------------------------ statistics
def test_spearman_hand_worked_with_ties():
    """x = 1..5, y = (5, 6, 7, 8, 7): ranks of y (1, 2, 3.5, 5, 3.5); Pearson of the ranks
    = 8 / sqrt(10 * 9.5) = 0.8208; identical orders give 1, reversed -1."""
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / (10 * 9.5) ** 0.5)
    assert spearman([3, 1, 2], [30, 10, 20]) == pytest.approx(1.0)
    assert spearman([3, 1, 2], [10, 30, 20]) == pytest.approx(-1.0)
    assert mape([0.1, -0.2, 0.0, 0.3]) == pytest.approx(0.15)


def test_spearman_matches_scipy():
    """Our rank correlation equals scipy.stats.spearmanr on seeded random data with ties."""
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for _ in range(20):
        x = [rng.randint(0, 9) for _ in range(13)]
        y = [rng.randint(0, 9) for _ in range(13)]
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


# ------------------------------------------------------------------ the guard
@pytest.fixture(scope="module")
def accuracy():
    import os
    return run_accuracy(jobs=max(2, min(os.cpu_count() or 1, 8)))


def test_accuracy_guard(accuracy):
    """Over the 23 A100 rows (K22 and BLOOM) MAPE <= 2.8 % (2.47 % now) and over the BLOOM
    sweep Spearman >= 0.82 (0.841 now), with one profile per GPU type and fabric and no
    per-row tuning; no single one of them more than 8 % off (7.3 % now). Issue #3 asked for
    10 % / 0.8; issue 8 keeps the guard near the current figures so that a wiring change
    that moves the predictions fails here. Issue 9: the 9 rows of Megatron-LM's H100 table
    (megatron-core runtime) within MAPE 10 %. A change that legitimately moves these figures
    updates them in the same commit, with the reason."""
    assert len(accuracy.rows) == 32 and len(accuracy.sweep_ids) == 13
    old = [r for r in accuracy.rows if not r.row.run_id.startswith("mc24-")]
    h100 = [r for r in accuracy.rows if r.row.run_id.startswith("mc24-")]
    assert len(old) == 23 and len(h100) == 9
    old_mape = mape([r.error for r in old])
    assert old_mape <= 0.028, f"MAPE {100 * old_mape:.2f} %"
    assert accuracy.spearman >= 0.82, f"Spearman {accuracy.spearman:.3f}"
    worst = max(old, key=lambda r: abs(r.error))
    assert abs(worst.error) <= 0.08, f"{worst.row.run_id} {100 * worst.error:+.1f} %"
    h100_mape = mape([r.error for r in h100])
    assert h100_mape <= 0.10, f"H100 MAPE {100 * h100_mape:.2f} %"
    assert accuracy.mape == pytest.approx(mape([r.error for r in accuracy.rows]))
    # The errors are what the table says: (predicted - published) / published.
    r = accuracy.rows[0]
    assert r.error == pytest.approx((r.predicted - r.row.figure) / r.row.figure)


def test_old_rows_unchanged_by_runtime_names(accuracy):
    """The K22 and BLOOM rows predict exactly what they did before runtimes had names: the
    megatron-lm-2022 runtime is the old default runtime, the BLOOM runtimes the old overlays.
    Figures printed by `plansim accuracy` at commit 594482b, then moved only by the
    tied-embedding gradient all-reduce between first and last pipeline stage added in the
    same round (sim/program.embedding_grad_sync_s; pp=1 rows such as k22-22b are untouched):
    k22-530b-dp8 36.28592 -> 36.29646 s, bloom-176b-final 111.35383 -> 113.04507 s (BLOOM's
    250,880 x 14,336 embedding, a quarter per TP rank, in fp32 over Omni-Path), bloom-sweep-m
    134.82333 -> 135.24618 s; then (2026-12-03, session 8) by the TP collectives at the ends
    of the stack (sim/tp_comm.tp_ends_comm_s: the vocabulary-parallel embedding's all-reduce
    and the logits input's, which the simulator had left out, beside the loss's two):
    k22-22b 1.07022 -> 1.07220 s, k22-530b-dp8 36.29646 -> 36.49507 s, bloom-176b-final
    113.04507 -> 113.04740 s, bloom-sweep-m 135.24618 -> 135.28547 s."""
    before = {"k22-22b-present": 1.0722025052270063, "k22-530b-dp8-present": 36.495070753604644,
              "bloom-176b-final": 113.04740245112426, "bloom-sweep-m": 135.28547081706768}
    got = {r.row.run_id: r.predicted for r in accuracy.rows}
    for rid, value in before.items():
        assert got[rid] == pytest.approx(value, rel=1e-9), rid


def test_legacy_framework_column(tmp_path):
    """A CSV written before runtimes had names (a `framework` column, value megatron-lm)
    loads with runtime megatron-lm-2022; an unknown framework names the column."""
    f = tmp_path / "old.csv"
    f.write_text(HEADER.replace(",runtime,", ",framework,") + "\n" + GOOD.replace("megatron-lm-2022", "megatron-lm") + "\n")
    assert load_rows(f)[0].runtime == "megatron-lm-2022"
    f.write_text(HEADER.replace(",runtime,", ",framework,") + "\n" + GOOD.replace("megatron-lm-2022", "jax") + "\n")
    with pytest.raises(InputError) as err:
        load_rows(f)
    assert err.value.field == "x1.framework"


def test_megatron_flops_formula_matches_op_count():
    """Megatron's num_floating_point_operations (costmodel/flops.megatron_flops_per_iteration)
    equals the op-by-op model FLOPs for a GPT (MHA, ffn = 4h) of the H100 table, 70B row:
    72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) computed by hand."""
    from costmodel.flops import megatron_flops_per_iteration, model_flops_per_iteration
    m = ModelSpec("70b", 84, 8192, 64, 4096, 131072, 384)
    hand = 72 * 384 * 4096 * 84 * 8192 ** 2 * (1 + 4096 / (6 * 8192) + 131072 / (12 * 84 * 8192))
    assert megatron_flops_per_iteration(m) == pytest.approx(hand, rel=1e-12)
    assert model_flops_per_iteration(m) == pytest.approx(hand, rel=1e-12)


def test_accuracy_report_is_deterministic_and_complete(accuracy, tmp_path):
    """The report renders to the same bytes twice, embeds the scatter plot as a PNG data URI,
    lists every row in HTML and Markdown, and is written whole (no temporary files left)."""
    a, b = render(accuracy), render(accuracy)
    assert a == b
    assert a["accuracy.png"][:8] == b"\x89PNG\r\n\x1a\n"
    html_text = a["index.html"].decode()
    md = a["report.md"].decode()
    assert "data:image/png;base64," in html_text and "![predicted vs published](accuracy.png)" in md
    for r in accuracy.rows:
        assert r.row.run_id in html_text and f"| {r.row.run_id} |" in md
    assert f"MAPE: {100 * accuracy.mape:.2f} %" in md
    written = write_accuracy_report(tmp_path / "rep", accuracy)
    assert sorted(p.name for p in written) == sorted(FILES)
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == sorted(FILES)
    assert (tmp_path / "rep" / "accuracy.png").read_bytes() == a["accuracy.png"]


def test_cli_accuracy_json_and_text(tmp_path, capsys):
    """`plansim accuracy --rows F --json` prints the per-row table and the MAPE as JSON; the
    text form prints the table and the summary; a missing rows file exits 2 in one line."""
    lines = [ln for ln in DEFAULT_ROWS.read_text().splitlines() if not ln.startswith("#")]
    small = tmp_path / "two.csv"
    small.write_text("\n".join([lines[0]] + [ln for ln in lines if ln.startswith("k22-22b-")]) + "\n")
    assert main(["accuracy", "--rows", str(small), "--json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in out["rows"]] == ["k22-22b-present", "k22-22b-full"]
    errs = [r["error"] for r in out["rows"]]
    assert out["mape"] == pytest.approx(sum(abs(e) for e in errs) / 2)
    assert out["spearman_sweep"] is None
    assert main(["accuracy", "--rows", str(small), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "k22-22b-full" in text and "MAPE:" in text
    assert main(["accuracy", "--rows", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ------------------------------------------------------------------ framework behaviours in the engine
def _model(layers=4, batch=8):
    return ModelSpec("tiny", layers, 1024, 16, 512, 32000, batch)


def _program(plan_text, f, b, grad=(), p2p=0.0, params=None, batch=8):
    cluster = load_topology(str(DATA / "two-nodes.yaml"))
    return fixed_program(cluster, _model(batch=batch), plan_text, f, b, grad, p2p, params)


@pytest.mark.parametrize("schedule,m", [("1f1b", 4), ("gpipe", 4), ("1f1b", 1)])
def test_blocking_pipeline_sends_match_list_scheduler(schedule, m):
    """DeepSpeed-style blocking sends: a stage computes on only after its send is done, so
    the engine equals a list schedule where the sending stage's action lasts f + c (stage 0
    forwards, stage 1 backwards) and transfers add nothing; c = 1e8 B / 10 GB/s."""
    f, b, c = 0.02, 0.04, 0.01
    prog = _program(f"tp=2,pp=2,mbs=2,schedule={schedule}", f, b, p2p=1e8, batch=2 * m)
    prog.p2p_blocking = True
    step, res = run_engine(prog)
    ref, _ = list_schedule_makespan(make_schedule(schedule, 2, m), 2, 1,
                                    lambda r, a: f + c if r == 0 else f, lambda r, a: b + c if r == 1 else b)
    assert step == pytest.approx(ref, rel=1e-9)
    prog.p2p_blocking = False
    assert run_engine(prog)[0] <= step + 1e-12


def test_zero1_gradients_all_reduced_cost_twice_a_reduce_scatter():
    """ZeRO-1 on 2 replicas (one per node, own 10 GB/s NIC): a reduce-scatter of S sends S/2
    per rank (S/2 / 1e10 s); DeepSpeed's bf16 optimizer all-reduces instead: S / 1e10 s."""
    S = 1e9
    prog = _program("tp=2,dp=2,mbs=2,zero=1,overlap_grad_reduce=false", 0.0, 0.01, grad=[S], params=0.0)
    _, res = run_engine(prog)
    assert res.exposed_comm_s["dp"] == pytest.approx(S / 2 / 1e10, rel=1e-9)
    prog.zero_grad_all_reduce = True
    _, res2 = run_engine(prog)
    assert res2.exposed_comm_s["dp"] == pytest.approx(S / 1e10, rel=1e-9)


def test_hierarchical_reduce_scatter_spreads_over_nics():
    """dp=4 on 2 nodes x 2 GPUs, ZeRO-1 reduce-scatter of S. Hierarchical: S/2 inside the
    node at 100 GB/s (0.05 S / 1e10), then S/4 per rail on each GPU's own NIC (0.25 S /
    1e10): 0.3 S / 1e10. A ring over this group (two members on each node) is priced the
    same way (sim/collective_flows.several_per_node); one ring in rank order sent 3S/4
    through one NIC per node: 0.75 S / 1e10."""
    S = 1e9
    ring = _program("dp=4,mbs=2,zero=1,overlap_grad_reduce=false", 0.0, 0.01, grad=[S], params=0.0)
    hier = _program("dp=4,mbs=2,zero=1,overlap_grad_reduce=false,allreduce=hierarchical", 0.0, 0.01,
                    grad=[S], params=0.0)
    assert run_engine(ring)[1].exposed_comm_s["dp"] == pytest.approx(0.3 * S / 1e10, rel=1e-9)
    assert run_engine(hier)[1].exposed_comm_s["dp"] == pytest.approx(0.3 * S / 1e10, rel=1e-9)


def test_tree_all_reduce_spreads_over_nics():
    """dp=4 on 2 nodes x 2 GPUs (100 GB/s inside a node, a 10 GB/s NIC per GPU), all-reduce
    of S after backward with allreduce=tree: the node's reduce-scatter sends S/2 per GPU
    (0.05 S / 1e10), the two-member tree per local index moves its S/2 as two halves, up
    and then down, each half one way over each NIC (S/4 up, S/4 down: 0.5 S / 1e10), the
    all-gather 0.05: 0.6 S / 1e10, as the ring's hierarchical phases. One pair of trees in
    rank order took 2.0 S / 1e10."""
    S = 1e9
    for alg in ("tree", "ring"):
        prog = _program(f"dp=4,mbs=2,overlap_grad_reduce=false,allreduce={alg}", 0.0, 0.01, grad=[S], params=0.0)
        assert run_engine(prog)[1].exposed_comm_s["dp"] == pytest.approx(0.6 * S / 1e10, rel=1e-9), alg


def test_h100_rows_fit_in_memory():
    """Every row of Megatron-LM's H100 table, as the accuracy harness simulates it (its
    plan, the megatron-core runtime: fused attention, distributed optimizer), fits in the
    H100's 80 GiB on every pipeline stage: the runs happened."""
    from sim.program import stage_memory
    from validate.accuracy import row_cluster, row_model, row_profile
    for r in (r for r in load_rows() if r.run_id.startswith("mc24-")):
        cluster, model, prof = row_cluster(r), row_model(r), row_profile(r)
        plan = resolve_plan(row_plan_text(r), model, cluster.num_devices)
        cap = cluster.devices[0].gpu.mem_bytes
        peak = max(sum(stage_memory(model, plan, prof.runtime, s, plan.mb_shares[0]).values()) for s in range(plan.pp))
        assert peak < cap, f"{r.run_id}: {peak / 2**30:.1f} GiB"


def test_runtime_override(tmp_path):
    """`--runtime` replaces every row's runtime: k22-22b-present under megatron-core
    (fused attention) predicts a shorter step than under its own megatron-lm-2022; an
    unknown name is an InputError naming --runtime."""
    lines = [ln for ln in DEFAULT_ROWS.read_text().splitlines() if not ln.startswith("#")]
    one = tmp_path / "one.csv"
    one.write_text("\n".join([lines[0]] + [ln for ln in lines if ln.startswith("k22-22b-present")]) + "\n")
    own = run_accuracy(one).rows[0]
    core = run_accuracy(one, runtime="megatron-core").rows[0]
    assert own.row.runtime == "megatron-lm-2022" and core.row.runtime == "megatron-core"
    assert core.predicted < own.predicted
    assert core.profiles == ("a100-ib-hdr", "runtime-megatron-core")
    with pytest.raises(InputError) as err:
        run_accuracy(one, runtime="nope")
    assert err.value.field == "--runtime"
