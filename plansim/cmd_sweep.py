"""`plansim sweep`: search every cell of a grid of models x topologies x node counts and
compare the best plans in one report.

    plansim sweep GRID.yaml [--report DIR] [--json] [--executor local|ray] [--jobs N] [--address ADDR]

The grid (specs/sweep.py) is validated and every file it names is loaded before any search
starts; the output folder is checked first too, so bad input writes nothing.
"""
from __future__ import annotations

import json
import os

from costmodel.errors import InputError
from costmodel.limits import number_problem

from plansim.cmd_search import MAX_WORKERS as MAX_JOBS  # more processes buy nothing on one machine


def add_executor_args(p) -> None:
    """--executor, --address (shared with `plansim search`)."""
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="where tasks run: local processes (default) or Ray (pip install 'plansim[ray]')")
    p.add_argument("--address", default=None,
                   help="with --executor ray: a running Ray cluster ('auto' or ray://HOST:PORT); "
                        "default: start a local Ray instance")


def executor_spec(kind: str, jobs: int, address: str | None):
    """The ExecutorSpec of the flags, checked before any work (Ray installed, counts in range)."""
    from search.executor import ExecutorSpec, import_ray

    problem = number_problem(jobs, 1, MAX_JOBS, integer=True)
    if problem:
        raise InputError("--jobs", None, f"{jobs}: {problem}")
    spec = ExecutorSpec(kind, jobs, address)
    if kind == "ray":
        import_ray()
    return spec


# The files a sweep --report folder receives (reports/sweep.render), checked up front.
REPORT_FILES = ("index.html", "report.md", "sweep.csv", "scaling.png")


def grid_files(path: str, grid) -> list[tuple[str, str | None]]:
    """(what, path) of the grid file and every file it names (models, topologies, profiles;
    bundled names are not files and are skipped by the check)."""
    from pathlib import Path
    folder = Path(path).resolve().parent
    out: list[tuple[str, str | None]] = [("grid", path)]
    for c in grid.cells:
        out += [(f"{path}: models", str(folder / c.model_label)), (f"{path}: topologies", c.topology),
                (f"{path}: profiles", c.profile)]
    return list(dict.fromkeys(out))


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="search a grid of models x topologies x node counts; one report")
    p.add_argument("grid", help="sweep grid YAML (see docs/sweeps.md; example: sweeps/example.yaml)")
    p.add_argument("--report", metavar="DIR", help="write index.html, report.md, sweep.csv, scaling.png")
    p.add_argument("--json", action="store_true", help="print one JSON object ({cells: [...], ...})")
    p.add_argument("--jobs", type=int, default=None,
                   help="cells searched at once (local processes, or CPUs of a local Ray instance); "
                        "default: the CPU count")
    add_executor_args(p)
    p.set_defaults(func=cmd_sweep)


def sweep_text(result) -> str:
    from tabulate import tabulate

    from reports.sweep import TABLE, table_cells, findings

    rows = result.rows()
    cells = table_cells(rows)
    lines = [f"plansim sweep: {result.name} ({len(rows)} cells, {result.executor} executor, "
             f"{result.wall_s:.1f} s)", ""]
    lines.append(tabulate([[c[k] for k, _ in TABLE] for c in cells], headers=[h for _, h in TABLE],
                          tablefmt="simple", disable_numparse=True))
    lines += ["", "findings"] + [f"  - {f}" for f in findings(rows)]
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    from search.sweep import run_sweep
    from specs.sweep import load_grid

    from reports.files import check_outputs
    report = [("--report", args.report, REPORT_FILES)]
    check_outputs(report, [("grid", args.grid)])
    grid = load_grid(args.grid)
    check_outputs(report, grid_files(args.grid, grid))  # the files the grid names, before any search
    jobs = args.jobs if args.jobs is not None else min(os.cpu_count() or 1, len(grid.cells), MAX_JOBS)
    spec = executor_spec(args.executor, jobs, args.address)
    result = run_sweep(grid, spec, progress=None)  # a progress bar on a terminal only
    if args.report:
        from reports.files import staged
        from reports.sweep import write_sweep_report
        with staged():  # a write that fails leaves no folder this run created
            write_sweep_report(args.report, result)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(sweep_text(result))
        if args.report:
            print(f"\nreport written to {args.report}/index.html")
    return 0
