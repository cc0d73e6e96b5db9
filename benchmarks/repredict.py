"""Re-predict saved CPU validation runs with this tree's model: the measurements stay fixed.

    python3 benchmarks/repredict.py [--launch-aggregate mean|median | --refit] [--memory-model cache] [--stage-scales] [--pool] [--first-launches K | --draw-launches K] [--no-drift] [--no-call-drift] [--no-call-anchor] RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is what benchmarks/validate_cpu.sh wrote: validation.json (the measured
steps, the plans, the host-speed probe of each run) and cpu-w<N>.yaml (the profile
calibrated at N processes, used for the plans of N processes). Every plan is simulated
again with its run's profile, slowed or sped up by the drift factor this tree would take
from the run's speed probes (validate/probe.validation_drift; run_drift), and compared with the same
measured median step time.

What it is for: a change to the simulator or the cost model can be tried against every
run already measured (results/validate-cpu-*/) in a second instead of a new five-minute
benchmark, and the table shows the saved prediction beside the new one. It does not
replace a fresh run: the profiles were calibrated by the code of their day, and a change
to calibration itself needs new measurements (or a refit of the saved .bench.json).

--launch-aggregate refits each run's profiles from its saved microbenchmarks
(cpu-w<N>.bench.json) with the rows timed in several launches merged by the mean or the
median of their launches (validate/microbench.with_launch_aggregate), the fit itself
unchanged (validate/calibrate.profile_from_bench): the same measurements calibrated two
ways. Runs whose .bench.json has no launch samples (calibrated before 2026-12-01) are
refused.

The last line counts the runs that have all six of the issue's plans
(benchmarks/validation_runs.SIX) and how many of them had, and now have, all six within
15 % (the order of the plans is benchmarks/validation_runs.py's to check).

--refit refits each run's profiles from its saved microbenchmarks with this tree's
calibration (validate/calibrate.profile_from_bench), launches as calibrate merged them: a
change to the fit tried on measurements already taken. The figures fitted to a record's
own draws are refitted too (validate/microbench.fit_draw_figures): FSDP's unit cost
always, the alive law where the record keeps the MiB held at each depth (records from
session 16 on; older ones keep their saved alive figures). --memory-model cache (with
--refit) fits the element-wise ops as `plansim calibrate --memory-model cache` would;
--stage-scales (with --refit) adds the stage scales fitted to the record's split draws as
`plansim calibrate --stage-scales` would (records from session 26 on; none in older ones);
--pool (with --refit) pools each profile's compute samples with the run's other
calibration records first, as `plansim calibrate --pool` does (validate/pool.py).

--first-launches K (with --refit) refits as if each calibration had run only its first K
collective launches (validate/microbench.with_first_launches): the rows timed in more
launches merged over their first K, the speed-probe and overhead-chain draws of the later
launches dropped; --draw-launches K drops only those draws, every row kept as timed. What a
shorter calibration would have predicted, tried on the runs already measured.
--no-call-drift predicts every plan with its profile's collective call costs as
calibrated, where the run was saved with call probes and the profile has their calibrated
figure (call_probe_us; from session 28 on, or any record with --refit): what the validator
predicted before the call probe (docs/validation-cpu.md mechanism 59).
--no-call-anchor scales the call costs by the probes' ratio to the calibrated figure, not
to the profile's own price of that row (validate/probe.anchored_call_factor; mechanism
61): what the validator predicted in sessions 28-31.
--no-drift predicts every plan with its profile as calibrated, ignoring the speed probe's
drift factor the run applied (what `plansim validate --no-drift-correction` would have
predicted): whether the probe's correction helped those runs.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.errors import InputError  # noqa: E402
from costmodel.limits import MAX_DEVICES, number_problem  # noqa: E402
from costmodel.yamlio import read_text  # noqa: E402
from validate.compare import short_plan as short  # noqa: E402

TOPOLOGY = "localhost-cpu"


def load_run(path: Path) -> dict:
    """validation.json of a results directory, checked before anything uses it: the plans a
    non-empty list of mappings, each with a plan string, a process count and finite positive
    step times (NaN and Infinity, which Python's json accepts, refused)."""
    f = path / "validation.json"
    src = str(f)
    if not f.exists():
        raise InputError(src, "file", "missing: expected benchmarks/validate_cpu.sh's output")

    def no_constant(name):
        raise InputError(src, "file", f"{name} is not a number; expected finite numbers")
    try:
        data = json.loads(read_text(f, src, "validation.json"), parse_constant=no_constant)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:  # ValueError: integers of 4,300+ digits
        raise InputError(src, "file", f"not JSON ({type(e).__name__})") from None
    plans = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(plans, list) or not plans:
        raise InputError(src, "plans", "expected a non-empty list of validated plans")
    for i, p in enumerate(plans):
        if not isinstance(p, dict):
            raise InputError(src, f"plans[{i}]", f"expected a mapping, got {type(p).__name__}")
        for key in ("plan", "world", "measured_step_time_s", "predicted_step_time_s"):
            if key not in p:
                raise InputError(src, f"plans[{i}].{key}", "missing")
        if not isinstance(p["plan"], str) or not p["plan"].strip():
            raise InputError(src, f"plans[{i}].plan", "expected a plan string (tp=..,pp=..)")
        problem = number_problem(p["world"], 1, MAX_DEVICES, integer=True)
        if problem:
            raise InputError(src, f"plans[{i}].world", f"{str(p['world'])[:40]}: {problem}")
        times = [(k, p[k]) for k in ("measured_step_time_s", "predicted_step_time_s", "measured_p10_s",
                                     "measured_p90_s") if k in p]
        medians = p.get("launch_medians_s") or []
        if not isinstance(medians, list):
            raise InputError(src, f"plans[{i}].launch_medians_s", "expected a list of seconds")
        times += [(f"launch_medians_s[{j}]", v) for j, v in enumerate(medians)]
        sections = {}  # the speed and call probes: each a mapping with [before, after] pairs a launch
        for name in ("speed_probe", "call_probe"):
            sec = p.get(name) or {}
            if not isinstance(sec, dict):
                raise InputError(src, f"plans[{i}].{name}", "expected a mapping")
            pairs = sec.get("launches_s") or []
            if not isinstance(pairs, list) or not all(isinstance(x, list) and len(x) == 2 for x in pairs):
                raise InputError(src, f"plans[{i}].{name}.launches_s", "expected a list of [before, after] seconds")
            times += [(f"{name}.launches_s[{j}][{k}]", v) for j, x in enumerate(pairs) for k, v in enumerate(x)]
            sections[name] = (sec, pairs)
        probe, launches = sections["speed_probe"]
        if probe.get("applied"):
            times.append(("speed_probe.drift_factor", probe.get("drift_factor")))
        if launches and probe.get("calibrated_s"):  # 0: a profile calibrated without the probe
            times.append(("speed_probe.calibrated_s", probe.get("calibrated_s")))
        for key, v in times:
            problem = number_problem(v, 0.0, math.inf, lo_open=True, hi_open=True)
            if problem:
                raise InputError(src, f"plans[{i}].{key}", f"{str(v)[:40]}: {problem}")
    return data


AGGREGATES = ("mean", "median")


def refit_profile(path: Path, world: int, aggregate: str | None, cluster, memory_model: str = "bandwidth",
                  scales: bool = False, pool: bool = False, first: tuple[int, bool] | None = None):
    """The profile of ``path``'s cpu-w<world>.bench.json, refitted by this tree's
    calibration (element-wise ops by ``memory_model``, validate/calibrate.fit_memory), with
    its launches merged by ``aggregate`` (AGGREGATES) when given; ``pool``: its compute
    samples pooled with those of the run's other cpu-w<N>.bench.json (validate/pool.py,
    as `plansim calibrate --pool` does); ``first`` (K, rows): every record cut to its first K
    collective launches first (validate/microbench.with_first_launches; rows False: only
    the speed-probe and overhead-chain draws)."""
    from validate.calibrate import fitted_profile, profile_from_bench
    from validate.bench_record import bench_record_path, load_bench
    from validate.microbench import fit_draw_figures, with_first_launches, with_launch_aggregate

    def read(f):
        got = load_bench(f, "file")
        return with_first_launches(got, first[0], first[1]) if first else got

    bench_file = bench_record_path(path / f"cpu-w{world}.yaml")
    res = fit_draw_figures(read(bench_file))  # this tree's fits of the record's own draws
    where = f"refit of {bench_file}"
    if first:
        where += f", its first {first[0]} collective launches" + ("" if first[1] else "' draws")
    if pool:
        from validate.pool import pooled_compute
        others = [(read(f), str(f)) for f in sorted(path.glob("cpu-w*.bench.json")) if f != bench_file]
        if not others:
            raise InputError(str(path), "--pool", "needs a second calibration record (cpu-w<N>.bench.json) to pool with")
        res = pooled_compute(res, str(bench_file), others)
        where += f", compute pooled with {', '.join(Path(o).name for _, o in others)}"
    if aggregate is not None:
        if not res.launch_samples:
            raise InputError(str(bench_file), "launch_samples", "absent: calibrated before each launch was kept")
        res = with_launch_aggregate(res, statistics.fmean if aggregate == "mean" else statistics.median)
        where += f", launches merged by the {aggregate}"
    _, mapping = profile_from_bench(cluster, res, where, memory_model, scales)
    return fitted_profile(cluster, mapping, where)


def repredict(path: Path, aggregate: str | None = None, drift: bool = True,
              refit: bool = False, memory_model: str = "bandwidth",
              scales: bool = False, pool: bool = False,
              call_drift: bool = True, call_anchor: bool = True,
              first: tuple[int, bool] | None = None) -> list[tuple[str, int, float, float, float]]:
    """(plan, processes, measured s, saved prediction s, new prediction s) per plan;
    ``refit`` or ``aggregate``: refit each profile (refit_profile) first, ``aggregate``
    merging its launches; ``drift`` False: the profile unscaled by the run's speed probe;
    ``call_drift`` False: its call costs unscaled by the run's call probes (a run saved
    with them and a profile with call_probe_us: validate/probe.call_drift, as the
    validator applies it); ``call_anchor`` False: that factor not anchored to the profile's
    price of the probe's row (validate/probe.anchored_call_factor), as the validator
    predicted before session 32."""
    from costmodel.profile import load_profile
    from plansim.cmd_calibrate import resolve_world
    from sim.core_sharing import slowed_calls, slowed_profile
    from validate.probe import call_factors
    from sim.metrics import simulate
    from specs.model import load_model
    from specs.plan import resolve_plan

    model = load_model("tiny")
    out = []
    profiles = {}  # world -> its profile: each refitted (or read) once, not once a plan
    rows = load_run(path)["plans"]
    prepared = []
    for i, p in enumerate(rows):
        world = int(p["world"])
        prof_file = path / f"cpu-w{world}.yaml"
        if not prof_file.exists():
            raise InputError(str(prof_file), "file", f"missing: the profile for the {world}-process plans")
        cluster, _ = resolve_world(TOPOLOGY, world, "--world", "")
        try:
            plan = resolve_plan(p["plan"], model, cluster.num_devices)
        except InputError as e:  # name the saved file, not --plan
            raise InputError(str(path / "validation.json"), f"plans[{i}].plan", f"{e.field or ''} {e.message}".strip()) from None
        if world not in profiles:
            profiles[world] = (refit_profile(path, world, aggregate, cluster, memory_model, scales, pool, first)
                               if aggregate or refit else load_profile(str(prof_file), bundled=cluster.profiles))
        prepared.append((plan, cluster, profiles[world]))
    calls = [f for f, _ in call_factors([((p.get("call_probe") or {}).get("launches_s") or [], profile, cluster)
                                         for p, (_, cluster, profile) in zip(rows, prepared)], call_anchor)]
    for i, (p, (plan, cluster, profile), call_f) in enumerate(zip(rows, prepared, calls)):
        factor = run_drift(rows, i) if drift else None
        profile = slowed_profile(profile, factor) if factor else profile
        sim = simulate(model, plan, cluster, slowed_calls(profile, call_f) if call_drift and call_f else profile)
        out.append((p["plan"], int(p["world"]), float(p["measured_step_time_s"]), float(p["predicted_step_time_s"]),
                    float(sim.step_time_s)))
    return out


def run_drift(plan_rows: list[dict], i: int) -> float | None:
    """The drift factor this tree's validator would apply to plan ``i`` of a saved run:
    one for the whole run from every plan's launch probes (speed_probe.launches_s, each
    over its calibrated probe: validate/probe.validation_drift); runs saved without launch
    probes keep the factor each plan applied."""
    from validate.probe import validation_drift
    probes = [p.get("speed_probe") or {} for p in plan_rows]
    pooled = validation_drift([(pr.get("launches_s") or [], float(pr.get("calibrated_s") or 0.0) * 1e6)
                               for pr in probes])
    if pooled is not None:
        return pooled
    return probes[i].get("drift_factor") if probes[i].get("applied") else None


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    aggregate, drift, refit = None, True, False
    if "--no-drift" in argv:
        drift, argv = False, [a for a in argv if a != "--no-drift"]
    call_drift = "--no-call-drift" not in argv
    call_anchor = "--no-call-anchor" not in argv
    argv = [a for a in argv if a not in ("--no-call-drift", "--no-call-anchor")]
    if "--refit" in argv:
        refit, argv = True, [a for a in argv if a != "--refit"]
    from costmodel.profile import MEMORY_MODELS
    memory_model = MEMORY_MODELS[0]
    if "--memory-model" in argv:
        i = argv.index("--memory-model")
        memory_model = argv[i + 1] if i + 1 < len(argv) else ""
        if memory_model not in MEMORY_MODELS:
            raise InputError("--memory-model", None, f"{memory_model[:40]!r}: allowed: {', '.join(MEMORY_MODELS)}")
        if not refit:
            raise InputError("--memory-model", None, "needs --refit (the saved profiles were fitted already)")
        argv = argv[:i] + argv[i + 2:]
    scales = "--stage-scales" in argv
    if scales:
        if not refit:
            raise InputError("--stage-scales", None, "needs --refit (the saved profiles were fitted already)")
        argv = [a for a in argv if a != "--stage-scales"]
    pool = "--pool" in argv
    if pool:
        if not refit:
            raise InputError("--pool", None, "needs --refit (the saved profiles were fitted already)")
        argv = [a for a in argv if a != "--pool"]
    first = None
    for flag, rows_too in (("--first-launches", True), ("--draw-launches", False)):
        if flag in argv:
            i = argv.index(flag)
            value = argv[i + 1] if i + 1 < len(argv) else ""
            if not value.isdigit() or int(value) < 1:
                raise InputError(flag, None, f"{value[:40]!r}: a whole number of launches, at least 1")
            if not refit or first:
                raise InputError(flag, None, "needs --refit, and only one of --first-launches, --draw-launches")
            first, argv = (int(value), rows_too), argv[:i] + argv[i + 2:]
    if argv and argv[0].startswith("--launch-aggregate"):
        _, _, value = argv[0].partition("=")
        if not value:
            value, argv = (argv[1] if len(argv) > 1 else ""), argv[1:]
        if value not in AGGREGATES:
            raise InputError("--launch-aggregate", None, f"must be {' or '.join(AGGREGATES)} (got {value!r})")
        aggregate, argv = value, argv[1:]
    errors: dict[str, list[float]] = {}
    if not argv:
        raise InputError("repredict", "RESULTS_DIR", "give at least one results directory")
    runs = [(d, repredict(d, aggregate, drift, refit, memory_model, scales, pool, call_drift, call_anchor, first))
            for d in map(Path, argv)]  # every input checked before printing
    print(f"{'run':24s} {'plan':26s} {'procs':>5} {'measured ms':>11} {'saved':>8} {'now':>8}")
    for d, rows in runs:
        for plan, world, measured, saved, now in rows:
            err = lambda x: 100.0 * (x / measured - 1.0)  # noqa: E731
            print(f"{d.name[:24]:24s} {short(plan)[:26]:26s} {world:>5} {measured * 1e3:>11.1f} "
                  f"{err(saved):>+7.1f}% {err(now):>+7.1f}%")
            errors.setdefault(short(plan), []).append(err(now))
    print()
    print(f"{'plan':26s} {'runs':>4} {'mean error':>10} {'largest |error|':>15} {'beyond 15 %':>11}")
    for plan, errs in errors.items():
        print(f"{plan[:26]:26s} {len(errs):>4} {statistics.fmean(errs):>+9.1f}% {max(map(abs, errs)):>14.1f}% "
              f"{sum(abs(e) > 15 for e in errs):>11}")
    saved_met, now_met, complete = six_within(runs)
    if complete:
        print(f"\nthe six within 15 % (benchmarks/validation_runs.SIX): "
              f"saved {saved_met} of {complete} runs, now {now_met} of {complete}")
        met = [m for m in (six_met(d, rows) for d, rows in runs) if m is not None]
        print(f"the six within 15 % and in the order the runs tell apart (benchmarks/validation_runs.py's "
              f"target): saved {sum(m[0] for m in met)} of {len(met)} runs, now {sum(m[1] for m in met)} of {len(met)}")
    return 0


def six_met(path: Path, rows) -> tuple[bool, bool] | None:
    """(saved, new) predictions of the run in ``path`` meet the target on the six: each
    within 15 % and the six in the order of every pair the run's launch medians tell apart
    (benchmarks/validation_runs.run_scores over the saved plans with the predictions
    swapped in); None where the run lacks one of the six. ``rows``: repredict's, in the
    order of the run's plans."""
    from benchmarks.validation_runs import SIX, comparisons, run_scores
    plans = load_run(path)["plans"]
    if not set(SIX) <= {short(r[0]) for r in rows}:
        return None
    met = []
    for i in (3, 4):
        swapped = [dict(p, predicted_step_time_s=r[i]) for p, r in zip(plans, rows)]
        six = run_scores(comparisons({"plans": swapped}))[1]
        met.append(bool(six and six["within"] == len(SIX) and six["resolved_order"]))
    return met[0], met[1]


def six_within(runs) -> tuple[int, int, int]:
    """(runs whose saved predictions put all of the issue's six plans within 15 % of their
    measurements, runs whose new ones do, runs that have all six) over ``runs``, the
    (dir, repredict rows) pairs main prints."""
    from benchmarks.validation_runs import LIMIT_PCT, SIX
    saved_met = now_met = complete = 0
    for _, rows in runs:
        by = {short(plan): (measured, saved, now) for plan, _, measured, saved, now in rows}
        if not all(s in by for s in SIX):
            continue
        complete += 1
        within = lambda i: all(abs(100.0 * (by[s][i] / by[s][0] - 1.0)) <= LIMIT_PCT for s in SIX)  # noqa: E731
        saved_met += within(1)
        now_met += within(2)
    return saved_met, now_met, complete


def run_cli(entry) -> None:
    """Exit with ``entry(argv)``'s code; an input error is one line on stderr and exit 2
    (the benchmarks' scripts that read saved runs share this)."""
    try:
        sys.exit(entry(sys.argv[1:]))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # output piped into head and the like
        sys.exit(0)


if __name__ == "__main__":
    run_cli(main)
