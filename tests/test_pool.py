"""Pooling calibrations' compute samples (validate/pool.py, `plansim calibrate --pool`):
what is averaged and what concatenated, worked by hand; that pooling a record with an
exact copy of itself changes no fitted figure; that the command rewrites both profiles
as the library fits them and refuses what does not pool with one line and exit 2,
leaving the profiles as they were."""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from costmodel.errors import InputError
from validate.bench_record import load_bench
from validate.pool import pool_profiles, pooled_compute

ROOT = Path(__file__).resolve().parents[1]
# Two calibrations of one 2-core host minutes apart (session 26, run d-3): world 2 and world
# 4, both timing compute in two processes at once.
RUN = ROOT / "results" / "validate-cpu-2026-12-06-s26" / "d-3"


def _run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    for w in (2, 4):
        for suffix in (".yaml", ".bench.json"):
            shutil.copy(RUN / f"cpu-w{w}{suffix}", d / f"cpu-w{w}{suffix}")
    return d


def _plansim(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "plansim", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_samples_are_averaged_and_draws_concatenated():
    """A GEMM both records timed takes the mean of their two times; the overhead chain's
    figure is the median of both records' draws together, the speed probe the median of
    both records' probe draws; the collectives stay the record's own."""
    a = load_bench(RUN / "cpu-w2.bench.json")
    b = load_bench(RUN / "cpu-w4.bench.json")
    out = pooled_compute(a, "a", [(b, "b")])
    g = a.gemm[0]
    other = next(x for x in b.gemm if (x.m, x.n, x.k, x.batch) == (g.m, g.n, g.k, g.batch))
    assert out.gemm[0].seconds == pytest.approx((g.seconds + other.seconds) / 2, rel=1e-12)
    assert len(out.gemm) == len(a.gemm)  # world 4's extra (tp=4) shapes are not world 2's to fit
    draws = a.overhead_draws + b.overhead_draws
    assert out.overhead_draws == draws
    assert out.overhead[1].seconds == pytest.approx(statistics.median(d[1] for d in draws), rel=1e-12)
    probes = [d for d in a.probe_draws_s + b.probe_draws_s if d > 0]
    assert out.probe_s == pytest.approx(statistics.median(probes), rel=1e-12)
    assert out.collectives == a.collectives and out.world == 2
    assert len(out.split_draws) == len(a.split_draws) + len(b.split_draws)


def test_pooling_with_an_exact_copy_changes_no_figure():
    """Every sample averaged with itself and every draw list doubled leaves every mean and
    median where it was: the profile fitted to the record pooled with its own copy equals
    the profile fitted to the record alone (two computations of one fit)."""
    from plansim.cmd_calibrate import resolve_world
    from validate.calibrate import profile_from_bench
    from validate.microbench import fit_draw_figures
    a = fit_draw_figures(load_bench(RUN / "cpu-w2.bench.json"))
    cluster, _ = resolve_world("localhost-cpu", 2)
    _, alone = profile_from_bench(cluster, a, "w")
    _, pooled = profile_from_bench(cluster, pooled_compute(a, "a", [(replace(a), "copy")]), "w")
    assert pooled["gpus"] == alone["gpus"]
    assert {k: v for k, v in pooled["runtime"].items() if k != "source"} == \
        {k: v for k, v in alone["runtime"].items() if k != "source"}


def test_other_conditions_do_not_pool():
    """A record whose compute ran with other threads per process is refused, naming that
    record and the field."""
    a = load_bench(RUN / "cpu-w2.bench.json")
    b = replace(load_bench(RUN / "cpu-w4.bench.json"), threads=2)
    with pytest.raises(InputError) as e:
        pooled_compute(a, "a.bench.json", [(b, "b.bench.json")])
    assert "b.bench.json" in str(e.value) and "threads" in str(e.value)


def test_command_rewrites_both_profiles_as_the_library_fits_them(tmp_path):
    """`plansim calibrate --pool` writes each profile as pool_profiles fits it (the same
    figures), leaves the records as measured, and names the pooled record in the source."""
    d = _run_dir(tmp_path)
    records = {w: (d / f"cpu-w{w}.bench.json").read_bytes() for w in (2, 4)}
    expected = {Path(p).name: m for p, _, m in pool_profiles([str(d / "cpu-w2.yaml"), str(d / "cpu-w4.yaml")])}
    p = _plansim("calibrate", "--pool", str(d / "cpu-w2.yaml"), str(d / "cpu-w4.yaml"))
    assert p.returncode == 0, p.stderr
    for w in (2, 4):
        got = yaml.safe_load((d / f"cpu-w{w}.yaml").read_text())
        assert got["gpus"] == expected[f"cpu-w{w}.yaml"]["gpus"]
        assert (d / f"cpu-w{w}.bench.json").read_bytes() == records[w]
    assert "pooled with cpu-w4.bench.json" in yaml.safe_load((d / "cpu-w2.yaml").read_text())["source"]
    # pooling again starts from the records: the same figures, one note in the source
    p = _plansim("calibrate", "--pool", str(d / "cpu-w2.yaml"), str(d / "cpu-w4.yaml"))
    again = yaml.safe_load((d / "cpu-w2.yaml").read_text())
    assert again["gpus"] == expected["cpu-w2.yaml"]["gpus"]
    assert again["source"].count("pooled with") == 1


@pytest.mark.parametrize("case,named", [
    ("one", "--pool"),
    ("world", "--world"),
    ("twice", "given twice"),
    ("threads", "threads"),
    ("nan", "probe_draws_s"),
    ("no-record", "bench.json"),
])
def test_hostile_pools_are_one_line_errors(tmp_path, case, named):
    """One profile, a measuring flag beside --pool, the same profile twice, a record of
    other conditions or with a non-finite probe draw, a profile without its record: each
    one line on stderr naming what is wrong, exit 2, no traceback, the profiles untouched."""
    d = _run_dir(tmp_path)
    w2, w4 = str(d / "cpu-w2.yaml"), str(d / "cpu-w4.yaml")
    before = (d / "cpu-w2.yaml").read_bytes()
    args = ["calibrate", "--pool", w2, w4]
    if case == "one":
        args = ["calibrate", "--pool", w2]
    elif case == "world":
        args += ["--world", "2"]
    elif case == "twice":
        args = ["calibrate", "--pool", w2, str(d / "." / "cpu-w2.yaml")]
    elif case in ("threads", "nan"):
        data = json.loads((d / "cpu-w4.bench.json").read_text())
        if case == "threads":
            data["threads"] = 3
        else:
            data["probe_draws_s"][1] = float("nan")
        (d / "cpu-w4.bench.json").write_text(json.dumps(data))
    elif case == "no-record":
        (d / "cpu-w4.bench.json").unlink()
    p = _plansim(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert named in lines[0]
    assert (d / "cpu-w2.yaml").read_bytes() == before
