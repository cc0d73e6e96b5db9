"""`plansim search`: find the fastest parallel plans for a model on a cluster.

    plansim search [TOPOLOGY] [--nodes N] [--model M] [--profile F]
                   [--top K] [--json] [--report DIR] [--workers N]

Prints a ranked table (plan, step time, tokens/s, MFU, memory per GPU, bottleneck), what
was pruned and why, and the findings (heterogeneous split, compression decision). Each
plan string reproduces its row with `plansim simulate TOPOLOGY --plan PLAN`.
"""
from __future__ import annotations

import json

from costmodel.errors import InputError
from plansim.cli import _add_common, _load_inputs


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help="search parallel plans: prune, estimate, simulate the best")
    _add_common(p)
    p.add_argument("--top", type=int, default=10, help="plans to simulate and show (at least 10 are simulated)")
    p.add_argument("--json", action="store_true", help="print one JSON object ({ranked, pruned, ...})")
    p.add_argument("--report", metavar="DIR", help="write index.html, report.md, plans.csv, trace.json")
    p.add_argument("--workers", type=int, default=1, help="processes for the simulations (default 1)")
    p.set_defaults(func=cmd_search)


def search_table(result, top: int) -> str:
    from tabulate import tabulate

    rows = []
    for i, r in enumerate(result.ranked[:top], 1):
        rows.append([i, f"{r.step_time_s:.3f}", f"{r.tokens_per_s:,.0f}", f"{100 * r.mfu:.1f}",
                     f"{r.peak_memory_gib:.1f}", r.bottleneck, r.plan])
    return tabulate(rows, headers=["#", "step s", "tokens/s", "MFU %", "mem GiB", "bottleneck", "plan"],
                    tablefmt="simple", disable_numparse=True)


def search_text(result, top: int) -> str:
    lines = [f"plansim search: {result.model} on {result.topology} ({result.num_devices} devices)",
             f"{result.candidates:,} candidate plans, {sum(result.pruned.values()):,} pruned, "
             f"{result.estimated:,} estimated, {len(result.ranked)} simulated in {result.wall_s:.1f} s", ""]
    lines.append(search_table(result, top) if result.ranked else "no plan fits this cluster")
    if any("compress=topk" in r.plan for r in result.ranked[:top]):
        lines.append("(plans with top-k compression rank as if 5 % slower: the margin a lossy "
                     "gradient compression must buy)")
    if result.pruned:
        lines += ["", "pruned (reason: plans, e.g.)"]
        for reason, n in result.pruned.items():
            lines.append(f"  {reason}: {n:,}   e.g. {result.pruned_examples.get(reason, '')}")
    if result.notes:
        lines += ["", "findings"]
        lines += [f"  - {note}" for note in result.notes]
    return "\n".join(lines)


def cmd_search(args) -> int:
    from search.search import search

    if args.top < 1:
        raise InputError("--top", None, f"must be a positive integer (got {args.top})")
    if args.workers < 1:
        raise InputError("--workers", None, f"must be a positive integer (got {args.workers})")
    cluster, model, profile = _load_inputs(args)
    result = search(model, cluster, profile, top=args.top, workers=args.workers, progress=True,
                    record_best=bool(args.report))
    written = []
    if args.report:
        from reports.report import write_report
        best = result.ranked[0] if result.ranked else None
        written = write_report(args.report, result, best)
    if args.json:
        out = result.to_dict()
        out["ranked"] = out["ranked"][:args.top]
        print(json.dumps(out, indent=2))
    else:
        print(search_text(result, args.top))
        if written:
            print(f"\nreport written to {args.report}/index.html")
    return 0
