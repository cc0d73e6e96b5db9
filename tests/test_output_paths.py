"""Output paths (hostile sweep C1-C5, D4): every output path of a command is checked before
any work, for real: writable (a file is created and removed there), none of the command's
input files, not the same as or inside another output, a report folder's own files writable
names. A bad one is one line on stderr naming the path and the flag, exit 2, and nothing is
written; a write that still fails later leaves none of the command's outputs behind and names
the user's path and flag, not a temporary. Files are written with the umask's mode."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from plansim.cli import main

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "validate" / "data" / "published_runs.csv"
SIM = ["simulate", "--nodes", "1", "--model", "gpt3-125m", "--global-batch", "8"]


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(code, err, *needles):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ".tmp" not in err, err  # the user's path, never a temporary's
    for needle in needles:
        assert needle in err, (needle, err)


def _snapshot(folder: Path) -> dict:
    """Every entry under `folder`: a file's bytes, mode and mtime, a folder's mode (a folder's
    mtime moves when the up-front check creates and removes its probe file there)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = ((None, st.st_mode) if p.is_dir() else
                                           (p.read_bytes(), st.st_mode, st.st_mtime_ns))
    return out


def _runs_csv(path: Path, rows: int) -> Path:
    """The published-runs table's comment and header lines and its first `rows` rows."""
    lines = RUNS.read_text().splitlines(keepends=True)
    head = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    path.write_text("".join(lines[:head + 1 + rows]))
    return path


def _no_work(monkeypatch):
    """Fail the test if a simulation, search, sweep, accuracy run or fit starts."""
    import search.sweep
    import sim.metrics
    import validate.accuracy
    import validate.fit_runs

    def no_work(*_, **__):
        raise AssertionError("work started before the output paths were checked")
    monkeypatch.setattr(sim.metrics, "simulate", no_work)
    monkeypatch.setattr(search.sweep, "run_sweep", no_work)
    monkeypatch.setattr(validate.accuracy, "run_accuracy", no_work)
    monkeypatch.setattr(validate.fit_runs, "fit_surrogates", no_work)


def _inputs(d: Path) -> dict[str, Path]:
    from specs.model import PRESETS
    files = {"topo": d / "in.yaml", "model": d / "m.yaml", "plan": d / "p.yaml", "profile": d / "prof.yaml",
             "scenario": d / "s.yaml", "grid": d / "g.yaml"}
    shutil.copy(ROOT / "topologies" / "dgx-a100.yaml", files["topo"])
    files["model"].write_text(yaml.safe_dump(dataclasses.asdict(PRESETS["tiny"])))
    files["plan"].write_text("tp: 1\npp: 1\n")
    files["profile"].write_text("{}\n")
    shutil.copy(ROOT / "scenarios" / "dp2-half-speed.yaml", files["scenario"])
    files["grid"].write_text("models: [tiny]\ntopologies: [dgx-a100]\nnodes: [1]\n")
    files["runs"] = _runs_csv(d / "r.csv", 3)
    return files


# argv (with {name} for the files of _inputs, {d} for the folder), the flag refused, the input named
CASES = [
    (["simulate", "{topo}", "--nodes", "1", "--model", "gpt3-125m", "--trace", "{topo}"], "--trace", "(topology)"),
    (["simulate", "--nodes", "1", "--model", "{model}", "--trace", "{model}"], "--trace", "(--model)"),
    (["simulate", "--nodes", "1", "--model", "tiny", "--plan", "{plan}", "--trace", "{plan}"], "--trace", "(--plan)"),
    (["simulate", "--nodes", "1", "--model", "tiny", "--profile", "{profile}", "--trace", "{profile}"],
     "--trace", "(--profile)"),
    (["simulate", "--nodes", "1", "--model", "tiny", "--scenario", "{scenario}", "--report", "{d}/rep"],
     "--report", "(--scenario)"),
    (["search", "{topo}", "--nodes", "1", "--model", "tiny", "--report", "{d}/rep"], "--report", "(topology)"),
    (["report", "--nodes", "1", "--model", "tiny", "--plans", "{plan}", "--out", "{d}/rep"], "--out", "(--plans)"),
    (["sweep", "{grid}", "--report", "{d}/rep"], "--report", "(grid)"),
    (["accuracy", "--rows", "{runs}", "--report", "{d}/rep"], "--report", "(--rows)"),
    (["calibrate", "--runs", "{runs}", "--folds", "2", "--out", "{runs}"], "--out", "(--runs)"),
    (["validate", "localhost-cpu", "--plan", "dp=2", "--profile", "{profile}", "--report", "{d}/rep"],
     "--report", "(--profile)"),
]
# Which report file the input is moved to, for the folder cases: a file the report writes.
TARGET = {"simulate": "report.md", "search": "index.html", "report": "plans.csv", "sweep": "sweep.csv",
          "accuracy": "accuracy.csv", "validate": "validation.json"}


@pytest.mark.parametrize("argv, flag, named", CASES, ids=[f"{c[0][0]}-{c[2].strip('()')}" for c in CASES])
def test_an_output_that_is_an_input_is_refused(capsys, tmp_path, monkeypatch, argv, flag, named):
    """C1: an output file that is one of the command's input files (topology, --model, --plan,
    --profile, --scenario, --plans, the sweep grid, --rows, --runs), or a report folder one of
    whose files is an input, is refused before any work: one line naming the path, the flag
    and the input, exit 2, every file byte for byte and mtime as it was. Before: the input was
    replaced by the trace, the report or the fitted profile, with exit 0."""
    files = _inputs(tmp_path)
    subs = {k: str(v) for k, v in files.items()}
    subs["d"] = str(tmp_path)
    argv = [a.format(**subs) for a in argv]
    if "--report" in argv or ("--out" in argv and argv[0] == "report"):
        # A folder output: put the input where the report would write one of its files.
        rep = tmp_path / "rep"
        rep.mkdir()
        used = next(Path(a) for a in argv if a in subs.values() and Path(a).is_file())
        moved = rep / TARGET[argv[0]]
        used.rename(moved)
        argv = [str(moved) if a == str(used) else a for a in argv]
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, *argv)
    _refused(code, err, f": {flag}: is an input of this command {named}; choose another file")
    assert _snapshot(tmp_path) == before


def test_links_to_an_input_are_refused_too(capsys, tmp_path, monkeypatch):
    """C1: the input reached another way (./name, a symbolic link, a hard link) is still the
    input: refused, nothing changed."""
    files = _inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    os.symlink("in.yaml", tmp_path / "sym.yaml")
    os.link(tmp_path / "m.yaml", tmp_path / "hard.yaml")
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    for argv in (["simulate", "in.yaml", "--nodes", "1", "--trace", "./in.yaml"],
                 ["simulate", "sym.yaml", "--nodes", "1", "--trace", "in.yaml"],
                 ["simulate", "in.yaml", "--nodes", "1", "--trace", "sym.yaml"],
                 ["simulate", "--nodes", "1", "--model", "m.yaml", "--trace", "hard.yaml"]):
        _refused(*_run(capsys, *argv)[::2], "--trace: is an input of this command")
    assert _snapshot(tmp_path) == before
    assert files["topo"].read_bytes() == (ROOT / "topologies" / "dgx-a100.yaml").read_bytes()


@pytest.mark.parametrize("trace, report", [("out/rr", "out/rr"), ("out/rd/index.html", "out/rd"),
                                           ("out/rd/t.json", "out/rd"), ("out/x", "out/x/r")],
                         ids=["same", "a-report-file", "inside-the-folder", "folder-inside-the-file"])
def test_two_outputs_that_overlap_are_refused(capsys, tmp_path, monkeypatch, trace, report):
    """C2: --trace and --report the same path, or one inside the other: refused before any
    work, one line naming both flags, nothing created. Before: `--report out/rr --trace out/rr`
    wrote the trace, then failed on the report and left the trace behind."""
    (tmp_path / Path(trace).parent).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, *SIM, "--trace", trace, "--report", report)
    _refused(code, err, "--trace", "--report")
    assert _snapshot(tmp_path) == before


def test_report_files_checked_before_the_trace_is_written(capsys, tmp_path, monkeypatch):
    """C3: a report folder whose index.html is a folder is refused up front, before any work
    and before the trace is written, naming the file and --report. Before: the trace was
    written, then the report failed saying 'nothing was written'."""
    (tmp_path / "out" / "rd" / "index.html").mkdir(parents=True)
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, *SIM, "--trace", tmp_path / "out" / "t1.json", "--report", tmp_path / "out" / "rd")
    _refused(code, err, f"{tmp_path / 'out' / 'rd' / 'index.html'}: --report: is a folder")
    assert _snapshot(tmp_path) == before


def _disk_full_at_index_html(monkeypatch) -> None:
    """Every write of a report's index.html (its temporary) fails as a full disk would."""
    real = Path.write_bytes

    def full(self, data):
        if self.name.startswith(".index.html."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, data)
    monkeypatch.setattr(Path, "write_bytes", full)


def test_a_late_write_failure_leaves_no_output(capsys, tmp_path, monkeypatch):
    """C3/C4: when writing the report still fails after the checks (here: the disk fills up
    while index.html is written), the trace written before it is not left behind, an earlier
    trace keeps its bytes, the report folder this run created is removed, and the one line
    names the report file and --report, not a temporary. Before: the trace stayed written."""
    _disk_full_at_index_html(monkeypatch)
    (tmp_path / "old.json").write_text("earlier trace")
    before = _snapshot(tmp_path)
    for trace in ("new.json", "old.json"):
        code, _, err = _run(capsys, *SIM, "--trace", tmp_path / trace, "--report", tmp_path / "a" / "rep")
        _refused(code, err, f"{tmp_path / 'a' / 'rep' / 'index.html'}: --report: cannot write: No space left")
        assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("argv, flag", [
    (["report", "--nodes", "1", "--model", "tiny", "--plans", "dp=8", "--out", "{d}/a/rep"], "--out"),
    (["simulate", "--nodes", "1", "--model", "tiny", "--steps", "2", "--report", "{d}/a/rep"], "--report"),
    (["search", "--nodes", "1", "--model", "tiny", "--top", "1", "--report", "{d}/a/rep"], "--report"),
], ids=["report", "simulate-steps", "search"])
def test_a_late_report_failure_leaves_no_folder(capsys, tmp_path, monkeypatch, argv, flag):
    """C3/C4: a report folder write that fails after the checks (the disk fills up) leaves
    nothing: no file, no temporary, not even the folders this run created; the one line names
    the report file and the flag."""
    _disk_full_at_index_html(monkeypatch)
    code, _, err = _run(capsys, *[a.format(d=tmp_path) for a in argv])
    _refused(code, err, f"{tmp_path / 'a' / 'rep' / 'index.html'}: {flag}: cannot write: No space left")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, flag, path", [
    (SIM + ["--trace", "/proc/t.json"], "--trace", "/proc/t.json"),
    (SIM + ["--report", "/proc/r"], "--report", "/proc/r"),
    (SIM + ["--report", "/sys/r"], "--report", "/sys/r"),
    (SIM + ["--trace", "{d}/t.json", "--report", "/proc/r"], "--report", "/proc/r"),
    (["calibrate", "--runs", "{d}/r.csv", "--folds", "2", "--out", "/proc/p.yaml"], "--out", "/proc/p.yaml"),
    (["accuracy", "--report", "/proc/r"], "--report", "/proc/r"),
    (["sweep", "{d}/g.yaml", "--report", "/sys/r"], "--report", "/sys/r"),
    (["report", "--nodes", "1", "--model", "tiny", "--plans", "dp=8", "--out", "/proc/r"], "--out", "/proc/r"),
], ids=["trace-proc", "report-proc", "report-sys", "trace-then-report-proc", "calibrate-out-proc",
        "accuracy-proc", "sweep-sys", "report-out-proc"])
def test_unwritable_locations_refused_before_any_work(capsys, tmp_path, monkeypatch, argv, flag, path):
    """C4: an output in a place no file can be created (/proc, /sys: even root cannot) is
    refused by the up-front check, which really creates and removes a file (or folder) there:
    before any work, one line naming the user's path and the flag, nothing written. Before:
    the check passed, the work ran, and the write failed naming a temporary
    (/proc/.t.json.3ptx10p4.tmp) and no flag."""
    if not Path(path).parent.is_dir():
        pytest.skip(f"no {Path(path).parent} here")
    _inputs(tmp_path)
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, *[a.format(d=tmp_path) for a in argv])
    _refused(code, err, f"{path}: {flag}: cannot write in ")
    assert _snapshot(tmp_path) == before


def test_write_errors_name_the_flag_and_path_not_the_temporary(capsys, tmp_path, monkeypatch):
    """C4: a write that fails after the checks names the user's file and its flag: `t.json:
    --trace: cannot write: ...`, exit 2, no temporary left."""
    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
    monkeypatch.setattr(Path, "write_bytes", full)
    code, _, err = _run(capsys, *SIM, "--trace", tmp_path / "t.json")
    _refused(code, err, f"{tmp_path / 't.json'}: --trace: cannot write: No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=["022", "077", "002"])
def test_written_files_take_the_umask_mode(capsys, tmp_path, mask):
    """C5: the trace, every report file and a calibrated profile get 0o666 less the umask
    (0644 under umask 022), as any file the user creates would. Before: always 0600
    (mkstemp's temporaries, renamed into place)."""
    old = os.umask(mask)
    try:
        code, _, err = _run(capsys, *SIM, "--trace", tmp_path / "t.json", "--report", tmp_path / "rep")
        assert code == 0, err
        code, _, err = _run(capsys, "calibrate", "--runs", _runs_csv(tmp_path / "r.csv", 3), "--folds", "2",
                            "--out", tmp_path / "p.yaml")
        assert code == 0, err
    finally:
        os.umask(old)
    written = [tmp_path / "t.json", tmp_path / "p.yaml", *(tmp_path / "rep").iterdir()]
    assert len(written) == 6
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(0o666 & ~mask) for p in written}


def test_valid_outputs_still_written(capsys, tmp_path):
    """The checks refuse only what would clobber or fail: --trace and --report both written
    (the probe files leave nothing behind), a report folder holding input files it does not
    overwrite is fine, and an existing trace is replaced."""
    rep = tmp_path / "rep"
    rep.mkdir()
    files = _inputs(rep)
    (tmp_path / "t.json").write_text("old")
    code, out, err = _run(capsys, "simulate", files["topo"], "--nodes", "1", "--model", files["model"],
                          "--trace", tmp_path / "t.json", "--report", rep)
    assert code == 0, err
    assert "trace written to" in out and "report written to" in out
    assert (tmp_path / "t.json").read_text().startswith('{"traceEvents"')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep", "t.json"]
    names = sorted(p.name for p in rep.iterdir())
    assert {"index.html", "report.md", "plans.csv", "trace.json", "in.yaml", "m.yaml"} <= set(names)
    assert not [n for n in names if n.startswith(".")]
    assert files["topo"].read_bytes() == (ROOT / "topologies" / "dgx-a100.yaml").read_bytes()


@pytest.mark.parametrize("rows, folds, needle", [
    (1, None, "r.csv: --runs: k-fold cross-validation needs at least 2 rows; the file has 1"),
    (1, "2", "r.csv: --runs: k-fold cross-validation needs at least 2 rows; the file has 1"),
    (2, "5", "--folds: 5: must be at most 2 (rows in "),
    (3, "4", "--folds: 4: must be at most 3 (rows in "),
    (3, "1", "--folds: 1: must be an integer in [2, 3]"),
], ids=["1-row", "1-row-folds-2", "2-rows-folds-5", "3-rows-folds-4", "folds-1"])
def test_calibrate_runs_folds_named_against_the_rows(capsys, tmp_path, monkeypatch, rows, folds, needle):
    """D4: a runs file with fewer than 2 rows says k-fold needs at least 2 and how many it has;
    --folds above the rows says 'at most <rows> (rows in FILE)'; nothing fitted or written.
    Before: '--folds: 5: must be an integer in [2, 1]'."""
    csv = _runs_csv(tmp_path / "r.csv", rows)
    _no_work(monkeypatch)
    before = _snapshot(tmp_path)
    code, _, err = _run(capsys, "calibrate", "--runs", csv, "--out", tmp_path / "p.yaml",
                        *(["--folds", folds] if folds else []))
    _refused(code, err, needle)
    assert _snapshot(tmp_path) == before


def test_calibrate_runs_default_folds_fit_the_rows(capsys, tmp_path):
    """D4: without --folds, a 2-row runs file is cross-validated with 2 folds (min(5, rows))
    and the profile is written. Before: refused with '--folds: 5: must be an integer in [2, 2]'."""
    code, out, err = _run(capsys, "calibrate", "--runs", _runs_csv(tmp_path / "r.csv", 2), "--out",
                          tmp_path / "p.yaml", "--json")
    assert code == 0, err
    assert json.loads(out)["folds"] == 2 and (tmp_path / "p.yaml").is_file()


def test_calibrate_runs_refuses_flags_it_would_not_use(capsys, tmp_path):
    """calibrate --runs fits each row on that row's own cluster: a TOPOLOGY or --world given
    with it would go unused (both were ignored silently), as would --memory-model (a
    microbenchmark fit); refused, one line, nothing written."""
    from plansim.cli import main
    out = tmp_path / "p.yaml"
    for extra, flag in ((["localhost-cpu"], "TOPOLOGY"), (["--world", "0"], "--world"),
                        (["--memory-model", "cache"], "--memory-model")):
        rows = str(Path(__file__).resolve().parent.parent / "validate/data/published_runs.csv")
        assert main(["calibrate", *extra, "--runs", rows, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag}: applies to microbenchmark calibration" in err
        assert not out.exists()
