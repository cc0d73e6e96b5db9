"""Hostile inputs (issue 12): the contract for any bad input is one line on stderr, exit 2,
no traceback, nothing written, in bounded time and memory.

Fixed regressions first (each failed on the code before the edge validation: it hung, ran out
of memory, raised a traceback or answered with a confident number), then property-based runs
over plan strings and model, topology and profile documents. The property tests call the
loaders in-process (fast) and assert the library-level contract (a result or an InputError
with a one-line message, nothing else); a few subprocess runs check the real exit code and
stderr under a memory limit.
"""
from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.errors import InputError
from costmodel.profile import _merge, default_profile, load_profile
from plansim.cli import main
from specs.model import load_model, model_from_mapping
from specs.plan import resolve_plan
from specs.topology import _parse, load_topology
from specs.topology_build import build as _build

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = {
    "name": "t",
    "node_types": {"box": {
        "gpu": "A100-SXM4-80GB", "gpus_per_node": 2,
        "intra": {"kind": "nvswitch", "bw_GBps": 300, "latency_us": 1.0},
        "pcie": {"bw_GBps": 31.5, "latency_us": 0.5},
        "nics": {"count": 2, "bw_gbps": 200, "latency_us": 0.6}}},
    "groups": [{"name": "g", "node_type": "box", "nodes": 2}],
    "network": {"kind": "fat_tree", "nodes_per_leaf": 2, "switch_latency_us": 0.3},
}
MODEL = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128,
         "vocab_size": 1024, "global_batch_size": 8}


def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _assert_refused(code, err):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def _file(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


def _topo_with(**changes) -> dict:
    """TOPOLOGY with dotted-path changes, e.g. {'node_types.box.nics.count': 10**6}."""
    doc = copy.deepcopy(TOPOLOGY)
    for path, value in changes.items():
        cur = doc
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    return doc


# ------------------------------------------------------------------ fixed regressions

@pytest.mark.parametrize("path,value,needle", [
    ("node_types.box.intra.bw_GBps", float("inf"), "finite number in [0.001, 100000]"),
    ("node_types.box.intra.latency_us", float("inf"), "in [0, 1e+06]"),
    ("node_types.box.nics.bw_gbps", 1e-300, "[0.01, 1e+06]"),
    ("network.switch_latency_us", float("nan"), "finite number"),
    ("node_types.box.gpus_per_node", 10**6, "integer in [1, 1024]"),
    ("node_types.box.nics.count", 10**6, "integer in [1, 256]"),
    ("groups.0.nodes", 10**18, "integer in [1, 131072]"),
    ("groups.0.nodes", 70_000, "more than 131,072 devices"),
    ("node_types.box.gpus_per_node", True, "integer"),
], ids=["inf-bw", "inf-latency", "tiny-nic-bw", "nan-switch", "gpus-1e6", "nics-1e6", "nodes-1e18",
        "devices-total", "bool-gpus"])
def test_topology_numbers_bounded(tmp_path, path, value, needle):
    """Infinite, NaN, absurdly small or huge numbers and booleans in a topology are refused
    with the allowed range, before any node is built. Before: .inf hung the flow network's
    event loop, a million GPUs/NICs per node ran out of memory after minutes, 1e-300 Gb/s
    gave a 1e301 s step marked as fitting, `true` was taken as 1."""
    src = _file(tmp_path, "t.yaml", _topo_with(**{path: value}))
    with pytest.raises(InputError) as exc:
        load_topology(src)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text,needle", [
    ("gpus:\n  default: {kernel_overhead_us: .nan}\n", "kernel_overhead_us"),
    ("fabrics:\n  nvswitch: {call_latency_us: .inf}\n", "call_latency_us"),
    ("fabrics:\n  network: {compute_slowdown: 50}\n", "[0, 1)"),
    ("fabrics:\n  network: {bw_eff: .nan}\n", "[0.001, 1]"),
    # Inside (0, 1] but no efficiency: 5e-324 divided by zero, 1e-300 hung the flow solver.
    ("gpus:\n  A100-SXM4-80GB: {gemm_eff_max: 5.0e-324}\n", "[0.001, 1]"),
    ("gpus:\n  A100-SXM4-80GB: {hbm_eff: 1.0e-300}\n", "[0.001, 1]"),
    ("gpus:\n  H100-SXM5-80GB: {gemm_eff_max_fp8: 1.0e-9}\n", "0 (unset) or in [0.001, 1]"),
    # Integer fields take integers: fsdp_prefetch_layers 1.5 raised TypeError mid-simulation.
    ("runtime: {fsdp_prefetch_layers: 1.5}\n", "must be an integer in [0, 64]"),
    ("runtime: {host_cores: 1.5}\n", "must be an integer"),
    # A misspelt GPU or link class calibrated nothing, silently.
    ("gpus:\n  A100-SXM4-80G: {gemm_eff_max: 0.5}\n", "gpus.A100-SXM4-80G: unknown GPU; allowed: default, "),
    ("fabrics:\n  nvswich: {bw_eff: 0.5}\n", "fabrics.nvswich: unknown link class; allowed: default, nvswitch"),
    ("runtime: {host_overhead_us: 1.0e+300}\n", "[0, 1e+06]"),
    ("gpus: [1, 2]\n", "gpus: list: must be a mapping"),
    ("fabrics: 3\n", "fabrics: 3: must be a mapping"),
    ("gpus:\n  default: {sm_count: true}\n", "sm_count: True"),
    # 30 runtime names no longer fit one line: the closest ones are named instead.
    ("runtime: {fsdp_unit_ud: 3}\n", "runtime.fsdp_unit_ud: unknown field; allowed: one of 37 names (closest: "
                                      "fsdp_unit_us, fsdp_unit_us_per_mib; all in costmodel/profile.py RuntimeSettings)"),
], ids=["nan-overhead", "inf-call-latency", "slowdown-50", "nan-eff", "denormal-gemm-eff", "tiny-hbm-eff",
        "tiny-fp8-eff", "float-prefetch", "float-host-cores", "typo-gpu", "typo-fabric", "huge-host", "gpus-list", "fabrics-int", "bool-sm",
        "typo-runtime-field"])
def test_profile_numbers_bounded(tmp_path, text, needle):
    """Profile numbers are finite and in range, and `gpus`/`fabrics` are mappings. Before: a
    NaN kernel overhead made compute free (MFU 53 %), NaN call latency made TP free,
    compute_slowdown 50 was accepted, and a list of GPUs raised AttributeError."""
    with pytest.raises(InputError) as exc:
        load_profile(_file(tmp_path, "p.yaml", text))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("field,value", [
    ("num_layers", True), ("num_layers", 10**9), ("hidden_size", 16e300), ("global_batch_size", 1.28e18),
    ("global_batch_size", 10**18), ("seq_length", 2048.0), ("vocab_size", float("nan")),
])
def test_model_sizes_bounded(field, value):
    """Model sizes are integers (no booleans, no floats) within documented bounds. Before:
    `num_layers: true` simulated one layer, 16e300 raised OverflowError, 10^9 layers hung and
    a 1.28e18 batch ran out of memory."""
    with pytest.raises(InputError) as exc:
        model_from_mapping({**MODEL, field: value}, "m.yaml")
    assert exc.value.field == field and "must be an integer in [1, " in str(exc.value)


@pytest.mark.parametrize("field,value", [("tie_embeddings", "no"), ("tie_embeddings", 0), ("linear_bias", 1),
                                         ("position_embedding", "alibi"), ("normalization", "batchnorm"),
                                         ("normalization", None)])
def test_model_architecture_fields_refuse_other_values(field, value):
    """The four architecture fields take exactly their documented values: YAML booleans for
    tie_embeddings / linear_bias (not 0, 1 or 'no'), 'learned' or 'rope', 'layernorm' or
    'rmsnorm'; the error names the field."""
    with pytest.raises(InputError) as exc:
        model_from_mapping({**MODEL, field: value}, "m.yaml")
    assert exc.value.field == field and "\n" not in str(exc.value)
    ok = model_from_mapping({**MODEL, "tie_embeddings": False, "position_embedding": "rope",
                             "linear_bias": False, "normalization": "rmsnorm"}, "m.yaml")
    assert (ok.tie_embeddings, ok.position_embedding, ok.linear_bias, ok.normalization) == \
        (False, "rope", False, "rmsnorm")


@pytest.mark.parametrize("plan,field", [("compress=topk:1e-300", "compress"), ({"tp": True}, "tp"),
                                        ({"sp": 1}, "sp"), ({"mbs": 10**9}, "mbs"),
                                        ("compress=topk:nan", "compress"), ("dp=99999999999999999999", "dp")],
                         ids=["topk-1e-300", "yaml-true-tp", "yaml-1-sp", "mbs-1e9", "topk-nan", "dp-huge"])
def test_plan_values_bounded(plan, field):
    """Plan values: top-k keeps at least a millionth of the entries (1e-300 ranked faster
    than dense), a YAML boolean is not a degree and 1 is not a boolean (plan files took
    `tp: true` as tp=1), sizes are bounded (the last three are guards that already held)."""
    with pytest.raises(InputError) as exc:
        resolve_plan(plan, load_model("gpt3-125m"), 8)
    assert exc.value.field == field


@pytest.mark.parametrize("plan,field", [("tp=\uff12,dp=4", "tp"), ("dp=\u0668", "dp"), ({"mbs": "\uff11"}, "mbs")],
                         ids=["fullwidth-2", "arabic-indic-8", "yaml-fullwidth-1"])
def test_plan_numbers_are_ascii_digits(plan, field):
    """A degree written in another script's digits is refused (Python's int() reads
    fullwidth "\uff12" as 2 and Arabic-Indic "\u0668" as 8, and plans took them), while the
    ASCII string "4" from a plan string stays a number."""
    with pytest.raises(InputError) as exc:
        resolve_plan(plan, load_model("gpt3-125m"), 8)
    assert exc.value.field == field
    assert resolve_plan("tp=2,dp=4", load_model("gpt3-125m"), 8).tp == 2


@pytest.mark.parametrize("argv", [["--nodes", "1000000000000000000"], ["--nodes", "1000000"]],
                         ids=["1e18", "1e6"])
def test_huge_node_count_refused_at_once(capsys, argv):
    """--nodes beyond 131,072 is refused before anything is built. Before: 10^18 hung and a
    million ran for minutes into MemoryError."""
    _assert_refused(*_cli(capsys, "simulate", "dgx-a100", *argv)[::2])


def test_tp_groups_straddling_nodes_unevenly_are_refused(capsys):
    """tp=3 on 8-GPU nodes: the group of ranks 6-8 crosses from node 0 to node 1 while the
    first two groups sit in one node. The simulator costs one TP group per stage, so it
    used to report the step about 30 % faster than the real plan; now it refuses, naming
    the group, while tp=16 (every group spans exactly two nodes) still simulates."""
    code, _, err = _cli(capsys, "simulate", "dgx-a100", "--nodes", "3", "--model", "gpt3-175b",
                        "--plan", "tp=3,pp=8,dp=1")
    _assert_refused(code, err)
    assert "ranks 6-8" in err and "crosses a node boundary" in err
    code, out, err = _cli(capsys, "simulate", "dgx-a100", "--nodes", "2", "--model", "gpt3-1.3b",
                          "--plan", "tp=16", "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] > 0


def test_bad_plan_fails_before_the_cluster_is_built(capsys, monkeypatch):
    """`simulate --nodes 16384` (131,072 devices, the largest allowed) with a plan that cannot
    split the batch is refused without building the cluster. Before: the 131k-device graph
    was built first (tens of seconds; --nodes 100000 took a minute and 2.7 GB)."""
    import specs.topology_build as topology_build

    def no_build(*_):
        raise AssertionError("the cluster was built before the plan was checked")
    monkeypatch.setattr(topology_build, "build", no_build)
    code, _, err = _cli(capsys, "simulate", "dgx-a100", "--nodes", "16384", "--model", "gpt3-125m")
    _assert_refused(code, err)
    assert "dp=131072" in err


@pytest.mark.parametrize("argv", [["search", "--top", "1000000000"], ["search", "--workers", "0"],
                                  ["report", "--top", "0", "--out", "r"]], ids=["top-1e9", "workers-0", "report-top-0"])
def test_search_counts_bounded(capsys, tmp_path, monkeypatch, argv):
    """--top is at most 1,000 and --workers in [1, 256], checked before any work. Before:
    --top 1000000000 simulated all 3,383 candidates."""
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, *argv)
    _assert_refused(code, err)
    assert argv[1] in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("trace", [".", "/", ""], ids=["dot", "root", "empty"])
def test_trace_path_must_be_a_file(capsys, tmp_path, monkeypatch, trace):
    """--trace . / '' are one-line errors (exit 2) before anything is simulated. Before: '.'
    and '/' raised tracebacks and '' was silently ignored."""
    monkeypatch.chdir(tmp_path)
    _assert_refused(*_cli(capsys, "simulate", "--nodes", "1", "--model", "gpt3-125m", "--trace", trace)[::2])
    assert list(tmp_path.iterdir()) == []


def test_trace_never_deletes_a_file_it_did_not_create(capsys, tmp_path):
    """The trace goes through a unique temporary, so a user's `notes.tmp` survives `--trace
    notes`. Before: the fixed name NAME.tmp was written over and renamed away."""
    (tmp_path / "notes.tmp").write_text("mine")
    code, _, err = _cli(capsys, "simulate", "--nodes", "1", "--model", "gpt3-125m",
                        "--trace", str(tmp_path / "notes"))
    assert code == 0, err
    assert (tmp_path / "notes.tmp").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "notes.tmp"]


def test_every_output_checked_before_the_first_is_written(capsys, tmp_path):
    """A bad --report path leaves no trace written; a report file whose name is a folder
    leaves the earlier report untouched. Before: the trace was written before the report
    path was checked, and index.html was already replaced when report.md failed."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    trace = tmp_path / "t.json"
    _assert_refused(*_cli(capsys, "simulate", "--nodes", "1", "--model", "gpt3-125m", "--trace", str(trace),
                          "--report", str(blocker))[::2])
    assert not trace.exists()
    out = tmp_path / "r"
    out.mkdir()
    (out / "index.html").write_text("old")
    (out / "report.md").mkdir()
    code, _, err = _cli(capsys, "simulate", "--nodes", "1", "--model", "gpt3-125m", "--report", str(out))
    _assert_refused(code, err)
    assert (out / "index.html").read_text() == "old"
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "report.md"]


def test_nothing_fits_exits_2_and_names_the_change(capsys, tmp_path):
    """`search` and `report` with no plan that fits: exit 2, one line saying why (the closest
    plan and its shortfall) and the fewest nodes that fit; nothing written. Before: search
    printed 'no plan fits' with exit 0, and report (gpt3-175b, the issue's case) wrote three
    files then raised IndexError."""
    code, _, err = _cli(capsys, "search", "dgx-a100", "--nodes", "1", "--model", "llama2-70b")
    _assert_refused(code, err)
    # 70B parameters x 16 bytes of weights, gradients and Adam states = 1.12 TB: more than
    # 8 x 80 GB, less than 16 x 80 GB, so two nodes is the fewest that can fit.
    assert "no plan fits" in err and "closest: " in err and "smallest change that fits: --nodes 2 " in err
    out = tmp_path / "r"
    _assert_refused(*_cli(capsys, "report", "dgx-a100", "--nodes", "1", "--model", "gpt3-175b",
                          "--out", str(out))[::2])
    assert not out.exists()


def test_concurrent_report_writers_leave_one_complete_report(tmp_path):
    """Four writers into one folder, 100 times: the folder always holds a complete set of
    files from exactly one writer, and no temporary is left. Before: fixed temporary names
    made concurrent runs fail at random and mix files from different runs."""
    from reports.files import write_files

    out = tmp_path / "r"
    names = ["index.html", "report.md", "plans.csv", "trace.json"]
    for _ in range(100):
        errors = []

        def write(i):
            try:
                write_files(out, {n: f"{i}:{n}".encode() * 1000 for n in names})
            except Exception as err:  # noqa: BLE001 - collected and asserted below
                errors.append(err)
        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        writers = {(out / n).read_text().split(":")[0] for n in names}
        assert len(writers) == 1 and sorted(p.name for p in out.iterdir()) == sorted(names)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.parametrize("argv_fn", [
    lambda d: ["simulate", "--nodes", "1", "--trace", "."],
    lambda d: ["simulate", _file(d, "t.yaml", _topo_with(**{"node_types.box.intra.latency_us": float("inf")}))],
    lambda d: ["simulate", "--nodes", "1", "--plan", str(_bytes(d, "p.yaml", b"tp: \xe9\n"))],
    lambda d: ["simulate", _file(d, "t.yaml", yaml.safe_dump(TOPOLOGY) + "description: [&a [x,x,x,x,x,x,x,x,x], "
               + ", ".join(f"&{k} [" + ",".join([f"*{p}"] * 9) + "]" for p, k in zip("abcdefgh", "bcdefghi")) + "]\n")],
], ids=["trace-dot", "inf-latency", "latin1-plan", "alias-bomb-topology"])
def test_real_process_exit_code(tmp_path, argv_fn):
    """The real command, in a subprocess under a 2 GiB address-space limit and a 60 s timeout:
    exit code 2, one stderr line, no traceback, no new file in the working folder."""
    argv = argv_fn(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "plansim", *argv], cwd=work, capture_output=True, text=True,
                          timeout=60, preexec_fn=_limit_memory,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    _assert_refused(proc.returncode, proc.stderr)
    assert list(work.iterdir()) == []


def _bytes(d, name, data: bytes) -> Path:
    p = d / name
    p.write_bytes(data)
    return p


# ------------------------------------------------------------------ property-based

HOSTILE = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 10**6, 10**18, 2**70, 1e-300, 1e300, 2.5, float("inf"),
                     float("-inf"), float("nan"), True, False, None, "", "x" * 200, [], {}, [1, 2], {"a": 1}]),
    st.integers(-10, 10), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
)


def _paths(doc, prefix=()):
    """Every (path, value) of a nested document, for picking what to corrupt."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _corrupt(doc, data):
    """A copy of `doc` with one to three values replaced by hostile ones or keys added."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = data.draw(st.sampled_from(paths))
        cur = doc
        for k in path[:-1]:
            cur = cur[k]
        if isinstance(cur, dict) and data.draw(st.booleans()):
            cur[data.draw(st.sampled_from(["extra", "name", "kind", 7, "nodes"]))] = copy.deepcopy(data.draw(HOSTILE))
        else:
            cur[path[-1]] = copy.deepcopy(data.draw(HOSTILE))
    return doc


def _one_line(err: InputError) -> None:
    text = str(err)
    assert "\n" not in text and len(text) < 600, text


def _fast(n: int):
    """n examples, each under a 2 s deadline (sized so the file runs in about a minute on a
    2-core machine: 3,000 each of topologies, models, profiles and plan strings (x 2))."""
    return settings(max_examples=n, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


@_fast(3000)
@given(data=st.data())
def test_property_topology_documents(data):
    """Any corruption of a valid topology document loads or raises a one-line InputError
    (never another exception), in bounded time (hypothesis deadline 2 s per example)."""
    doc = _corrupt(TOPOLOGY, data)
    try:
        topo = _parse("t.yaml", yaml.safe_dump(doc))
        _build(topo, "t.yaml")
    except InputError as err:
        _one_line(err)


@_fast(3000)
@given(data=st.data())
def test_property_model_documents(data):
    """Any corruption of a valid model document gives a ModelSpec with bounded integer sizes
    or a one-line InputError."""
    try:
        m = model_from_mapping(_corrupt(MODEL, data), "m.yaml")
    except InputError as err:
        _one_line(err)
    else:
        assert all(type(getattr(m, f)) is int for f in ("num_layers", "hidden_size", "global_batch_size"))


# Through JSON: the file's YAML aliases would share objects between entries.
PROFILE_DOC = json.loads(json.dumps(yaml.safe_load((ROOT / "costmodel" / "profiles" / "default.yaml").read_text())))
BASE_PROFILE = default_profile()


@_fast(3000)
@given(data=st.data())
def test_property_profile_documents(data):
    """Any corruption of the default profile merges into a profile whose every number is
    finite, or raises a one-line InputError."""
    import math
    from dataclasses import fields

    try:
        prof = _merge(BASE_PROFILE, _corrupt(PROFILE_DOC, data), "p.yaml")
    except InputError as err:
        _one_line(err)
    else:
        for rec in [*prof.gpus.values(), *prof.fabrics.values(), prof.runtime]:
            for f in fields(rec):
                v = getattr(rec, f.name)
                assert not isinstance(v, float) or math.isfinite(v)


PLAN_TOKENS = st.sampled_from(["tp", "pp", "dp", "mbs", "vpp", "schedule", "sp", "recompute", "zero",
                               "compress", "allreduce", "precision", "placement", "layers", "mb_shares",
                               "colour", "="])
PLAN_VALUES = st.one_of(st.sampled_from(["1", "2", "4", "8", "0", "-1", "true", "false", "1e9", "nan", "inf",
                                         "interleaved", "1f1b", "topk:0.01", "topk:1e-300", "full", "6:6",
                                         "3:3:3:3", "99999999999999999999", ""]), st.text(max_size=8))


@settings(max_examples=3000, deadline=1000)
@given(items=st.lists(st.tuples(PLAN_TOKENS, PLAN_VALUES), max_size=6), raw=st.text(max_size=30))
def test_property_plan_strings(items, raw):
    """Plan strings built from plan keys and hostile values (and raw text) resolve to a Plan
    or raise a one-line InputError, nothing else."""
    model = load_model("gpt3-125m")
    for text in (",".join(f"{k}={v}" for k, v in items), raw):
        if "\x00" in text or "/" in text:  # not a plan string (a path to a file)
            continue
        try:
            resolve_plan(text, model, 8)
        except InputError as err:
            _one_line(err)


def test_input_error_survives_a_process_pool():
    """An InputError raised in a worker process (the pools of `plansim accuracy` and
    `calibrate --runs`) pickles back as itself with its file, field and message; before,
    unpickling it failed and the pool died with BrokenProcessPool and a traceback."""
    import pickle
    from concurrent.futures import ProcessPoolExecutor
    err = pickle.loads(pickle.dumps(InputError("rows.csv", "r1.tp", "must divide 4")))
    assert (err.source, err.field, err.message) == ("rows.csv", "r1.tp", "must divide 4")
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(InputError, match=r"^a\.yaml: x: bad$"):
            pool.submit(_raise_input_error).result()


def _raise_input_error():
    raise InputError("a.yaml", "x", "bad")


def test_output_onto_a_fifo_or_device_refused(tmp_path):
    """An --out that exists but is not a regular file (a FIFO here; /dev/null in the field)
    is refused before any work: the atomic write's rename would have replaced it with a
    regular file (`calibrate --runs ... --out /dev/null` turned /dev/null into a file)."""
    from reports.files import output_file
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"pipe: --out: exists and is not a regular file"):
        output_file(fifo, "--out")
    assert output_file(tmp_path / "new.yaml", "--out") == tmp_path / "new.yaml"
    proc = subprocess.run([sys.executable, "-m", "plansim", "calibrate", "--runs", "nope.csv", "--out", str(fifo)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    _assert_refused(proc.returncode, proc.stderr)
    assert "not a regular file" in proc.stderr and Path(fifo).is_fifo()


def test_input_that_is_a_directory_or_fifo_named_as_such(tmp_path):
    """An input path that is a directory or a FIFO gets a one-line error saying what it is
    (it used to read "no such runs file" for a directory that plainly exists); a FIFO is
    refused without being opened, so reading it cannot block."""
    from costmodel.yamlio import read_text
    (tmp_path / "runs.csv").mkdir()
    with pytest.raises(InputError, match=r"runs\.csv: a directory; expected a runs file"):
        read_text(tmp_path / "runs.csv", what="runs file")
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(InputError, match=r"pipe\.csv: not a regular file \(a device, FIFO or socket\)"):
        read_text(tmp_path / "pipe.csv", what="runs file")
    with pytest.raises(InputError, match=r"gone\.csv: no such runs file"):
        read_text(tmp_path / "gone.csv", what="runs file")
    proc = subprocess.run([sys.executable, "-m", "plansim", "calibrate", "--runs", "runs.csv", "--out", "p.yaml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    _assert_refused(proc.returncode, proc.stderr)
    assert "a directory; expected a runs file" in proc.stderr and not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("argv_fn", [
    lambda d: ["simulate", "--nodes", "1", "--model", "tiny", "--report", str(d / "f" / "sub")],
    lambda d: ["report", "--nodes", "1", "--model", "tiny", "--plans", "dp=8", "--out", str(d / "f" / "a" / "b")],
    lambda d: ["sweep", _file(d, "g.yaml", "models: [tiny]\ntopologies: [dgx-a100]\nnodes: [1]\n"),
               "--report", str(d / "f" / "sub")],
], ids=["simulate", "report", "sweep"])
def test_report_folder_under_a_file_refused_before_any_work(capsys, tmp_path, monkeypatch, argv_fn):
    """A report folder whose path runs through a regular file (f/sub with f a file) can never
    be created: refused up front, naming the flag and the file in the way, with nothing
    simulated. Before: the check passed (f/sub does not exist), the whole run went ahead and
    the final mkdir failed with a bare 'f/sub: Not a directory'."""
    import sim.metrics
    import search.sweep

    def no_work(*_, **__):
        raise AssertionError("work started before the report folder was checked")
    monkeypatch.setattr(sim.metrics, "simulate", no_work)
    monkeypatch.setattr(search.sweep, "run_sweep", no_work)
    (tmp_path / "f").write_text("mine")
    code, _, err = _cli(capsys, *argv_fn(tmp_path))
    _assert_refused(code, err)
    assert "exists and is not a directory" in err and "'" + str(tmp_path / "f") + "'" in err
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.parametrize("argv_of, flag", [
    (lambda d: ["simulate", d, "--model", "tiny", "--plan", "dp=1"], "topology"),
    (lambda d: ["simulate", "dgx-a100", "--nodes", "1", "--model", d, "--plan", "dp=8"], "--model"),
    (lambda d: ["simulate", "dgx-a100", "--nodes", "1", "--model", "tiny", "--plan", d], "--plan"),
    (lambda d: ["simulate", "dgx-a100", "--nodes", "1", "--model", "gpt3-1.3b", "--plan", "dp=8",
                "--profile", d], "--profile"),
    (lambda d: ["simulate", "dgx-a100", "--nodes", "1", "--model", "tiny", "--plan", "dp=8", "--steps", "3",
                "--scenario", d], "--scenario"),
])
def test_a_directory_or_fifo_given_as_an_input_file_is_named_as_such(tmp_path, monkeypatch, capsys, argv_of, flag):
    """A topology, model, plan, profile or scenario argument that names an existing
    directory or FIFO gets one line saying what it is and what was expected (costmodel/
    yamlio.not_a_file), exit 2; before, each said "no such ... file" (or, for a plan,
    "expected key=value") about a path that plainly exists. The FIFO is never opened."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "afifo")
    for name, what in (("adir", "a directory; expected a"), ("afifo", "not a regular file")):
        assert main(argv_of(name)) == 2
        err = capsys.readouterr().err.strip()
        assert f"{name}: {flag}: {what}" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("flag, what", [("--plan", "plan file"), ("--profile", "profile file"),
                                        ("--scenario", "scenario file")])
@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"])
def test_an_empty_plan_profile_or_scenario_file_is_refused(capsys, tmp_path, flag, what, text):
    """A plan, profile or scenario file with nothing in it (YAML reads empty, blank or
    comment-only text as nothing) was read as every default (no events), so a truncated
    or wrong file gave a confident answer for an input the user never wrote. Now: exit 2,
    one line naming the file and what it should hold. An explicit empty mapping ({})
    still means the defaults."""
    f = tmp_path / "x.yaml"
    f.write_text(text)
    steps = ["--steps", "2"] if flag == "--scenario" else []
    assert main(["simulate", "dgx-a100", flag, str(f), *steps]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(f) in err and f"the {what} is empty" in err
    f.write_text("{}\n")
    assert main(["simulate", "dgx-a100", flag, str(f), *steps, "--json"]) == 0


def test_second_hostile_sweep_findings(tmp_path, capsys):
    """Findings of a 700-case hostile sweep (2026-12-03), each now one line and exit 2:
    a group naming an unknown node_type (ZeroDivisionError: its devices counted as none), an
    integer of 5,000 digits (PyYAML's ValueError), a 100,000-character --model path (a
    100 kB error line), a 50,000-row runs file (quadratic duplicate check: minutes)."""
    def one(*argv):
        code = main(list(argv))
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        return err
    topo = {**TOPOLOGY, "groups": [{"name": "g", "node_type": "nope", "nodes": 2}]}
    assert "groups.0.node_type: unknown node type 'nope'" in one(
        "simulate", _file(tmp_path, "t.yaml", topo), "--model", "gpt3-125m")
    assert "more than 4,300 digits" in one("simulate", _file(tmp_path, "big.yaml", "num_layers: " + "9" * 5000))
    assert len(one("simulate", "dgx-a100", "--model", "x" * 100_000)) < 600
    rows = [ln for ln in (ROOT / "validate/data/published_runs.csv").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    body = "\n".join(f"r{i}" + rows[1][rows[1].index(","):] for i in range(6000))
    assert "at most 5,000" in one("accuracy", "--rows", _file(tmp_path, "r.csv", rows[0] + "\n" + body + "\n"))


def test_plan_file_layers_as_written_on_the_command_line(tmp_path):
    """A plan file's `layers: 6:6` was YAML 1.1's base-60 integer 366 (refused as "must be
    a valid list") and `layers: "5:7"` was refused too; both now read as the --plan string
    does. The YAML reader has no base-60 numbers at all."""
    from costmodel.yamlio import parse_yaml
    assert parse_yaml("a: 6:6\nb: 1:30.5\nc: 12\nd: 0x1F\ne: 2.5\n", "x") == \
        {"a": "6:6", "b": "1:30.5", "c": 12, "d": 31, "e": 2.5}
    model = load_model("gpt3-125m")
    for text, layers in (("pp: 2\nlayers: 6:6\n", (6, 6)), ('pp: 2\nlayers: "5:7"\n', (5, 7))):
        assert resolve_plan(_file(tmp_path, "p.yaml", text), model, 2).layers == layers


def test_deeply_nested_yaml_is_one_line_not_a_crash(tmp_path, capsys):
    """100,000 nested flow lists (200 kB): PyYAML's Python parser raises RecursionError,
    refused in one line; libyaml's C parser (tried for speed in session 10) overflowed its
    stack and killed the process with SIGSEGV."""
    code = main(["simulate", _file(tmp_path, "deep.yaml", "[" * 100_000 + "]" * 100_000), "--model", "gpt3-125m"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "nested too deeply" in err
