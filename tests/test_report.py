"""The report folder: index.html (self-contained, plots embedded), report.md, plans.csv and
trace.json; byte-identical output for the same inputs; atomic writes; the numbers in the
tables against the simulated results; and the `report` / `simulate --report` commands."""
from __future__ import annotations

import base64
import json
from pathlib import Path
import re
import shutil
import struct
import sys
import types

import pandas as pd
import pytest

import reports.report as report_mod
from costmodel.profile import load_profile
from plansim.cli import main
from reports import plots
from reports.report import write_report
from reports.tables import group_utilisation, plan_fields, tp_pp_grid
from sim.metrics import simulate
from specs.model import load_model
from specs.plan import resolve_plan
from sim.result import CATEGORIES, DeviceResult, SearchResult, StepResult
from specs.topology import load_topology

PLANS = ["tp=2,pp=2", "tp=1", "tp=8", "tp=4,pp=2", "tp=1,pp=4"]
FILES = {"index.html", "report.md", "plans.csv", "trace.json"}


def _simulate_all(topology, nodes, plans, record=True):
    model, profile = load_model("gpt3-1.3b"), load_profile(None)
    cluster = load_topology(topology, nodes=nodes)
    res = [simulate(model, resolve_plan(p, model, cluster.num_devices), cluster, profile, record=record)
           for p in plans]
    res.sort(key=lambda r: (not r.fits_memory, -r.tokens_per_s))
    return SearchResult(topology=cluster.name, model=model.name, num_devices=cluster.num_devices,
                        ranked=res, pruned={"memory": 4, "divisibility": 7},
                        pruned_examples={"memory": "tp=1,pp=1,mbs=8"}, candidates=30, estimated=19,
                        notes=["Splitting the batch unevenly over the two GPU types wins 4 %."])


@pytest.fixture(scope="module")
def homo():
    return _simulate_all("dgx-a100", 2, PLANS)


@pytest.fixture(scope="module")
def homo_dir(homo, tmp_path_factory):
    """The report of `homo`, written once for the tests that only read it."""
    out = tmp_path_factory.mktemp("homo")
    write_report(out, homo)
    return out


@pytest.fixture(scope="module")
def hetero():
    return _simulate_all("hetero-a100-v100", None, ["tp=2,pp=2", "tp=8", "tp=4,pp=4,placement=tp-dp-pp"])


def _images(html: str) -> list[bytes]:
    srcs = re.findall(r'<img src="([^"]*)"', html)
    assert all(s.startswith("data:image/png;base64,") for s in srcs), "every image must be embedded"
    return [base64.b64decode(s.split(",", 1)[1]) for s in srcs]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_same_inputs_give_identical_bytes(homo, homo_dir, tmp_path):
    """Writing the same results twice (into two folders) gives byte-identical files."""
    paths = write_report(tmp_path, homo)
    assert {p.name for p in paths} == FILES == {p.name for p in homo_dir.iterdir()}
    for p in paths:
        assert p.read_bytes() == (homo_dir / p.name).read_bytes(), p.name


def test_html_is_self_contained(homo_dir):
    """No scripts, stylesheets or images fetched from elsewhere; every <img> is a decodable
    PNG: breakdown, best + runner-up Gantt, best + runner-up memory, TP x PP heatmap."""
    html = (homo_dir / "index.html").read_text()
    assert "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r'src="(?!data:)', html)
    imgs = _images(html)
    assert len(imgs) == 6
    for data in imgs:
        w, h = _png_size(data)
        assert w == plots.WIDTH_IN * plots.DPI and h > 100
        # No 'Software' text chunk: it names the matplotlib version and is not needed.
        assert b"Software" not in data and b"tEXt" not in data
    assert "Utilisation per device group" not in html  # one GPU type: no such section


def test_csv_matches_the_results(homo, homo_dir):
    """plans.csv has one row per plan in ranked order, the exact numbers of each result,
    and a breakdown that adds up to the step time (each device's parts sum to the step)."""
    df = pd.read_csv(homo_dir / "plans.csv")
    assert list(df["plan"]) == [r.plan for r in homo.ranked]
    assert list(df["rank"]) == list(range(1, len(PLANS) + 1))
    for row, r in zip(df.itertuples(), homo.ranked):
        assert row.tokens_per_s == r.tokens_per_s and row.step_time_s == r.step_time_s
        assert sum(getattr(row, f"{c}_s") for c in CATEGORIES) == pytest.approx(r.step_time_s, rel=1e-9)
        assert (row.tp, row.pp) == (int(plan_fields(r.plan)["tp"]), int(plan_fields(r.plan)["pp"]))
        assert row.tp * row.pp * row.dp == 16
    assert list(df["tokens_per_s"]) == sorted(df["tokens_per_s"], reverse=True)


def test_markdown_and_findings(homo, homo_dir):
    """report.md and index.html show the search's notes under Findings, the best plan and the
    runner-up's gap worked out from their tokens/s, and the pruning counts."""
    md = (homo_dir / "report.md").read_text()
    html = (homo_dir / "index.html").read_text()
    best, second = homo.ranked[:2]
    gap = 100 * (1 - second.tokens_per_s / best.tokens_per_s)
    for text in (md, html):
        assert homo.notes[0] in text
        assert f"Best plan {best.plan}: {best.tokens_per_s:,.0f} tokens/s" in text
        assert f"{gap:.1f} % below the best" in text
        assert "30 candidate plans enumerated, 19 ranked by the analytic estimate, 5 simulated" in text
    assert md.index("## Findings") < md.index(homo.notes[0]) < md.index("## Ranked plans")
    assert "| memory           | 4       | tp=1,pp=1,mbs=8" in md


def _fake(plan: str, tokens: float, fits: bool = True) -> StepResult:
    bd = {c: 0.0 for c in CATEGORIES} | {"compute": 1.0}
    return StepResult(topology="t", model="m", plan=plan, num_devices=8, step_time_s=1.0,
                      tokens_per_s=tokens, model_tflops_per_gpu=1.0, hardware_tflops_per_gpu=1.0,
                      mfu=0.5, hfu=0.5, peak_memory_gib=1.0, fits_memory=fits, memory_shortfall_gib=0.0,
                      bubble_fraction=0.0, exposed_comm_s={}, breakdown=bd, devices=[])


def test_tp_pp_grid_takes_the_best_fitting_plan_per_cell():
    """Each (tp, pp) cell holds the highest tokens/s among plans that fit; a cell with only
    non-fitting plans is NaN and says 'no fit'; untried cells are NaN with no note."""
    res = [_fake("tp=2,pp=1,dp=4,mbs=1", 100.0), _fake("tp=2,pp=1,dp=4,mbs=2", 150.0),
           _fake("tp=2,pp=1,dp=4,mbs=4", 900.0, fits=False), _fake("tp=4,pp=2,dp=1,mbs=1", 80.0),
           _fake("tp=1,pp=2,dp=4,mbs=1", 500.0, fits=False)]
    tps, pps, vals, notes = tp_pp_grid(res)
    assert (tps, pps) == ([1, 2, 4], [1, 2])
    assert vals[0][1] == 150.0 and vals[1][2] == 80.0
    assert vals[1][0] != vals[1][0] and notes[1][0] == "no fit"
    assert vals[0][0] != vals[0][0] and notes[0][0] == ""


def _dev(gpu, busy, represents):
    return DeviceResult(rank=0, stage=0, pipeline="p", gpu=gpu, represents=represents, breakdown_s={},
                        busy_s=busy, memory_gib={}, peak_memory_gib=0.0, capacity_gib=1.0, fits_memory=True)


def test_group_utilisation_by_hand_and_on_a_heterogeneous_run(hetero):
    """By hand: A100 busy 3 of 4 s -> 75 %; V100s busy 1 s (x8) and 3 s (x24) of 4 s ->
    (8 + 72) / (32 * 4) = 62.5 %. On a simulated hetero run it equals the represents-weighted
    mean of (compute + tp) / step over that GPU type's devices."""
    r = _fake("tp=1,pp=1,dp=8,mbs=1", 1.0)
    r.step_time_s = 4.0
    r.devices = [_dev("A100", 3.0, 16), _dev("V100", 1.0, 8), _dev("V100", 3.0, 24)]
    assert group_utilisation(r) == {"A100": pytest.approx(0.75), "V100": pytest.approx(0.625)}
    for res in hetero.ranked:
        util = group_utilisation(res)
        assert set(util) == {"A100-SXM4-80GB", "V100-SXM2-32GB"}
        for gpu, u in util.items():
            devs = [d for d in res.devices if d.gpu == gpu]
            busy = sum((d.breakdown_s["compute"] + d.breakdown_s["tp"]) * d.represents for d in devs)
            assert u == pytest.approx(busy / (sum(d.represents for d in devs) * res.step_time_s))
            assert 0.0 < u <= 1.0


def test_heterogeneous_report_has_the_group_section(hetero, tmp_path):
    """On two GPU types the report adds the utilisation chart and table (7 images)."""
    write_report(tmp_path, hetero)
    html = (tmp_path / "index.html").read_text()
    assert "Utilisation per device group" in html and len(_images(html)) == 7
    best = group_utilisation(hetero.ranked[0])
    assert f"{100 * best['V100-SXM2-32GB']:.1f} %" in html


def test_results_without_timelines(homo, tmp_path):
    """Results simulated without record=True: the report says so instead of a Gantt chart
    and writes no trace; with trace_result given, the best plan's timeline comes from it."""
    bare = _simulate_all("dgx-a100", 2, PLANS[:1], record=False)
    paths = write_report(tmp_path / "a", bare)
    assert {p.name for p in paths} == FILES - {"trace.json"}
    html = (tmp_path / "a" / "index.html").read_text()
    assert html.count("simulated without recording its timeline") == 1 and len(_images(html)) == 2
    model, cluster = load_model("gpt3-1.3b"), load_topology("dgx-a100", nodes=2)
    plan = resolve_plan(bare.ranked[0].plan, model, 16)
    rec = simulate(model, plan, cluster, load_profile(None), record=True)
    write_report(tmp_path / "b", bare, trace_result=rec)
    html = (tmp_path / "b" / "index.html").read_text()
    assert "simulated without recording" not in html and html.count('alt="Gantt chart of') == 1
    pids = {e["pid"] for e in json.loads((tmp_path / "b" / "trace.json").read_text())["traceEvents"]
            if e["ph"] == "X"}
    assert pids == {d.rank for d in rec.devices}


def test_a_failure_leaves_nothing_half_written(homo_dir, tmp_path, monkeypatch):
    """If a figure cannot be drawn, nothing is written (not even the folder's files); if the
    trace cannot be written, none of the report files nor temp files appear, and an earlier
    report in the folder stays as it was."""
    out = tmp_path / "rep"
    shutil.copytree(homo_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one = _simulate_all("dgx-a100", 2, ["tp=8"])

    def boom(*args, **kwargs):
        raise OSError("disk full")
    with monkeypatch.context() as m:
        m.setattr(plots, "gantt", boom)
        with pytest.raises(OSError):
            write_report(out, one)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # Skip the drawing (not under test here) and fail while writing the last file (the
    # trace), after the other temp files were written.
    monkeypatch.setattr(report_mod, "render", lambda *a, **k: {n: b"new" for n in report_mod.FILES})
    real_write = Path.write_bytes

    def fail_on_trace(self, data):
        if self.name.startswith(".trace"):
            raise OSError("disk full")
        return real_write(self, data)
    monkeypatch.setattr(Path, "write_bytes", fail_on_trace)
    with pytest.raises(OSError):
        write_report(out, one)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(OSError):
        write_report(tmp_path / "fresh", one)
    assert list((tmp_path / "fresh").iterdir()) == []


def test_simulate_report_matches_json(tmp_path, capsys):
    """`simulate --report DIR --json`: the one-row plans.csv holds the printed numbers."""
    code = main(["simulate", "dgx-a100", "--nodes", "2", "--plan", "tp=2,pp=2", "--json",
                 "--report", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    df = pd.read_csv(tmp_path / "plans.csv")
    assert len(df) == 1 and df["tokens_per_s"][0] == d["tokens_per_s"]
    html = (tmp_path / "index.html").read_text()
    assert "plansim simulation report" in html and len(_images(html)) == 3  # bars, Gantt, memory


def test_report_command_ranks_the_given_plans(tmp_path, capsys):
    """`report --plans`: each plan simulated once (duplicates merged), ranked by tokens/s,
    best and runner-up drawn as Gantt charts, the trace is the best plan's."""
    out = tmp_path / "r"
    code = main(["report", "dgx-a100", "--nodes", "2", "--plans", "tp=8", "tp=2,pp=2", "tp=1",
                 "tp=2,pp=2,dp=4", "--out", str(out)])
    text, err = capsys.readouterr()
    assert code == 0, err
    df = pd.read_csv(out / "plans.csv")
    assert sorted(df["plan"]) == sorted(["tp=8,pp=1,dp=2,mbs=1,schedule=1f1b",
                                         "tp=2,pp=2,dp=4,mbs=1,schedule=1f1b",
                                         "tp=1,pp=1,dp=16,mbs=1,schedule=1f1b"])
    assert list(df["tokens_per_s"]) == sorted(df["tokens_per_s"], reverse=True)
    html = (out / "index.html").read_text()
    assert html.count('alt="Gantt chart of') == 2
    assert f"best {df['plan'][0]}" in text and "report written to" in text
    names = [e["args"]["name"] for e in json.loads((out / "trace.json").read_text())["traceEvents"]
             if e.get("name") == "process_name" and e["pid"] != 1_000_000]
    assert len(names) == int(plan_fields(df["plan"][0])["pp"])  # one simulated device per stage


def test_report_command_bad_plan_writes_nothing(tmp_path, capsys):
    """A plan that does not divide the cluster: one line on stderr, exit 2, no folder."""
    out = tmp_path / "r"
    code = main(["report", "dgx-a100", "--nodes", "2", "--plans", "tp=2", "tp=3", "--out", str(out)])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "tp*pp = 3" in err
    assert not out.exists()


def test_report_command_uses_the_search(tmp_path, capsys, monkeypatch):
    """Without --plans, `report` calls search.search.search(model, cluster, profile, top=K) and
    reports its ranked plans, notes and pruning; the top two are re-simulated with timelines."""
    calls = []

    def fake_search(model, cluster, profile, top=10):
        calls.append(top)
        sr = _simulate_all("dgx-a100", 2, ["tp=1", "tp=2,pp=2", "tp=8"], record=False)
        sr.notes = ["Top-k compression does not pay on this fabric."]
        return sr
    monkeypatch.setitem(sys.modules, "search.search", types.SimpleNamespace(search=fake_search))
    out = tmp_path / "r"
    assert main(["report", "dgx-a100", "--nodes", "2", "--top", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    assert calls == [3]
    assert list(pd.read_csv(out / "plans.csv")["plan"]) == [
        r.plan for r in _simulate_all("dgx-a100", 2, ["tp=1", "tp=2,pp=2", "tp=8"], record=False).ranked]
    html = (out / "index.html").read_text()
    assert "Top-k compression does not pay on this fabric." in html
    assert "30 candidate plans enumerated" in html
    assert html.count('alt="Gantt chart of') == 2 and (out / "trace.json").exists()


def test_png_bytes_do_not_depend_on_rc_settings(homo):
    """A user's matplotlib settings do not leak into the figures (the style is pinned)."""
    import matplotlib
    a = plots.breakdown_bars(homo.ranked)
    with matplotlib.rc_context({"font.size": 20, "axes.facecolor": "#ff0000"}):
        b = plots.breakdown_bars(homo.ranked)
        assert matplotlib.rcParams["font.size"] == 20  # and the caller's settings are restored
    assert a == b


def test_given_plans_merge_into_the_search_order():
    """Extra plans go before the first search result they beat (fits, then tokens/s) and
    never reorder the search's own ranking (which may demote a lossy plan on purpose)."""
    from plansim.cmd_report import merge_into
    a, b = _fake("tp=1,pp=1,dp=8,mbs=1", 100.0), _fake("tp=1,pp=1,dp=8,mbs=1,compress=topk:0.01", 120.0)
    c, d = _fake("tp=2,pp=1,dp=4,mbs=1", 110.0), _fake("tp=4,pp=1,dp=2,mbs=1", 90.0)
    e = _fake("tp=8,pp=1,dp=1,mbs=1", 500.0, fits=False)
    merged = merge_into([a, b], [c, d, e, _fake(a.plan, 1.0)])
    assert [r.plan for r in merged] == [c.plan, a.plan, b.plan, d.plan, e.plan]
    assert merged[1] is a  # the search's own result is kept, not the duplicate


def test_report_into_a_file_is_an_input_error(tmp_path, capsys):
    """`--report` / `--out` naming an existing file: one line on stderr, exit 2, file untouched."""
    target = tmp_path / "taken"
    target.write_text("mine")
    assert main(["simulate", "dgx-a100", "--nodes", "1", "--plan", "tp=8", "--report", str(target)]) == 2
    assert main(["report", "dgx-a100", "--nodes", "1", "--plans", "tp=8", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and err.count("is not a directory") == 2
    assert target.read_text() == "mine"
