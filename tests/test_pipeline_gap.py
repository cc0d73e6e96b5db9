"""benchmarks/pipeline_gap.py: the rank correlation it reports (validate.accuracy.spearman),
against Spearman's formula worked by hand, and its refusal of too few runs."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import pipeline_gap as pg  # noqa: E402


def test_spearman_matches_the_textbook_formula():
    """rho = 1 - 6 sum d^2 / (n (n^2 - 1)) without ties: ranks 0,1,2,3 against 0,2,1,3
    differ by 0,1,1,0, so rho = 1 - 6*2/(4*15) = 0.8; a reversed order gives -1."""
    assert pg.spearman([10, 20, 30, 40], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert pg.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_too_few_runs_is_an_error(tmp_path, capsys):
    """Fewer than three usable runs: exit 2 and one line, not a correlation of nothing."""
    assert pg.main([str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_gaps_are_each_pipeline_error_less_dp2s(tmp_path, capsys):
    """Three hand-made runs: each row is dp=2's step and error, then 1F1B's and GPipe's
    error less dp=2's (run a: -8 - (+2) = -10 pt, -3 - (+2) = -5 pt), sorted by dp=2's
    step; a folder without all three plans is skipped. The steps 100, 120, 140 ms against
    1F1B gaps -4, -10, -1 give ranks 0,1,2 against 1,0,2: rho = 1 - 6*2/(3*8) = 0.5."""
    import json
    full = "tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,precision=fp32"
    runs = {"a": (0.120, 2.0, -8.0, -3.0), "b": (0.100, 2.0, -2.0, -1.0), "c": (0.140, -1.0, -2.0, 0.0)}
    for name, (step, dp, f1, gp) in runs.items():
        d = tmp_path / "s" / name
        d.mkdir(parents=True)
        plans = [{"plan": full, "measured_step_time_s": step, "error_pct": dp},
                 {"plan": "tp=1,pp=2,dp=1,mbs=1,schedule=1f1b,precision=fp32", "measured_step_time_s": 1, "error_pct": f1},
                 {"plan": "tp=1,pp=2,dp=1,mbs=1,schedule=gpipe,precision=fp32", "measured_step_time_s": 1, "error_pct": gp}]
        (d / "validation.json").write_text(json.dumps({"plans": plans}))
    (tmp_path / "s" / "d").mkdir()
    (tmp_path / "s" / "d" / "validation.json").write_text(json.dumps({"plans": [
        {"plan": full, "measured_step_time_s": 0.1, "error_pct": 0.0}]}))
    assert pg.main([str(tmp_path / "s" / n) for n in "abcd"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in out[1:4]]
    assert [r[0] for r in rows] == ["s/b", "s/a", "s/c"]
    assert [(r[3], r[4]) for r in rows] == [("-4.0pt", "-3.0pt"), ("-10.0pt", "-5.0pt"), ("-1.0pt", "+1.0pt")]
    assert "1F1B's gap +0.500" in out[-1]
