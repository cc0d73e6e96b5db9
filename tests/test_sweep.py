"""`plansim sweep`: the grid file's edge (one line naming file and field, exit 2, nothing
written), each cell's result against a direct search of the same inputs, and the report."""
from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from plansim.cli import main
from search.executor import ExecutorSpec
from search.sweep import run_sweep
from specs.model import PRESETS
from specs.sweep import load_grid

# Two cells of the tiny model (4 layers; a search takes about a second): one and two DGX
# A100 nodes, the second with a sequence length other than the preset's 64.
GRID = """\
name: tiny on one and two nodes
models: [tiny]
topologies: [dgx-a100]
nodes: [1, 2]
seq_lengths: [128]
top: 2
"""


@pytest.fixture(scope="module")
def grid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grid") / "grid.yaml"
    path.write_text(GRID)
    return path


@pytest.fixture(scope="module")
def swept(grid_file):
    return run_sweep(load_grid(grid_file), ExecutorSpec("local", jobs=1), progress=False)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cells_in_grid_order(grid_file):
    """The grid expands to models x topologies x nodes x seq_lengths in file order, with
    the device counts the topology gives (8 GPUs per DGX A100 node) and the overridden
    sequence length on the model each cell searches."""
    grid = load_grid(grid_file)
    assert [(c.model_label, c.topology_label, c.nodes, c.num_devices, c.model.seq_length) for c in grid.cells] \
        == [("tiny", "dgx-a100", 1, 8, 128), ("tiny", "dgx-a100", 2, 16, 128)]
    assert grid.cells[0].model == replace(PRESETS["tiny"], seq_length=128)


def test_cell_is_the_search_of_its_inputs(swept, tmp_path, capsys):
    """Each cell's ranked plans, step times and memory are those `plansim search --json`
    prints for the same model (a model file with sequence length 128), topology and node
    count, so a sweep loads its inputs (profile included) as the search command does;
    tokens/s is batch x sequence / step (16 x 128 tokens) and tokens/s per GPU divides it
    by the cell's GPU count."""
    fields = {k: getattr(PRESETS["tiny"], k) for k in ("name", "num_layers", "hidden_size", "num_attention_heads",
                                                        "vocab_size", "global_batch_size")}
    model = tmp_path / "tiny128.yaml"
    model.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()) + "seq_length: 128\n")
    for cell, nodes in zip(swept.cells, (1, 2)):
        code, out, err = run(capsys, "search", "dgx-a100", "--nodes", nodes, "--model", model, "--top", 2, "--json")
        assert code == 0, err
        direct = json.loads(out)["ranked"]
        assert [r.plan for r in cell.ranked] == [r["plan"] for r in direct]
        assert [r.step_time_s for r in cell.ranked] == [r["step_time_s"] for r in direct]
        row = cell.row()
        assert row["peak_memory_gib"] == direct[0]["peak_memory_gib"]
        assert row["tokens_per_s"] == pytest.approx(16 * 128 / row["step_time_s"], rel=1e-12)
        assert row["tokens_per_s_per_gpu"] == pytest.approx(row["tokens_per_s"] / (8 * nodes), rel=1e-12)


def test_report_and_json(grid_file, swept, tmp_path, capsys):
    """`plansim sweep --report --json` writes index.html, report.md, sweep.csv and the plot,
    and prints one JSON object; the CSV's rows and the JSON's cells carry the same numbers
    as the sweep run in-process (the search is deterministic)."""
    out_dir = tmp_path / "rep"
    code, out, err = run(capsys, "sweep", grid_file, "--jobs", "1", "--report", out_dir, "--json")
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["index.html", "report.md", "scaling.png", "sweep.csv"]
    rows = list(csv.DictReader((out_dir / "sweep.csv").open()))
    assert [r["best_plan"] for r in rows] == [c.best.plan for c in swept.cells]
    assert [float(r["step_time_s"]) for r in rows] == [c.best.step_time_s for c in swept.cells]
    doc = json.loads(out)
    assert [c["best_plan"] for c in doc["cells"]] == [c.best.plan for c in swept.cells]
    assert [len(c["ranked"]) for c in doc["cells"]] == [2, 2]
    md = (out_dir / "report.md").read_text()
    assert swept.cells[0].best.plan in md and "![" in md


@pytest.mark.parametrize("body, field", [
    ("models: [tiny]\ntopologies: [dgx-a100]\nnodes: [0]\n", "nodes.0: 0: must be an integer in [1, 131072]"),
    ("models: [tiny]\ntopologies: [dgx-a100]\nnodez: [1]\n", "nodez: unknown field; allowed: name, models"),
    ("models: [tiny, tiny]\ntopologies: [dgx-a100]\n", "models: 'tiny' is listed twice"),
    ("models: [nosuch]\ntopologies: [dgx-a100]\n", "models.0: 'nosuch': no such model preset or file"),
    ("models: [tiny]\ntopologies: [nosuch]\n", "topologies.0.name: 'nosuch': no bundled topology or file"),
    ("models: [tiny]\ntopologies: [hetero-a100-v100]\nnodes: [2]\n", "nodes: 2 for 'hetero-a100-v100': cannot scale"),
    ("models: [tiny]\ntopologies: [{name: dgx-a100, nodes: [true]}]\n", "topologies.0.nodes.0: True: must be an integer"),
    ("models: [tiny]\ntopologies: [dgx-a100]\nseq_lengths: [1.5]\n", "seq_lengths.0: 1.5: must be an integer"),
    ("models: [tiny]\ntopologies: [dgx-a100]\nprofiles: [nosuch.yaml]\n", "profiles.0: 'nosuch.yaml': no such profile"),
    ("models: [tiny]\ntopologies: [dgx-a100, {name: dgx-a100, nodes: [16]}]\n", "topologies: two entries give the same"),
    ("[1, 2]\n", "expected a mapping of name, models, topologies"),
    ("models: [tiny]\ntopologies: [dgx-a100]\nruntimes: [megatron]\n", "runtimes.0: 'megatron': must be 'megatron-core'"),
    ("models: [tiny]\ntopologies: [dgx-a100]\nnodes: [" + ", ".join(map(str, range(1, 66))) + "]\n",
     "nodes: [1, 2, 3, 4, ...]: List should have at most 64 items"),
    ("models: [" + ", ".join(["gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b"]) + "]\ntopologies: [dgx-a100]\n"
     "nodes: [" + ", ".join(map(str, range(1, 33))) + "]\nseq_lengths: [" + ", ".join(map(str, range(1, 34)))
     + "]\n", "4,224 cells (models x topologies x nodes x seq_lengths x profiles x runtimes); a sweep may have at most 4,096"),
])
def test_bad_grid(tmp_path, capsys, body, field):
    """A bad grid is one line on stderr naming the grid file and the field (and what is
    allowed), exit 2, before any search runs: the report folder is not created."""
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    code, out, err = run(capsys, "sweep", path, "--report", tmp_path / "rep")
    assert code == 2 and out == ""
    assert err.startswith(f"plansim: error: {path}: ") and err.count("\n") == 1
    assert field in err
    assert not (tmp_path / "rep").exists()


def test_4096_cells_is_the_limit(tmp_path):
    """The cell bound is inclusive: 4 models x 32 node counts x 32 sequence lengths is
    4,096 cells and loads (nothing is searched by loading); test_bad_grid refuses 4,224."""
    nodes = ", ".join(map(str, range(1, 33)))
    seqs = ", ".join(map(str, range(1, 33)))
    path = tmp_path / "g.yaml"
    path.write_text(f"models: [gpt3-125m, gpt3-350m, gpt3-760m, gpt3-1.3b]\ntopologies: [dgx-a100]\n"
                    f"nodes: [{nodes}]\nseq_lengths: [{seqs}]\n")
    assert len(load_grid(path).cells) == 4 * 32 * 32


def test_relative_paths_and_no_fit(tmp_path, capsys):
    """Model files are read relative to the grid's folder; a cell in which no plan fits is
    reported as such (with the search's reason) while the other cells still get plans."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "wide.yaml").write_text(
        "name: wide\nnum_layers: 2\nhidden_size: 65536\nnum_attention_heads: 64\nseq_length: 64\n"
        "vocab_size: 512\nglobal_batch_size: 8\n")
    path = tmp_path / "g.yaml"
    path.write_text("models: [tiny, models/wide.yaml]\ntopologies: [dgx-a100]\nnodes: [1]\n")
    code, out, err = run(capsys, "sweep", path, "--jobs", "1", "--json")
    assert code == 0, err
    cells = json.loads(out)["cells"]
    assert cells[0]["best_plan"] and cells[0]["no_fit"] == ""
    assert cells[1]["best_plan"] == "" and "no plan fits" in cells[1]["no_fit"]


def test_example_grid_loads():
    """The shipped example (sweeps/example.yaml) is a valid grid of 2 models x 2 topologies
    x 3 node counts = 12 cells, 8 to 32 GPUs (8 per DGX node)."""
    from pathlib import Path

    grid = load_grid(Path(__file__).resolve().parents[1] / "sweeps" / "example.yaml")
    assert len(grid.cells) == 12
    assert sorted({c.num_devices for c in grid.cells}) == [8, 16, 32]
def test_runtime_axis(tmp_path, capsys):
    """A `runtimes` axis searches each cell under that framework runtime, as
    `plansim search --runtime NAME` does (same ranked plans and step times); the default
    runtime is the search command's own."""
    path = tmp_path / "g.yaml"
    path.write_text("models: [tiny]\ntopologies: [dgx-a100]\nnodes: [1]\nruntimes: [megatron-core, torchtitan]\ntop: 2\n")
    grid = load_grid(path)
    assert [c.runtime for c in grid.cells] == ["megatron-core", "torchtitan"]
    swept = run_sweep(grid, ExecutorSpec("local", jobs=1), progress=False)
    for cell in swept.cells:
        code, out, err = run(capsys, "search", "dgx-a100", "--nodes", 1, "--model", "tiny", "--top", 2,
                             "--runtime", cell.cell.runtime, "--json")
        assert code == 0, err
        direct = json.loads(out)["ranked"]
        assert [(r.plan, r.step_time_s) for r in cell.ranked] == [(r["plan"], r["step_time_s"]) for r in direct]


def test_each_topology_file_parsed_once(tmp_path, monkeypatch):
    """A grid of two topologies and three node counts reads and validates each topology
    file once (2 parses, not 2 x (1 + 3)), and the device counts are the node counts times
    8 GPUs (DGX A100 and DGX H100 nodes): 8, 16, 32 for each."""
    import specs.topology as T
    calls = []
    real = T._parse
    monkeypatch.setattr(T, "_parse", lambda source, text: calls.append(source) or real(source, text))
    path = tmp_path / "g.yaml"
    path.write_text("models: [tiny]\ntopologies: [dgx-a100, dgx-h100]\nnodes: [1, 2, 4]\n")
    grid = load_grid(path)
    assert len(calls) == 2
    assert [c.num_devices for c in grid.cells] == [8, 16, 32, 8, 16, 32]
