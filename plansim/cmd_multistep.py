"""`plansim simulate --steps N [--scenario FILE] [--adaptive]`: many steps back to back
(sim/multistep.py). Registered as options of `simulate` (plansim/cli.py calls
add_arguments and, when a multi-step option is given, run)."""
from __future__ import annotations

import json

from costmodel.errors import InputError
from costmodel.limits import MAX_SIM_STEPS, number_problem

# The files a multi-step --report folder receives (reports/multistep.render), checked up front.
REPORT_FILES = ("index.html", "report.md", "steps.csv")


def add_arguments(sp) -> None:
    sp.add_argument("--steps", type=int, default=None,
                    help=f"simulate N consecutive steps in one run (1..{MAX_SIM_STEPS}; default 1, "
                         "or 20 with --scenario/--adaptive)")
    sp.add_argument("--scenario", metavar="FILE", help="scenario YAML: slow devices, slow links, stalls, "
                    "lost nodes at given steps (docs/scenarios.md; examples in scenarios/)")
    sp.add_argument("--adaptive", action="store_true",
                    help="re-plan during the run from observed per-device times (microbatch shares, "
                         "layer boundaries); also simulates the fixed plan and the unslowed cluster to compare")
    sp.add_argument("--noise", type=float, default=None, help="--adaptive: relative timing noise (default 0.02)")
    sp.add_argument("--seed", type=int, default=0, help="--adaptive: seed of the timing noise (default 0)")


def wanted(args) -> bool:
    return args.steps is not None or args.scenario is not None or args.adaptive


def check_values(args) -> None:
    """The multi-step flags' values, checked by `simulate` before any work whether or not a
    multi-step run is wanted: a bad --noise or --seed is refused even where it would go
    unused, and an empty --scenario is not taken as no scenario."""
    problem = None if args.noise is None else number_problem(args.noise, 0, 0.5)
    if problem:
        raise InputError("--noise", None, f"{args.noise}: {problem}")
    if not 0 <= args.seed < 2**63:
        raise InputError("--seed", None, f"{str(args.seed)[:60]}: must be an integer in [0, 2**63)")
    if args.scenario is not None and not args.scenario.strip():
        raise InputError("--scenario", None, "empty path; give a scenario file or a bundled scenario's name")
    if not args.adaptive:  # these only steer the adaptive controller; unused they would mislead
        for flag, given in (("--noise", args.noise is not None), ("--seed", args.seed != 0)):
            if given:
                raise InputError(flag, None, "applies to --adaptive runs only; add --adaptive or drop it")


def _check(args) -> int:
    steps = args.steps if args.steps is not None else 20
    for flag, value, problem in (("--steps", steps, number_problem(steps, 1, MAX_SIM_STEPS, integer=True)),
                                 ("--noise", args.noise, args.noise is not None and number_problem(args.noise, 0, 0.5))):
        if problem:
            raise InputError(flag, None, f"{value}: {problem}")
    if not 0 <= args.seed < 2**63:
        raise InputError("--seed", None, f"{args.seed}: must be an integer in [0, 2**63)")
    if args.trace is not None:
        raise InputError("--trace", None, "traces are written for one step; drop --trace or --steps/--scenario")
    return steps


def run(args, model, plan, cluster, profile) -> int:
    """Simulate, print (text or --json), write --report; exit code."""
    from reports.files import output_dir
    from sim.adaptive_control import ControllerSettings, SimController
    from sim.multistep import compare_runs, simulate_steps
    from specs.scenario import empty_scenario, load_scenario

    steps = _check(args)
    if args.report is not None:
        output_dir(args.report, "--report")
    scenario = load_scenario(args.scenario, cluster) if args.scenario else empty_scenario()
    late = [e for e in scenario.events if e.step is not None and e.step > steps]
    if late:  # it would never happen, and the run would look like the scenario's outcome
        e = late[0]
        raise InputError(scenario.source or str(args.scenario), f"events.{e.index}.step",
                         f"{e.step} is after the run's last step ({steps}, --steps); raise --steps or move the event")
    comparison = None
    if args.adaptive:
        settings = ControllerSettings(seed=args.seed, **({} if args.noise is None else {"noise": args.noise}))
        res = simulate_steps(model, plan, cluster, profile, steps, scenario,
                             SimController(model, plan, cluster, profile, settings))
        fixed = simulate_steps(model, plan, cluster, profile, steps, scenario)
        unslowed = simulate_steps(model, plan, cluster, profile, min(steps, 3))
        comparison = compare_runs(res, fixed, unslowed, scenario)
    else:
        res = simulate_steps(model, plan, cluster, profile, steps, scenario)
    if args.report:
        from reports.files import staged
        from reports.multistep import write_multistep_report
        with staged():  # a write that fails leaves no folder this run created
            write_multistep_report(args.report, res, comparison)
    if args.json:
        out = res.to_dict()
        if comparison is not None:
            out["comparison"] = comparison.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    print(summary(res, comparison))
    if args.report:
        print(f"report written to {args.report}/index.html")
    return 0


def summary(res, comparison=None) -> str:
    from tabulate import tabulate

    rows = []
    for st in res.steps:
        note = "; ".join(st.events + ([st.decision] if st.decision else []))
        rows.append([st.step, f"{st.step_time_s:.3f}", f"{st.tokens_per_s:,.0f}", _alloc(st.mb_shares),
                     _alloc(st.layers), f"{st.migration_s:.2f}" if st.migration_s else "", note[:90]])
    lines = [f"{res.model} on {res.topology}, plan {res.plan}, scenario '{res.scenario}'"
             f"{' (adaptive)' if res.adaptive else ''}",
             tabulate(rows, headers=["step", "time (s)", "tokens/s", "mb_shares", "layers", "migr. (s)", "events"]),
             f"{len(res.steps)} steps in {res.total_time_s:.3f} simulated s: {res.tokens_per_s:,.0f} tokens/s; "
             f"simulated in {res.sim_cpu_s:.2f} s CPU"]
    if res.stopped:
        lines.append(res.stopped)
    if comparison is not None:
        c = comparison
        lines.append(f"from step {c.from_step}: unslowed {c.unslowed_tokens_per_s:,.0f}, fixed plan "
                     f"{c.fixed_tokens_per_s:,.0f}, adaptive {c.adaptive_tokens_per_s:,.0f} tokens/s: "
                     + (f"recovers {c.recovered_frac:.1%} of the throughput the fixed plan lost (migration included)"
                        if c.recovered_frac is not None else
                        "the fixed plan lost no throughput (no scenario event slowed it): nothing to recover"))
    return "\n".join(lines)


def _alloc(units: list[int]) -> str:
    """Compact allocation: '96x16' for uniform, else up to 6 entries."""
    if len(set(units)) == 1:
        return f"{units[0]}x{len(units)}"
    text = ":".join(map(str, units[:6]))
    return text + (":..." if len(units) > 6 else "")
