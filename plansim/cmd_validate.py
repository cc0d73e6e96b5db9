"""`plansim validate`: run plans for real and compare with the simulator's prediction.

    plansim validate TOPOLOGY --model M --plan P [--profile F] [--steps N] [--launches K] [--json] [--report DIR]
    plansim validate TOPOLOGY --model M --plans P1 P2 ... [--profile [W=]F ...]

Each plan runs in tp*pp*dp worker processes on this host (validate/runner.run_plan: real
torch.distributed, real timings) and is simulated on the topology sized to that many
devices with the profile (sim.metrics.simulate). Prints measured vs predicted median step
time, the error and the per-phase pairs; with several plans, the Spearman rank correlation
of predicted vs measured step times. ``--profile W=FILE`` gives the profile calibrated at
W processes (plansim calibrate --world W) to the plans of that size.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

from costmodel.errors import InputError


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="run plans for real and compare with the simulation")
    p.add_argument("topology", help="bundled topology name or YAML path (a single host, e.g. localhost-cpu)")
    p.add_argument("--model", default="tiny", help="model preset or YAML (default tiny)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--plan", help="one plan, k=v,... (processes = tp*pp*dp, dp defaults to 1)")
    g.add_argument("--plans", nargs="+", metavar="PLAN", help="several plans: also checks their ranking")
    p.add_argument("--profile", action="append", default=[], metavar="[WORLD=]FILE",
                   help="calibrated profile; WORLD=FILE applies it to plans of WORLD processes (repeatable)")
    from plansim.cli import add_runtime_arg
    add_runtime_arg(p, default=None)
    p.add_argument("--steps", type=int, default=10, help="measured steps per plan and launch (default 10)")
    p.add_argument("--launches", type=int, default=1,
                   help="run every plan this many times in fresh processes, pooling the steps (default 1): "
                        "one launch is one draw of where the processes and their threads land")
    p.add_argument("--shared-launches", dest="shared", action="store_true",
                   help="each launch runs all the plans of one process count one after another in one set "
                        "of processes (a start-up per world size and launch instead of per plan)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is abandoned")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="DIR", help="write a validation report (HTML, Markdown, traces)")
    p.add_argument("--no-drift-correction", dest="drift_correction", action="store_false",
                   help="predict with the profile as calibrated, not slowed or sped up by the speed probe "
                        "and the call probe timed before and after each run (validate/probe.py)")
    p.set_defaults(func=cmd_validate)


# validate/gpt.py computes in fp32 (torch's default dtype) whatever the plan says; the
# simulation must count the same bytes, so a plan without a precision is simulated in fp32.
RUNNER_PRECISION = "fp32"


def with_runner_precision(plan_text: str) -> dict:
    """The plan as a mapping, with precision fp32 when it names none (see RUNNER_PRECISION);
    a plan that names another precision is refused, as the runner would not honour it.
    Works on the mapping, so plan files and strings are treated alike."""
    from specs.plan import load_plan_mapping
    raw, src = load_plan_mapping(plan_text)
    got = raw.get("precision", RUNNER_PRECISION)
    if got != RUNNER_PRECISION:
        raise InputError(src, "precision", f"the validator's runner computes in {RUNNER_PRECISION}; got {str(got)[:60]!r}")
    return {**raw, "precision": RUNNER_PRECISION}


def profile_for(specs: list[str]) -> dict:
    """'FILE' -> {None: FILE}; 'W=FILE' -> {W: FILE}; a plan of W processes takes W's, else None's."""
    out: dict = {}
    for s in specs:
        head, sep, tail = s.partition("=")
        key = int(head) if sep and head.isdigit() else None
        if key is not None and not tail.strip():
            raise InputError("--profile", s[:60], "no file after '='; give WORLD=FILE")
        if key in out:  # the second would silently win
            what = f"world {key}" if key is not None else "all plans"
            raise InputError("--profile", s[:60], f"a second profile for {what} (first: {str(out[key])[:60]!r}); "
                             "give one per world size")
        out[key] = tail if key is not None else s
    return out


def validate_plans(topology: str, model_name: str, plans: list[str], profiles: dict, *, steps: int,
                   warmup: int, seed: int, timeout_s: float, record: bool, progress=None,
                   runtime: str | None = None, drift_correction: bool = True, launches: int = 1,
                   prepared: list | None = None, shared: bool = False):
    """Run and simulate every plan; the comparisons in the given order. With ``launches``
    > 1 every plan runs that many times in fresh processes, one pass over all the plans
    after another, and its record pools the passes' steps (RunRecord.pooled). ``shared``:
    each launch runs the plans of one process count one after another in one set of
    processes (validate.runner.run_plans), not a set per plan. ``prepared``:
    prepare_plans' result for these arguments where the caller already has it (each
    profile is then read once)."""
    from sim.metrics import simulate
    from specs.model import load_model
    from validate.backend import require_torch
    from sim.core_sharing import slowed_calls, slowed_profile
    from validate.compare import compare, predicted_saved_bytes, saved_activations
    from validate.profile_file import runtime_facts
    from validate.probe import call_factors, drift_factor, validation_drift

    model = load_model(model_name)
    if prepared is None:
        prepared = prepare_plans(topology, model_name, plans, profiles, runtime)
    require_torch()
    check_devices_match(topology, prepared)
    from validate.backend import pick_backend
    if pick_backend().kind == "cpu":
        check_host_memory(model, prepared)
    from validate.microbench import worker_threads_env
    from validate.runner import run_plan, run_plans

    bare = sorted({plan.num_devices for plan, _, _, path in prepared if not path})
    if progress and bare:
        # Uncalibrated predictions of a CPU host are far off (tiny dp=2 here: -24.5 % with
        # the bundled profile, within 6 % calibrated), so say how to calibrate first.
        ws = ", ".join(map(str, bare))
        cals = "; ".join(f"plansim calibrate {topology} --world {w} --model {model_name} --out cpu-w{w}.yaml"
                         for w in bare)
        flags = " ".join(f"--profile {w}=cpu-w{w}.yaml" for w in bare)
        progress(f"note: no --profile for the {ws}-process plans: they are predicted with the bundled "
                 f"profile, not this host's; calibrate first: {cals}; then {flags}")

    from validate.record import RunRecord

    runs: list[list] = [[] for _ in prepared]
    for k in range(launches):
        of = f", launch {k + 1} of {launches}" if launches > 1 else ""
        if shared:
            for world in dict.fromkeys(plan.num_devices for plan, *_ in prepared):
                idx = [i for i, (plan, *_) in enumerate(prepared) if plan.num_devices == world]
                if progress:
                    progress(f"running {len(idx)} plan(s) one after another in one set of {world} processes "
                             f"({warmup} warm-up + {steps} steps each{of}): "
                             + "; ".join(prepared[i][0].to_string() for i in idx))
                with worker_threads_env(world):
                    recs = run_plans(model, [prepared[i][0] for i in idx], steps=steps, warmup=warmup, seed=seed,
                                     timeout_s=timeout_s)
                for i, rec in zip(idx, recs):
                    runs[i].append(rec)
            continue
        for i, (plan, cluster, profile, prof_path) in enumerate(prepared):
            if progress:
                progress(f"running {plan.to_string()} in {plan.num_devices} processes "
                         f"({warmup} warm-up + {steps} steps{of}); profile {prof_path or 'default (uncalibrated)'}")
            with worker_threads_env(plan.num_devices):  # the threads calibration measured with
                runs[i].append(run_plan(model, plan, steps=steps, warmup=warmup, seed=seed, timeout_s=timeout_s))
    out = []
    records = [RunRecord.pooled(recs) for recs in runs]
    # One factor for the whole validation where every plan has its probes (probe.validation_drift);
    # a plan's own otherwise.
    pooled = validation_drift([(rec.launch_probes_s, profile.runtime.speed_probe_us)
                               for rec, (_, _, profile, _) in zip(records, prepared)])
    # The collectives' call costs: one factor for the plans of each profile, anchored to the
    # profile's own price of the probe's row (probe.call_factors).
    calls = call_factors([(rec.launch_call_probes_s, profile, cluster)
                          for rec, (_, cluster, profile, _) in zip(records, prepared)])
    for (plan, cluster, profile, prof_path), rec, (call_f, priced) in zip(prepared, records, calls):
        drift = pooled if pooled is not None else drift_factor(rec.speed_probe_s, profile.runtime.speed_probe_us)
        applied = drift_correction and drift is not None
        call_applied = drift_correction and call_f is not None
        predict_with = slowed_profile(profile, drift) if applied else profile
        sim = simulate(model, plan, cluster, slowed_calls(predict_with, call_f) if call_applied else predict_with,
                       record=record)
        # The run is the project's runner whatever the profile: its memory follows the
        # runner's facts (no dropout, gathered SP inputs saved), not the profile's framework.
        runner_rt = replace(profile.runtime, **runtime_facts("cuda" if rec.backend == "nccl" else "cpu"))
        saved = saved_activations(rec, predicted_saved_bytes(model, plan, runner_rt, rec.per_rank), plan)
        out.append(compare(rec, sim, drift=drift, drift_applied=applied,
                           calibrated_probe_s=profile.runtime.speed_probe_us * 1e-6, saved=saved,
                           drift_plans=len(prepared) if pooled is not None else 1, call_drift=call_f,
                           call_drift_applied=call_applied,
                           calibrated_call_probe_s=profile.runtime.call_probe_us * 1e-6,
                           priced_call_probe_s=priced))
    return out


def check_devices_match(topology: str, prepared: list) -> None:
    """The runs compute on the CPU (gloo) or on CUDA devices (nccl, validate/backend.py); a
    topology of other devices would set an A100's prediction beside a CPU's measurement, a
    comparison of nothing. InputError before anything runs: a CPU run needs a topology of
    CPU devices (localhost-cpu), a CUDA run one of GPUs."""
    from validate.backend import pick_backend
    kind = pick_backend().kind
    names = sorted({d.gpu.name for _, cluster, _, _ in prepared for d in cluster.devices})
    cpu = names == ["CPU"]
    if kind == "cpu" and not cpu:
        raise InputError(topology, "topology", f"the plans would run on this host's CPU (no CUDA device, or "
                         f"gloo chosen), but its devices are {', '.join(names)}: validate on localhost-cpu "
                         "(or a topology file of CPU devices), or on a machine with those GPUs")
    if kind == "cuda" and cpu:
        raise InputError(topology, "topology", "the plans would run on CUDA devices (nccl), but the topology's "
                         "devices are host CPUs: give the GPU node's topology, or PLANSIM_BACKEND=gloo")


def available_memory_bytes() -> float | None:
    """Memory this host can give new processes without swapping, bytes: the kernel's
    MemAvailable estimate (Linux /proc/meminfo, kB); None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_host_memory(model, prepared: list) -> None:
    """CPU runs: every process of a plan keeps its weights, gradients, optimizer state and
    activations in the host's memory, so a plan whose processes would hold more than the
    host has available is refused before it starts (it would be killed, or swap, part way
    in). What a process holds is the simulator's memory model under the runner's own
    facts (validate/profile_file.runtime_facts), its peak over the plan's devices, as the
    program holds it (no step is simulated); the plans of one validation run one after
    another, so each is checked alone."""
    from dataclasses import replace

    from sim.program import build_program
    from validate.profile_file import runtime_facts
    avail = available_memory_bytes()
    if avail is None:
        return
    for plan, cluster, profile, _ in prepared:
        runner = replace(profile, runtime=replace(profile.runtime, **runtime_facts("cpu")))
        prog = build_program(model, plan, cluster, runner)
        peak = max(sum(mem.values()) for pipe in prog.pipelines for mem in pipe.memory)
        need = peak * plan.num_devices
        if need > avail:
            def size(b: float) -> str:
                return f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"
            raise InputError("--plan", plan.to_string()[:80],
                             f"its {plan.num_devices} processes would hold about {size(need)} ({size(peak)} "
                             f"each by the memory model) where this host has {size(avail)} available: a "
                             f"smaller model, or a plan that splits it further")


def prepare_plans(topology: str, model_name: str, plans: list[str], profiles: dict, runtime: str | None = None):
    """Every input of validate_plans checked, before the first (slow) run: [(plan, cluster,
    profile, profile path)] in the given order; InputError on the first bad one."""
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from specs.model import load_model
    from specs.plan import plan_world_size, resolve_plan

    model = load_model(model_name)
    prepared = []
    for text in plans:  # check every input before the first (slow) run
        raw = with_runner_precision(text)
        world = plan_world_size(raw)
        cluster, _ = resolve_world(topology, world, "--plan", f"{text}: processes (tp*pp*dp) ")
        plan = resolve_plan(raw, model, cluster.num_devices)
        prof_path = profiles.get(world, profiles.get(None))
        profile = load_profile(prof_path, bundled=cluster.profiles, runtime=runtime)
        seen = next((t for t, (p, *_) in zip(plans, prepared) if p == plan), None)
        if seen is not None:  # the same plan twice would be run twice and ranked against itself
            raise InputError("--plans", text[:60], f"the same plan as {seen[:60]!r} ({plan.to_string()})")
        prepared.append((plan, cluster, profile, prof_path))
    worlds = sorted({c.num_devices for _, c, _, _ in prepared})
    for w in sorted(k for k in profiles if k is not None):
        if w not in worlds:  # a profile no plan would use is a mistake in the command
            raise InputError("--profile", f"{w}={profiles[w]}", f"no plan runs in {w} processes; "
                             f"the plans run in {', '.join(map(str, worlds))}")
    return prepared


def cmd_validate(args) -> int:
    from validate.compare import Ranking, format_comparison, format_ranking

    from costmodel.limits import MAX_SIM_STEPS, number_problem
    for flag, value, lo in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        problem = number_problem(value, lo, MAX_SIM_STEPS, integer=True)  # a real step each: bounded
        if problem:
            raise InputError(flag, None, f"{value}: {problem}")
    problem = number_problem(args.timeout, 0.0, 86_400.0, lo_open=True)
    if problem:
        raise InputError("--timeout", None, f"{args.timeout:g}: {problem} (seconds)")
    if not 1 <= args.launches <= 100:
        raise InputError("--launches", None, f"must be an integer from 1 to 100 (got {args.launches})")
    from validate.backend import check_worker_env
    check_worker_env()  # the workers' settings in the environment, before anything is printed
    benches = None
    plans = args.plans or [args.plan]
    if args.report is not None:
        from reports.files import check_outputs
        from reports.validation import load_benches
        from validate.bench_record import bench_record_path
        profiles = [("--profile", p) for p in profile_for(args.profile).values()]
        names = ("index.html", "report.md", "validation.csv", "validation.json",
                 *(f"trace-{i}-{kind}.json" for i in range(1, len(plans) + 1) for kind in ("measured", "simulated")))
        plan_flag = "--plans" if args.plans else "--plan"
        check_outputs([("--report", args.report, names)],
                      [("topology", args.topology), ("--model", args.model), *[(plan_flag, p) for p in plans],
                       *profiles, *[("--profile (its .bench.json record)", bench_record_path(p)) for _, p in profiles]])
        benches = load_benches(profile_for(args.profile))  # checked before the runs
    say = None if args.json else (lambda m: print(m, file=sys.stderr, flush=True))
    comps = validate_plans(args.topology, args.model, plans, profile_for(args.profile), steps=args.steps,
                           warmup=args.warmup, seed=args.seed, timeout_s=args.timeout,
                           record=bool(args.report), progress=say, runtime=args.runtime,
                           drift_correction=args.drift_correction, launches=args.launches, shared=args.shared)
    ranking = Ranking(comps)
    if args.report:
        from reports.files import staged
        from reports.validation import write_validation_report
        with staged():  # a write that fails leaves no folder this run created
            write_validation_report(args.report, ranking, profile_for(args.profile), benches)
    if args.json:
        d = comps[0].to_dict() if len(comps) == 1 else ranking.to_dict()
        print(json.dumps(d, indent=2))
        return 0
    for c in comps:
        print(format_comparison(c))
    if len(comps) > 1:
        print()
        print(format_ranking(ranking))
    if args.report:
        print(f"report written to {args.report}/index.html")
    return 0
