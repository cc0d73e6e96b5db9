"""`plansim search`: find the fastest parallel plans for a model on a cluster.

    plansim search [TOPOLOGY] [--nodes N] [--model M] [--profile F]
                   [--top K] [--json] [--report DIR] [--workers N]
                   [--executor local|ray] [--address ADDR]

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
    p.add_argument("--workers", "--jobs", dest="workers", type=int, default=1,
                   help="processes for the simulations (default 1; with --executor ray: a local instance's CPUs)")
    from plansim.cmd_sweep import add_executor_args
    add_executor_args(p)
    p.add_argument("--validate", type=int, default=0, metavar="K",
                   help="run the top K plans for real on this host (plansim validate --shared-launches, in "
                        "fp32: one set of processes runs them one after another) and report the rank "
                        "correlation of predicted and measured step times")
    p.add_argument("--validate-steps", type=int, default=10, metavar="N", help="measured steps per validated plan")
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
    lines.append(search_table(result, top))
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


# A search simulates at most this many plans: beyond it the table is not read, and each
# simulation costs up to seconds. More workers than this buy nothing on any one machine.
MAX_TOP = 1_000
MAX_WORKERS = 256
# How far `search` looks for a cluster size that fits when nothing does: doubling the
# node count up to this factor.
MAX_SCALE = 64


def input_files(args) -> list[tuple[str, str | None]]:
    """(flag, value) of the inputs of _add_common's flags that may name files: no output may be
    one of them (reports.files.check_outputs)."""
    return [("topology", args.topology), ("--model", args.model), ("--profile", args.profile)]


def check_counts(args) -> None:
    """--top, --workers, --validate and --validate-steps in range (before any work).
    --validate K is 0 (off) or at most MAX_TOP; that K does not exceed the plans the search
    simulated is checked as soon as the search is done (validation_plans). Each validated
    step is a real step, bounded like `plansim validate --steps`."""
    from costmodel.limits import MAX_SIM_STEPS, number_problem

    for flag, value, lo, hi in (("--top", args.top, 1, MAX_TOP),
                                ("--workers", getattr(args, "workers", 1), 1, MAX_WORKERS),
                                ("--validate", getattr(args, "validate", 0), 0, MAX_TOP),
                                ("--validate-steps", getattr(args, "validate_steps", 1), 1, MAX_SIM_STEPS)):
        if number_problem(value, lo, hi, integer=True):
            raise InputError(flag, None, f"{value}: must be an integer in [{lo}, {hi}]")


def smallest_change(args, model, profile) -> str:
    """What would make a plan fit when none does: the fewest nodes (of this single-group
    topology) on which the search finds a plan, found by doubling --nodes and then scanning
    up from the last size that failed."""
    from costmodel.limits import MAX_NODES
    from search.search import best_estimated_plan
    from specs.topology import load_topology, topology_devices

    cluster = load_topology(args.topology, nodes=args.nodes)
    if len({(n.group, n.node_type) for n in cluster.nodes}) != 1 or len(cluster.groups()) != 1:
        return "a heterogeneous cluster cannot be scaled with --nodes; add nodes to its groups or use a smaller model"
    nodes = len(cluster.nodes)
    try:
        topology_devices(args.topology, nodes + 1)  # the file's checks for --nodes, nothing built
    except InputError as err:  # e.g. an explicit network, whose links name their nodes
        return f"it cannot be scaled with --nodes ({err.message}); use a smaller model or GPUs with more memory"

    # A floor no plan goes below: the model state alone (bf16 weights, 16-bit gradients,
    # the Adam states: the least any runtime keeps) sharded over every device, ZeRO-3. When even the largest cluster the doubling
    # would try cannot hold it, say so without searching each size (an at-limits model
    # took 47 s of searches to reach this answer).
    from costmodel.memory import model_state_bytes
    most = min(MAX_NODES, nodes * MAX_SCALE)
    devices = most * cluster.gpus_per_node
    floor = sum(model_state_bytes(float(model.total_params), devices, 3, grad_bytes=2).values())
    if floor > cluster.devices[0].gpu.mem_bytes:
        return (f"no node count up to {most} ({MAX_SCALE} x) fits either: the model state alone needs "
                f"{floor / 2**30:,.1f} GiB per GPU on {devices:,} GPUs; use a smaller model or GPUs with more memory")

    def fits(n: int) -> str | None:
        return best_estimated_plan(model, load_topology(args.topology, nodes=n), profile)

    lo, hi, plan = nodes, None, None
    while hi is None and lo * 2 <= min(MAX_NODES, nodes * MAX_SCALE):
        plan = fits(lo * 2)
        if plan is None:
            lo *= 2
        else:
            hi = lo * 2
    if hi is None:
        return (f"no node count up to {lo} ({MAX_SCALE} x) fits either; use a smaller model, a shorter "
                "sequence or GPUs with more memory")
    for n in range(lo + 1, hi) if hi - lo <= 8 else ():  # the fewest nodes, when cheap to find
        got = fits(n)
        if got is not None:
            hi, plan = n, got
            break
    return f"smallest change that fits: --nodes {hi} (e.g. {plan})"


def run_search(args, model, cluster, profile, top: int, **options):
    """The plan search (``options``: workers, progress); when nothing fits, an InputError
    (exit 2) saying why and naming the smallest change that would fit."""
    import importlib

    mod = importlib.import_module("search.search")
    try:
        return mod.search(model, cluster, profile, top=top, **options)
    except getattr(mod, "NoPlanFits", ()) as err:
        raise InputError(err.source, None, f"{err.message}; {smallest_change(args, model, profile)}") from None


def cmd_search(args) -> int:
    from plansim.cmd_sweep import executor_spec

    check_counts(args)
    spec = executor_spec(args.executor, args.workers, args.address)
    if args.report is not None:
        from reports.files import check_outputs
        from reports.report import FILES, TRACE
        check_outputs([("--report", args.report, (*FILES, TRACE))], input_files(args))
    cluster, model, profile = _load_inputs(args)
    result = run_search(args, model, cluster, profile, top=args.top, workers=args.workers, executor=spec,
                        progress=None,  # progress bars on a terminal only
                        record_best=bool(args.report))  # timelines only for a report
    # --validate's plans are chosen and checked before the report is written, so a bad
    # --validate leaves no report behind.
    chosen = validation_plans(args, result) if args.validate else None
    written = []
    if args.report:
        from reports.files import staged
        from reports.report import write_report
        with staged():  # a write that fails leaves no folder this run created
            written = write_report(args.report, result, result.ranked[0])
    ranking, skipped = validate_top(args, *chosen) if chosen else (None, [])
    if args.json:
        out = result.to_dict()
        out["ranked"] = out["ranked"][:args.top]
        if ranking is not None:
            out["validation"] = ranking.to_dict()
            out["validation"]["skipped"] = [{"plan": p, "reason": why} for p, why in skipped]
        print(json.dumps(out, indent=2))
    else:
        print(search_text(result, args.top))
        if written:
            print(f"\nreport written to {args.report}/index.html")
        if ranking is not None:
            from validate.compare import format_ranking
            print(f"\nvalidated the top {len(ranking.comparisons)} plans the runner implements, for real (fp32):")
            for plan, why in skipped:
                print(f"  skipped {plan}: {why}")
            print(format_ranking(ranking))
    return 0


def validation_plans(args, result):
    """The search's top K plans that the runner implements (plansim validate's path), with
    every input of their runs checked (plansim/cmd_validate.prepare_plans): (plans, [(plan,
    why skipped)], prepare_plans' result). Plans it cannot run (e.g. zero=3) are skipped and named. The runner
    computes in fp32 (plansim/cmd_validate.RUNNER_PRECISION), so each plan is validated,
    and re-simulated for its prediction, at that precision."""
    from plansim.cmd_validate import RUNNER_PRECISION, prepare_plans, profile_for
    from specs.model import DEFAULT_MODEL, load_model
    from specs.plan import resolve_plan
    from validate.runner import check_supported

    if not 1 <= args.validate <= len(result.ranked):
        raise InputError("--validate", None, f"{args.validate}: must be in [1, {len(result.ranked)}] "
                         f"(the plans the search simulated)")
    model_name = args.model or DEFAULT_MODEL
    model = load_model(model_name)
    plans, skipped = [], []
    for r in result.ranked:
        if len(plans) == args.validate:
            break
        text = ",".join(kv if not kv.startswith("precision=") else f"precision={RUNNER_PRECISION}"
                        for kv in r.plan.split(","))
        try:
            check_supported(model, resolve_plan(text, model, result.num_devices))
        except InputError as err:
            skipped.append((r.plan, str(err)))
            continue
        plans.append(text)
    if not plans:
        raise InputError("--validate", None, "the runner implements none of the plans the search simulated")
    prepared = prepare_plans(args.topology, model_name, plans, profile_for([args.profile] if args.profile else []))
    return plans, skipped, prepared


def validate_top(args, plans: list[str], skipped: list, prepared: list):
    """Run ``plans`` (validation_plans, whose checked inputs ``prepared`` are reused) for
    real and rank them: (Ranking, skipped)."""
    import sys
    from plansim.cmd_validate import profile_for, validate_plans
    from specs.model import DEFAULT_MODEL
    from validate.compare import Ranking

    say = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    comps = validate_plans(args.topology, args.model or DEFAULT_MODEL, plans,
                           profile_for([args.profile] if args.profile else []),
                           steps=args.validate_steps, warmup=2, seed=0, timeout_s=300.0, record=False, progress=say,
                           prepared=prepared, shared=True)
    return Ranking(comps), skipped
