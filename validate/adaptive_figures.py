"""The figures of a slow-rank experiment (issue 10's "done when") and the simulator's
prediction of the same runs.

Three runs of one launch (validate/adaptive_run.run_adaptive_many), so they share the
processes and the host's load: ``unslowed`` (equal split, no slow rank), ``fixed`` (equal
split, one rank at speed F) and ``adaptive`` (the controller re-allocates every step).
With speeds s_i and the unslowed step T0 (every rank busy T0 on its equal share), the
whole work is world * T0 at full speed, so a perfect split finishes in
``ideal = T0 * world / sum(s_i)``: 4/3 T0 for one of two ranks at half speed. The fixed
split takes T0 / F on the slow rank (2 T0 at half speed). Integer units make the best
reachable split a little worse (16 samples at speeds (1, 0.5): (11, 5), 11/8 T0 = 1.375
T0); both are reported. Step figures are medians over the measured steps after the first
``settle`` (the controller's convergence), the same window in every run.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from costmodel.rebalance import balance, step_time_s


@dataclass(frozen=True)
class Figures:
    world: int
    slow_rank: int
    speed: float
    settle: int
    unslowed_s: float
    fixed_s: float
    ideal_s: float  # T0 * world / sum of speeds (4/3 T0 for one of two at half speed)
    integer_ideal_s: float  # the best integer split of the units, same linear model
    adaptive_s: float
    best_units: tuple[int, ...]  # the best integer split under the true speeds
    final_units: tuple[int, ...]  # the adaptive run's split at its last step

    @property
    def error_vs_ideal_pct(self) -> float:
        return 100.0 * (self.adaptive_s / self.ideal_s - 1.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(fixed_ratio=self.fixed_s / self.unslowed_s, ideal_ratio=self.ideal_s / self.unslowed_s,
                 integer_ideal_ratio=self.integer_ideal_s / self.unslowed_s,
                 adaptive_ratio=self.adaptive_s / self.unslowed_s, error_vs_ideal_pct=self.error_vs_ideal_pct)
        return d


def speeds_of(world: int, slow_rank: int, speed: float) -> list[float]:
    out = [1.0] * world
    out[slow_rank] = speed
    return out


def figures(unslowed, fixed, adaptive, settle: int) -> Figures:
    """The done-when figures from the three runs' records (AdaptiveRecord)."""
    t0 = unslowed.settled_median_s(settle)
    speeds = speeds_of(adaptive.world, adaptive.slow_rank, adaptive.speed)
    total = sum(adaptive.units[0])
    per_unit = [1.0 / s for s in speeds]  # in units of the unslowed per-unit time
    best = balance(per_unit, total)
    integer_ideal = t0 * step_time_s(best, per_unit) / (total / adaptive.world)
    return Figures(world=adaptive.world, slow_rank=adaptive.slow_rank, speed=adaptive.speed, settle=settle,
                   unslowed_s=t0, fixed_s=fixed.settled_median_s(settle),
                   ideal_s=t0 * adaptive.world / sum(speeds), integer_ideal_s=integer_ideal,
                   adaptive_s=adaptive.settled_median_s(settle), best_units=best, final_units=tuple(adaptive.units[-1]))


def format_figures(f: Figures) -> str:
    t0 = f.unslowed_s
    rows = [("unslowed (equal split)", f.unslowed_s), ("fixed equal split, slow rank", f.fixed_s),
            ("ideal rebalanced (world/sum speeds)", f.ideal_s),
            (f"best integer split {':'.join(map(str, f.best_units))}", f.integer_ideal_s),
            (f"adaptive (measured; ends at {':'.join(map(str, f.final_units))})", f.adaptive_s)]
    lines = [f"rank {f.slow_rank} at speed {f.speed:g} of {f.world}; medians over the steps after the first {f.settle}"]
    lines += [f"  {name:38s} {t * 1e3:8.1f} ms  {t / t0:5.2f} x unslowed" for name, t in rows]
    lines.append(f"  adaptive vs ideal: {f.error_vs_ideal_pct:+.1f} %")
    return "\n".join(lines)


def _plan(model, rec, units=None):
    """The plan a run executes: dp=world with ``units`` as microbatch shares, or a
    world-stage 1F1B pipeline with ``units`` as layers per stage; fp32, gradient reduction
    after backward (validate/adaptive_run.py)."""
    from specs.plan import resolve_plan
    d = {"mbs": rec.mbs, "overlap_grad_reduce": False, "precision": "fp32"}
    if rec.mode == "dp":
        d["dp"] = rec.world
        if units is not None:
            d["mb_shares"] = list(units)
    else:
        d.update(pp=rec.world, schedule="1f1b")
        if units is not None:
            d["layers"] = list(units)
    return resolve_plan(d, model, rec.world)


def slow_scenario(cluster, slow_rank: int | None, speed: float):
    """The scenario of a run: device ``slow_rank`` computes at ``speed`` from the first step
    (scenarios/dp2-half-speed.yaml for 1 at 0.5), validated like a scenario file."""
    from specs.scenario import ScenarioFile, empty_scenario, resolve_scenario
    from specs.validation import validate
    if slow_rank is None or speed == 1.0:
        return empty_scenario()
    raw = {"name": f"rank {slow_rank} at speed {speed:g}",
           "events": [{"kind": "compute_speed", "device": slow_rank, "factor": speed, "step": 1}]}
    return resolve_scenario(validate(ScenarioFile, raw, "--slow-rank"), cluster, "--slow-rank")


def predict_replay(model, rec, cluster, profile) -> list[float]:
    """Per measured step of ``rec`` (an AdaptiveRecord), the simulated time of a step
    with the allocation that step used, under the run's scenario (sim/multistep.py, one
    step: the real run starts every step after a barrier, so nothing crosses steps)."""
    from sim.multistep import simulate_steps
    scenario = slow_scenario(cluster, rec.slow_rank, rec.speed)
    cache: dict[tuple[int, ...], float] = {}
    for units in rec.units:
        key = tuple(units)
        if key not in cache:
            res = simulate_steps(model, _plan(model, rec, key), cluster, profile, 1, scenario)
            cache[key] = res.steps[0].step_time_s
    return [cache[tuple(u)] for u in rec.units]


def predict_adaptive(model, rec, cluster, profile) -> tuple[list[float], list[list[int]]]:
    """The simulator's own adaptive run of the same scenario (``plansim simulate --steps N
    --scenario --adaptive``: its controller sees noisy simulated busy times, never the
    speeds): per-step times and allocations, as many steps as ``rec`` measured."""
    from sim.adaptive_control import SimController
    from sim.multistep import simulate_steps
    plan = _plan(model, rec)
    res = simulate_steps(model, plan, cluster, profile, rec.steps, slow_scenario(cluster, rec.slow_rank, rec.speed),
                         SimController(model, plan, cluster, profile))
    return [s.step_time_s for s in res.steps], [list(s.mb_shares if rec.mode == "dp" else s.layers)
                                                for s in res.steps]


def sim_agreement(measured: list[float], predicted: list[float], settle: int) -> dict:
    """Median measured vs median predicted step over the steps after ``settle``, and the
    median of the per-step relative errors (predicted / measured - 1), in %."""
    m, p = measured[settle:], predicted[settle:]
    per_step = [100.0 * (b / a - 1.0) for a, b in zip(m, p)]
    med_m, med_p = statistics.median(m), statistics.median(p)
    return {"measured_s": med_m, "predicted_s": med_p, "error_pct": 100.0 * (med_p / med_m - 1.0),
            "median_step_error_pct": statistics.median(per_step)}
