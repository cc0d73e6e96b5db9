"""The README's runtime example prints what plansim prints: its figures are parsed from the
README itself and compared with a fresh simulation, so a model change that moves them
fails here instead of leaving the README stale (both examples had drifted before this
test: 274.5 s quoted as 273.8, 22.76 s as 22.72)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from plansim.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_runtime_example_figures_match_a_fresh_simulation(capsys):
    """`plansim simulate dgx-h100 --nodes 8 --model llama3-70b --plan ...` and its fp8
    variant: step time (0.1 s), MFU (0.1 point) and peak memory (0.1 GiB) as the README's
    comment line quotes them."""
    text = README.read_text()
    m = re.search(r"plansim simulate (dgx-h100 --nodes 8 --model llama3-70b --plan (\S+))\n"
                  r"#  -> ([\d.]+) s/step, MFU ([\d.]+) %, ([\d.]+) GiB per GPU; with precision=fp8: ([\d.]+) s/step",
                  text)
    assert m, "the README's runtime example is gone or reworded: update this test with it"
    plan = m.group(2)
    step, mfu, gib, fp8_step = (float(m.group(i)) for i in range(3, 7))

    def run(p):
        assert main(["simulate", "dgx-h100", "--nodes", "8", "--model", "llama3-70b", "--plan", p, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    got = run(plan)
    assert got["step_time_s"] == pytest.approx(step, abs=0.05)
    assert 100 * got["mfu"] == pytest.approx(mfu, abs=0.05)
    assert got["peak_memory_gib"] == pytest.approx(gib, abs=0.05)
    assert run(plan + ",precision=fp8")["step_time_s"] == pytest.approx(fp8_step, abs=0.05)


def test_context_parallel_example_figures_match_a_fresh_simulation(capsys):
    """The README's context-parallel example (llama3-405b at 128k tokens on 2048 nodes):
    step time (0.01 s), MFU (0.1 point), peak memory (0.1 GiB) and its exposed cp time."""
    text = README.read_text()
    m = re.search(r"plansim simulate (dgx-h100 --nodes 2048 [^\n]*?)\s*\\\n\s*--plan (\S+)\n"
                  r"#  -> ([\d.]+) s/step, ([\d.]+) % MFU, ([\d.]+) GiB per GPU, exposed cp ([\d.]+) s", text)
    assert m, "the README's context-parallel example is gone or reworded: update this test with it"
    args = m.group(1).split() + ["--plan", m.group(2), "--json"]
    assert main(["simulate"] + args) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["step_time_s"] == pytest.approx(float(m.group(3)), abs=0.005)
    assert 100 * got["mfu"] == pytest.approx(float(m.group(4)), abs=0.05)
    assert got["peak_memory_gib"] == pytest.approx(float(m.group(5)), abs=0.05)
    assert got["exposed_comm_s"]["cp"] == pytest.approx(float(m.group(6)), abs=0.005)
