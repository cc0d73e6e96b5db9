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
