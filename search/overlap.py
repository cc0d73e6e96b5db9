"""Cross-step overlap in the search: the best synchronous plans are simulated again with
``overlap_step=layerwise`` (the next forward waits only for its own layers' update) and
``overlap_step=delayed`` (one-step-stale gradients), priced over consecutive steps by the
multi-step engine (sim/multistep.py). A delayed plan changes the optimisation (every
update is computed on weights one step old), which a step-time model cannot price, so
like top-k compression it ranks above a synchronous plan only when its step is at least
the lossy margin (search's ``compress_margin``, default 5 %) shorter."""
from __future__ import annotations

from dataclasses import replace

from sim.result import StepResult
from specs.plan import resolve_plan

# Synchronous plans whose overlap variants are simulated: the best one that fits (each
# variant costs a 3-step run, three single-step simulations).
OVERLAP_BASES = 1
MODES = ("layerwise", "delayed")


def is_stale(plan: str) -> bool:
    """Whether a plan string applies gradients one step late (changes the optimisation)."""
    return "overlap_step=delayed" in plan


def overlap_variants(results: list[StepResult], model, num_devices: int, modes=MODES) -> list[str]:
    """Plan strings of the overlap variants of the best OVERLAP_BASES fitting synchronous
    plans (ZeRO-3 gathers inside the step and has none; delayed needs dp > 1)."""
    out = []
    bases = [r for r in results if r.fits_memory and "overlap_step=" not in r.plan and "zero=3" not in r.plan]
    for r in bases[:OVERLAP_BASES]:
        plan = resolve_plan(r.plan, model, num_devices)
        for mode in modes:
            if mode == "delayed" and plan.dp == 1:
                continue
            out.append(replace(plan, overlap_step=mode).to_string())
    return out


def overlap_note(by_plan: dict[str, StepResult], variants: list[str], margin: float, model, num_devices: int) -> str:
    """One sentence on what cross-step overlap does to the best synchronous plan (the
    first variant's plan with overlap_step=none, written by Plan.to_string like every
    plan string the search keys its results by)."""
    if not variants:
        return ""
    plans = [resolve_plan(v, model, num_devices) for v in variants]
    base_plan = replace(plans[0], overlap_step="none").to_string()
    base = by_plan.get(base_plan)
    if base is None:
        return ""
    parts = []
    for v, plan in zip(variants, plans):
        if replace(plan, overlap_step="none").to_string() != base_plan:
            continue
        r = by_plan[v]
        gain = 1 - r.step_time_s / base.step_time_s
        mode = plan.overlap_step
        extra = "" if mode == "layerwise" else (
            f" (stale weights: needs > {margin:.0%} to rank above it; "
            f"{'it does' if gain > margin else 'it does not'})")
        parts.append(f"{mode} {gain:+.1%}{extra}")
    return (f"Cross-step overlap on the best synchronous plan ({base.step_time_s:.3f} s/step): "
            + ", ".join(parts) + ".")
