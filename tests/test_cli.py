"""The command line: the JSON contract, the trace file, and bad input (one line on
stderr naming file and field, exit code 2, no traceback, nothing written)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plansim.cli import main

JSON_KEYS = {"step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
             "mfu", "hfu", "peak_memory_gib", "fits_memory", "bubble_fraction", "exposed_comm_s",
             "breakdown", "devices"}


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_contract(capsys):
    """`simulate --json` prints one object with every documented field, and the numbers
    agree with each other (tokens/s = batch*seq/step; MFU = model TFLOP/s / peak)."""
    code, out, err = run(capsys, "simulate", "dgx-a100", "--nodes", "2", "--model", "gpt3-1.3b",
                         "--plan", "tp=2,pp=2,mbs=2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert JSON_KEYS <= set(d)
    assert set(d["exposed_comm_s"]) == {"tp", "cp", "pp", "dp"}
    assert d["tokens_per_s"] == pytest.approx(512 * 2048 / d["step_time_s"])
    assert d["mfu"] == pytest.approx(d["model_tflops_per_gpu"] / 312.0)  # A100 bf16 dense peak
    assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
    assert d["devices"][0]["represents"] * len(d["devices"]) == 16


def test_out_of_memory_still_simulates(capsys):
    """A plan that does not fit still simulates, says fits_memory false and the shortfall."""
    code, out, _ = run(capsys, "simulate", "dgx-a100", "--nodes", "1", "--model", "gpt3-13b",
                       "--plan", "tp=1,dp=8,mbs=4", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["fits_memory"] is False
    assert d["memory_shortfall_gib"] == pytest.approx(d["peak_memory_gib"] - 80.0, rel=1e-6)


def test_trace_file(tmp_path, capsys):
    """--trace writes Chrome trace events: µs timestamps, a process per simulated device,
    threads per stream, and link-utilisation counters; the last event ends at the step."""
    path = tmp_path / "t.json"
    code, out, _ = run(capsys, "simulate", "dgx-a100", "--nodes", "2", "--model", "gpt3-1.3b",
                       "--plan", "tp=2,pp=2,mbs=2", "--json", "--trace", str(path))
    assert code == 0
    step_us = json.loads(out)["step_time_s"] * 1e6
    ev = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(step_us, rel=1e-6)
    assert {e["pid"] for e in spans} == {0, 2}  # stage representatives: ranks 0 and 2
    assert any(e["ph"] == "C" for e in ev)
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "pp", "dp"} <= names


def _topo(tmp_path, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return str(p)


GOOD_NODE = """
name: t
node_types:
  box:
    gpu: {gpu}
    gpus_per_node: 2
    intra: {{kind: nvswitch, bw_GBps: {bw}, latency_us: 1}}
groups:
  - {{name: g, node_type: box, nodes: 1}}
"""


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "no-such-topology"], "no-such-topology"),
    (["simulate", "--model", "no-such-model"], "--model"),
    (["simulate", "--nodes", "1", "--plan", "tp=3"], "tp"),
    (["simulate", "--nodes", "1", "--plan", "tp=2,pp=2,dp=4"], "dp"),
    (["simulate", "--nodes", "1", "--plan", "schedule=zigzag"], "schedule"),
    (["simulate", "--nodes", "1", "--plan", "pp=5"], "pp"),
    (["simulate", "--nodes", "1", "--plan", "colour=blue"], "colour"),
    (["simulate", "--nodes", "1", "--plan", "compress=topk:7"], "compress"),
    (["simulate", "--nodes", "1", "--plan", "pp=2,layers=20:20"], "layers"),
    (["simulate", "--nodes", "0"], "--nodes"),
    (["simulate", "--nodes", "1", "--plan", "no-such-plan.yaml"], "no-such-plan.yaml"),
    (["simulate", "--nodes", "1", "--profile", "no-such-profile.yaml"], "--profile"),
    (["simulate", "jeanzay-a100-opa", "--plan", "tp=2,pp=3,allreduce=hierarchical"], "allreduce"),
])
def test_bad_input_one_line(capsys, tmp_path, argv, needle):
    """Each bad input: exit 2, exactly one line on stderr naming the culprit, no traceback,
    and no trace file left behind."""
    trace = tmp_path / "trace.json"
    code, out, err = run(capsys, *argv, "--trace", str(trace))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not trace.exists()


@pytest.mark.parametrize("gpu,bw,needle", [("Z80", 300, "gpu"), ("A100-SXM4-80GB", 0, "bw_GBps"),
                                           ("A100-SXM4-80GB", -5, "bw_GBps")])
def test_bad_topology_file(capsys, tmp_path, gpu, bw, needle):
    """An unknown GPU type or a non-positive bandwidth in a topology file: one line naming
    the file and the field, exit 2."""
    path = _topo(tmp_path, GOOD_NODE.format(gpu=gpu, bw=bw))
    code, _, err = run(capsys, "simulate", path)
    assert code == 2
    assert path in err and needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8", "fp32"])
def test_every_precision_simulates(capsys, precision):
    """Each precision the plan allows simulates (fp8 on an A100, which has no fp8 units,
    falls back to the bf16 rate) and is echoed in the plan string unless it is the default."""
    code, out, err = run(capsys, "simulate", "--nodes", "1", "--plan", f"precision={precision}", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["step_time_s"] > 0 and d["plan"].count("precision") == (precision != "bf16")


def test_python_dash_m_sim():
    """`python -m sim` is the same command line, and a bad input gives no traceback there."""
    ok = subprocess.run([sys.executable, "-m", "sim", "models"], capture_output=True, text=True)
    assert ok.returncode == 0 and "gpt3-175b" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "sim", "simulate", "--plan", "tp=3"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "tp" in bad.stderr


def test_topology_names_its_profile(tmp_path, capsys):
    """A topology's `profiles` key selects the bundled profile of its fabric (dgx-a100 ->
    a100-ib-hdr: network bw_eff 0.96 of HDR line rate), --profile still goes over it, and an
    unknown profile name is an input error naming the field."""
    from argparse import Namespace

    from plansim.cli import _load_inputs
    args = Namespace(topology="dgx-a100", nodes=1, model=None, profile=None)
    _, _, prof = _load_inputs(args)
    assert prof.fabric("nic").bw_eff == 0.96
    user = tmp_path / "p.yaml"
    user.write_text("fabrics:\n  network: {bw_eff: 0.5}\n")
    _, _, prof = _load_inputs(Namespace(topology="dgx-a100", nodes=1, model=None, profile=str(user)))
    assert prof.fabric("nic").bw_eff == 0.5
    bad = _topo(tmp_path, GOOD_NODE.format(gpu="A100-SXM4-80GB", bw=300) + "profiles: [nope]\n")
    code, _, err = run(capsys, "simulate", bad)
    assert code == 2 and "profiles" in err and "nope" in err


def test_long_plan_string_and_unwritable_output(capsys, tmp_path):
    """A plan string too long to be a file name is parsed as a plan (not stat-ed as a
    path), and an output the OS refuses is one line and exit 2, not a traceback."""
    shares = ":".join(["2"] * 256)
    code, _, err = run(capsys, "simulate", "--plan", f"mb_shares={shares}")
    assert code == 2 and "mb_shares" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "simulate", "--nodes", "1", "--trace", str(tmp_path / "no" / "t.json"))
    assert code == 2 and "No such file" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, names", [
    ([], "cmd"),
    (["compare", "x"], "invalid choice: 'compare'"),
    (["simulate", "--plan"], "--plan: expected one argument"),
    (["report", "--plans", "dp=2"], "required: --out"),
])
def test_usage_errors_are_one_line(argv, names, capsys):
    """A command-line usage error (no subcommand, an unknown one, an option without its
    value, a required option missing) exits 2 with one line on stderr that names the
    problem and where help is, not argparse's usage block."""
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "--help)" in err and err.startswith("plansim")


@pytest.mark.parametrize("argv,needle", [
    (["--noise", "nan"], "--noise: nan: must be a finite number in [0, 0.5]"),
    (["--noise", "-1"], "--noise: -1.0: must be a finite number in [0, 0.5]"),
    (["--seed", "-1"], "--seed: -1: must be an integer in [0, 2**63)"),
    (["--seed", "99999999999999999999999"], "--seed: 99999999999999999999999: must be an integer"),
    (["--scenario", ""], "--scenario: empty path"),
    (["--noise", "0.1"], "--noise: applies to --adaptive runs only"),
    (["--seed", "7", "--steps", "3"], "--seed: applies to --adaptive runs only"),
], ids=["noise-nan", "noise-negative", "seed-negative", "seed-1e23", "scenario-empty", "noise-unused", "seed-unused"])
def test_multistep_flag_values_checked_on_a_single_step(capsys, tmp_path, argv, needle):
    """--noise and --seed are checked even on a one-step simulate (where they go unused),
    and an empty --scenario is refused, not taken as no scenario: exit 2, one line, no
    report written. Before: all five were accepted silently (--scenario '' ran 20 steps of
    an empty scenario; --noise nan was refused only together with --steps). A valid --noise
    or --seed without --adaptive, which nothing would use, is refused too."""
    out = tmp_path / "r"
    code, _, err = run(capsys, "simulate", "--nodes", "1", "--model", "tiny", *argv, "--report", str(out))
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not out.exists()


def test_uncalibrated_gpu_gets_a_note(capsys, tmp_path):
    """A GPU that runs on the generic 'default' efficiencies (L40S has a datasheet entry but no
    efficiency of its own; V100's entry sets only sm_count) gets one note line on stderr and
    still simulates; a calibrated one (A100, H100) and the CPU get none. A --profile that
    gives L40S a gemm_eff_max of its own silences it."""
    from costmodel.profile import load_profile, uncalibrated_gpus
    prof = load_profile(None)
    assert uncalibrated_gpus(prof, ["A100-SXM4-80GB", "H100-SXM5-80GB", "H200", "CPU"]) == []
    assert uncalibrated_gpus(prof, ["V100-SXM2-32GB", "L40S", "A100-SXM4-80GB"]) == ["L40S", "V100-SXM2-32GB"]
    code, out, err = run(capsys, "simulate", "pcie-l40s", "--model", "gpt3-125m", "--plan", "dp=64", "--json")
    assert code == 0 and json.loads(out)["step_time_s"] > 0
    assert err.count("\n") == 1 and "no calibrated efficiency for L40S" in err
    code, _, err = run(capsys, "simulate", "dgx-a100", "--model", "gpt3-125m", "--plan", "dp=8", "--nodes", "1")
    assert code == 0 and "no calibrated" not in err
    # Bad input on such a cluster is still one line: the note waits for success.
    code, _, err = run(capsys, "simulate", "pcie-l40s", "--model", "gpt3-125m", "--plan", "dp=8")
    assert code == 2 and err.count("\n") == 1 and "no calibrated" not in err
    own = tmp_path / "l40s.yaml"
    own.write_text("name: mine\ngpus:\n  L40S: {gemm_eff_max: 0.6}\n")
    code, _, err = run(capsys, "simulate", "pcie-l40s", "--model", "gpt3-125m", "--plan", "dp=64",
                       "--profile", str(own), "--json")
    assert code == 0 and "no calibrated" not in err


def test_search_that_cannot_fit_at_any_scale_answers_at_once(capsys, tmp_path):
    """A model whose state alone (ZeRO-3 over 64 x the cluster) exceeds a GPU: the 'smallest
    change' says so from that floor instead of searching every doubled cluster (an at-limits
    model took 47 s). 96 layers of width 131,072: ~2e13 parameters, 16 B each over 512 A100s
    is ~580 GiB per GPU."""
    m = tmp_path / "m.yaml"
    m.write_text("name: wide\nnum_layers: 96\nhidden_size: 131072\nnum_attention_heads: 128\n"
                 "seq_length: 2048\nvocab_size: 51200\nglobal_batch_size: 64\n")
    code, _, err = run(capsys, "search", "dgx-a100", "--nodes", "1", "--model", str(m))
    assert code == 2 and err.count("\n") == 1
    assert "no node count up to 64 (64 x) fits either: the model state alone needs" in err
