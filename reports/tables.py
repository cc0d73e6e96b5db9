"""Tables derived from simulated plans: the ranked table (CSV / Markdown), the TP x PP
grid of best throughput, and utilisation per device group (GPU type).

Everything here is arithmetic on StepResult fields; nothing is simulated.
"""
from __future__ import annotations

import math

import pandas as pd

from sim.result import CATEGORIES, StepResult
from specs.plan import parse_plan_string

# Plan keys that `Plan.to_string()` omits when they hold their default value.
PLAN_DEFAULTS = {"cp": "1", "cp_comm": "ring", "vpp": "1", "sp": "false", "recompute": "none", "zero": "0", "compress": "none",
                 "allreduce": "ring", "precision": "bf16", "placement": "tp-pp-dp"}
PLAN_COLUMNS = ("tp", "cp", "pp", "dp", "mbs", "vpp", "schedule", "sp", "recompute", "zero", "compress",
                "allreduce", "precision", "placement", "cp_comm")

CSV_COLUMNS = (["rank", "plan", *PLAN_COLUMNS, "tokens_per_s", "step_time_s", "mfu", "hfu",
                "model_tflops_per_gpu", "hardware_tflops_per_gpu", *[f"{c}_s" for c in CATEGORIES],
                "bubble_fraction", "peak_memory_gib", "fits_memory", "memory_shortfall_gib",
                "bottleneck", "dp_algorithm"])


def plan_fields(plan: str) -> dict[str, str]:
    """'tp=8,pp=2,dp=8,mbs=1,schedule=1f1b' -> every plan key, defaults filled in.

    The plan strings come from `Plan.to_string()`, so they are well formed; list values
    (layers=10:14) stay as written.
    """
    out = dict(PLAN_DEFAULTS)
    for key, value in parse_plan_string(plan).items():
        out[key] = ":".join(value) if isinstance(value, list) else value
    return out


def plan_int(plan: str, key: str, default: int = 1) -> int:
    """One integer plan key (tp, pp, dp, ...) of a plan string."""
    try:
        return int(plan_fields(plan).get(key, default))
    except ValueError:
        return default


def ranked_frame(results: list[StepResult]) -> pd.DataFrame:
    """One row per plan in the given (ranked) order, raw numbers in SI units.

    Wall-clock times are left out on purpose: they differ between runs, and the report
    must be byte-identical for the same simulated inputs.
    """
    rows = []
    for i, r in enumerate(results, start=1):
        f = plan_fields(r.plan)
        row: dict = {"rank": i, "plan": r.plan}
        for key in PLAN_COLUMNS:
            row[key] = f.get(key, "")
        row.update({
            "tokens_per_s": r.tokens_per_s, "step_time_s": r.step_time_s,
            "mfu": r.mfu, "hfu": r.hfu,
            "model_tflops_per_gpu": r.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": r.hardware_tflops_per_gpu,
        })
        for cat in CATEGORIES:
            row[f"{cat}_s"] = r.breakdown.get(cat, 0.0)
        row.update({
            "bubble_fraction": r.bubble_fraction, "peak_memory_gib": r.peak_memory_gib,
            "fits_memory": r.fits_memory, "memory_shortfall_gib": r.memory_shortfall_gib,
            "bottleneck": r.bottleneck, "dp_algorithm": " ".join(r.dp_algorithm),
        })
        rows.append(row)
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def plans_csv(results: list[StepResult]) -> str:
    """The ranked table as CSV text (floats written with repr: exact and reproducible)."""
    return ranked_frame(results).to_csv(index=False, lineterminator="\n")


def tp_pp_grid(results: list[StepResult]) -> tuple[list[int], list[int], list[list[float]], list[list[str]]]:
    """Best tokens/s per (tp, pp) over plans that fit in memory.

    Returns (tp values, pp values, values[pp_index][tp_index], cell notes) where a value
    is NaN when no plan with that (tp, pp) fits; the note then says whether a plan with
    that shape was tried ('no fit') or not ('').
    """
    tps = sorted({plan_int(r.plan, "tp") for r in results})
    pps = sorted({plan_int(r.plan, "pp") for r in results})
    vals = [[math.nan] * len(tps) for _ in pps]
    notes = [[""] * len(tps) for _ in pps]
    for r in results:
        i, j = pps.index(plan_int(r.plan, "pp")), tps.index(plan_int(r.plan, "tp"))
        if r.fits_memory:
            if math.isnan(vals[i][j]) or r.tokens_per_s > vals[i][j]:
                vals[i][j] = r.tokens_per_s
            notes[i][j] = ""
        elif math.isnan(vals[i][j]):
            notes[i][j] = "no fit"
    return tps, pps, vals, notes


def group_utilisation(res: StepResult) -> dict[str, float]:
    """Per GPU type: busy time (compute + TP) over the step time, weighted by how many
    devices each simulated device stands for. Keys in first-seen device order."""
    busy: dict[str, float] = {}
    count: dict[str, int] = {}
    for d in res.devices:
        busy[d.gpu] = busy.get(d.gpu, 0.0) + d.busy_s * d.represents
        count[d.gpu] = count.get(d.gpu, 0) + d.represents
    if res.step_time_s <= 0:
        return {g: 0.0 for g in busy}
    return {g: busy[g] / (count[g] * res.step_time_s) for g in busy}


def device_groups(results: list[StepResult]) -> list[str]:
    """GPU types seen over all results, in first-seen order."""
    seen: list[str] = []
    for r in results:
        for d in r.devices:
            if d.gpu not in seen:
                seen.append(d.gpu)
    return seen
