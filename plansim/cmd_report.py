"""`plansim report`: compare given plans, or search, and write the report folder.

    plansim report [TOPOLOGY] [--nodes N] [--model M] [--profile F]
                   [--plans P1 P2 ...] [--search] [--top K] --out DIR

With --plans every plan is simulated and ranked (plans that fit first, then by tokens/s);
without --plans, or with --search, the plan search runs and its ranked plans are
reported (given plans are merged in). The best plan and the runner-up are simulated
again with their timelines recorded, for the Gantt charts and the Chrome trace.
"""
from __future__ import annotations

from pathlib import Path

from plansim.cli import _add_common, _load_inputs
from sim.result import SearchResult, StepResult


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="compare plans (or search) and write index.html, report.md, plans.csv, trace.json")
    _add_common(p)
    p.add_argument("--plans", nargs="+", metavar="PLAN", default=None,
                   help="plans to compare (k=v,... strings or plan YAML files); put TOPOLOGY before this")
    p.add_argument("--search", action="store_true", help="run the plan search (the default when no --plans)")
    p.add_argument("--top", type=int, default=10, help="plans the search simulates and reports (default 10)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the report into")
    p.set_defaults(func=cmd_report)


def rank_results(results: list[StepResult]) -> list[StepResult]:
    """Plans that fit first, then highest tokens/s; ties broken by the plan string."""
    return sorted(results, key=lambda r: (not r.fits_memory, -r.tokens_per_s, r.plan))


def merge_into(ranked: list[StepResult], extra: list[StepResult]) -> list[StepResult]:
    """Insert `extra` results into an already ranked list without reordering it (the search
    has its own ranking, e.g. a margin against lossy compression): each goes before the
    first result it beats by (fits in memory, tokens/s). Plans already present are skipped."""
    out = list(ranked)
    have = {r.plan for r in out}
    for r in extra:
        if r.plan in have:
            continue
        key = (not r.fits_memory, -r.tokens_per_s)
        pos = next((i for i, q in enumerate(out) if key < (not q.fits_memory, -q.tokens_per_s)), len(out))
        out.insert(pos, r)
        have.add(r.plan)
    return out


def record_top(sr: SearchResult, model, cluster, profile, count: int = 2) -> SearchResult:
    """Re-simulate the first `count` ranked plans with their timelines recorded.

    The engine is deterministic, so the recorded results carry the same numbers; they
    replace the unrecorded ones in place so that the report can draw their Gantt charts.
    """
    from sim.metrics import simulate
    from specs.plan import resolve_plan

    for i, r in enumerate(sr.ranked[:count]):
        if not r.segments:
            plan = resolve_plan(r.plan, model, cluster.num_devices)
            sr.ranked[i] = simulate(model, plan, cluster, profile, record=True)
    return sr


def write_search_report(out_dir: str | Path, sr: SearchResult, model, cluster, profile) -> list[Path]:
    """What `search --report DIR` should call: record the top two, then write the report."""
    from reports.report import write_report

    return write_report(out_dir, record_top(sr, model, cluster, profile))


def cmd_report(args) -> int:
    from sim.metrics import simulate
    from specs.plan import resolve_plan

    from plansim.cmd_search import check_counts, input_files, run_search
    from reports.files import check_outputs, staged
    from reports.report import FILES, TRACE

    check_counts(args)
    out, = check_outputs([("--out", args.out, (*FILES, TRACE))],
                         input_files(args) + [("--plans", p) for p in args.plans or []])
    cluster, model, profile = _load_inputs(args)
    # Resolve every plan before simulating anything: bad input fails fast, nothing written.
    plans = [resolve_plan(p, model, cluster.num_devices) for p in (args.plans or [])]
    results: dict[str, StepResult] = {}
    for plan in plans:
        key = plan.to_string()
        if key not in results:
            results[key] = simulate(model, plan, cluster, profile)
    if args.search or not plans:
        sr = run_search(args, model, cluster, profile, args.top)
        sr.ranked = merge_into(sr.ranked, list(results.values()))
    else:
        sr = SearchResult(topology=cluster.name, model=model.name, num_devices=cluster.num_devices,
                          ranked=rank_results(list(results.values())), pruned={})
    with staged():  # a write that fails leaves no folder this run created
        paths = write_search_report(out, sr, model, cluster, profile)
    best = sr.ranked[0]
    print(f"{len(sr.ranked)} plan(s) of {model.name} on {cluster.name} ({cluster.num_devices} devices); "
          f"best {best.plan}: {best.tokens_per_s:,.0f} tokens/s")
    print(f"report written to {out / 'index.html'} (also " + ", ".join(p.name for p in paths[1:]) + ")")
    return 0
