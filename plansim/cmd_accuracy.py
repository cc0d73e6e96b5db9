"""`plansim accuracy`: simulate every published training run and compare.

    plansim accuracy [--json] [--profile FILE] [--runtime NAME] [--report DIR] [--rows CSV] [--jobs N]

Each row of the published-runs table (validate/data/published_runs.csv by default) is
simulated with its own model, plan and topology and the bundled profile of its GPU type,
fabric and framework; prints predicted vs published and the error per row, then the mean
absolute percentage error (MAPE) and the Spearman rank correlation over the BLOOM sweep.
"""
from __future__ import annotations

import json
import os
import sys


def _print_row(r) -> None:
    print(f"  simulated {r.row.run_id}", file=sys.stderr, flush=True)


def register(subparsers) -> None:
    p = subparsers.add_parser("accuracy", help="predicted vs published figures of published training runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--profile", help="profile YAML (or bundled name) merged over every row's bundled profiles")
    p.add_argument("--report", metavar="DIR", help="write index.html, report.md, accuracy.png, accuracy.csv")
    p.add_argument("--rows", metavar="CSV", help="published-runs table (default: the project's copy)")
    from plansim.cli import add_runtime_arg
    add_runtime_arg(p, default=None)
    p.add_argument("--jobs", type=int, default=None,
                   help="processes to simulate rows in (default: CPU count, at most 4)")
    p.set_defaults(func=cmd_accuracy)


def accuracy_text(res) -> str:
    from tabulate import tabulate

    from reports.accuracy import summary_lines
    rows = [[r.row.run_id, f"{r.published:.2f}", f"{r.predicted:.2f}", f"{100 * r.error:+.1f} %", r.plan]
            for r in res.rows]
    table = tabulate(rows, headers=["run", "published", "predicted", "error", "plan"], tablefmt="simple",
                     disable_numparse=True)
    return table + "\n\n" + "\n".join(summary_lines(res))


def cmd_accuracy(args) -> int:
    from costmodel.errors import InputError
    from validate.accuracy import run_accuracy

    jobs = args.jobs if args.jobs is not None else min(os.cpu_count() or 1, 4)
    if jobs < 1:
        raise InputError("--jobs", None, f"must be a positive integer (got {jobs})")
    if args.report is not None:  # checked before any row is simulated
        from reports.accuracy import FILES
        from reports.files import check_outputs
        from validate.accuracy import DEFAULT_ROWS
        check_outputs([("--report", args.report, FILES)],
                      [("--rows", args.rows or DEFAULT_ROWS), ("--profile", args.profile)])
    show = not args.json and sys.stderr.isatty()
    res = run_accuracy(args.rows, profile=args.profile, progress=_print_row if show else None, jobs=jobs,
                       runtime=args.runtime)
    if args.report:
        from reports.accuracy import write_accuracy_report
        from reports.files import staged
        with staged():  # a write that fails leaves no folder this run created
            write_accuracy_report(args.report, res)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(accuracy_text(res))
        if args.report:
            print(f"report written to {args.report}/index.html")
    return 0
