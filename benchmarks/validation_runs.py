"""Score saved CPU validation runs against the validator's target, one line per run.

    python3 benchmarks/validation_runs.py [--table] RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is what benchmarks/validate_cpu.sh wrote (validation.json). For every
run, over all its plans and over the issue's six (dp=2; tp=2; pp=2 1F1B; pp=2 GPipe; dp=2
with top-k; pp=2 x dp=2 as the one 4-process combination): how many plans were predicted
within 15 % of their measured median step time, whether the prediction orders them
exactly as measured (strict), and whether it orders every pair the runs tell apart
(validate/compare.Ranking.resolved_order: the pair's launch medians do not overlap; runs
saved before launch medians were recorded fall back to each plan's p10..p90). The last
lines count the runs that met the target on the six: all within 15 % and in order, then
give each plan's mean, lowest and highest error over the runs and how often it missed.

The measurements and predictions are the saved ones; nothing is re-simulated
(benchmarks/repredict.py does that). --table prints, before the scores, a Markdown table
of every plan's measured / predicted median step time (ms) and error in each run, plans
in the first run's order.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.repredict import load_run, run_cli  # noqa: E402
from costmodel.errors import InputError  # noqa: E402
from validate.compare import Comparison, Ranking, short_plan  # noqa: E402

# The six plans, as short_plan writes them (pp=2 x dp=2: the 4-process combination).
SIX = ("dp=2", "tp=2", "pp=2,schedule=1f1b", "pp=2,schedule=gpipe", "dp=2,compress=topk:0.1",
       "pp=2,dp=2,schedule=1f1b")
LIMIT_PCT = 15.0


def comparisons(data: dict) -> list[Comparison]:
    """The saved plans as Comparisons (phases left out: the ranking does not need them)."""
    out = []
    for p in data["plans"]:
        m = float(p["measured_step_time_s"])
        out.append(Comparison(plan=p["plan"], world=int(p["world"]), measured_step_time_s=m,
                              predicted_step_time_s=float(p["predicted_step_time_s"]),
                              p10_step_time_s=float(p.get("measured_p10_s", m)),
                              p90_step_time_s=float(p.get("measured_p90_s", m)), phases={},
                              record={"launch_medians_s": list(p.get("launch_medians_s") or [])}))
    return out


def score(cs: list[Comparison]) -> dict:
    r = Ranking(cs)
    return {"plans": len(cs), "within": sum(abs(c.error_pct) <= LIMIT_PCT for c in cs),
            "worst_pct": max(abs(c.error_pct) for c in cs), "same_order": r.same_order(),
            "resolved_order": r.resolved_order(), "spearman": r.spearman}


def run_scores(cs: list[Comparison]) -> tuple[dict, dict | None]:
    """(score over every plan of a run, score over the issue's six or None when the run
    lacks one)."""
    by_short = {short_plan(c.plan): c for c in cs}
    six = [by_short[s] for s in SIX if s in by_short]
    return score(cs), (score(six) if len(six) == len(SIX) else None)


def _fmt(s: dict | None) -> str:
    if s is None:
        return f"{'(not all six)':>40}"
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    rho = "-" if s["spearman"] is None else f"{s['spearman']:.3f}"  # None: a run of one plan
    return (f"{s['within']}/{s['plans']} {s['worst_pct']:>5.1f}% {yn(s['same_order']):>6} "
            f"{yn(s['resolved_order']):>9} {rho:>6}")


def markdown_table(runs: list[tuple[Path, list[Comparison]]]) -> str:
    """| plan | procs | <run> | error | ... | with measured / predicted ms per run."""
    paths = [d for d, _ in runs]
    data = [{short_plan(c.plan): c for c in cs} for _, cs in runs]
    order = list(data[0])
    for by_short in data[1:]:
        order += [k for k in by_short if k not in order]
    lines = ["| plan | procs | " + " | ".join(f"{d.name} | error" for d in paths) + " |",
             "|---|---|" + "---|---|" * len(paths)]
    for k in order:
        world = next(r[k].world for r in data if k in r)
        cells = []
        for r in data:
            c = r.get(k)
            if c is None:
                cells += ["", ""]
                continue
            err = f"{c.error_pct:+.1f} %"
            cells += [f"{c.measured_step_time_s * 1e3:.1f} / {c.predicted_step_time_s * 1e3:.1f}",
                      f"**{err}**" if abs(c.error_pct) > LIMIT_PCT else err]
        lines.append(f"| {k} | {world} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_plan(runs: list[list[Comparison]]) -> list[dict]:
    """One row per plan (in the order first seen) over every run that has it: the runs,
    mean, lowest and highest error (%), and how many runs put it beyond LIMIT_PCT. A plan
    whose mean is far from zero is biased; one whose errors straddle zero is noisy."""
    errs: dict[str, list[float]] = {}
    world: dict[str, int] = {}
    for cs in runs:
        for c in cs:
            k = short_plan(c.plan)
            errs.setdefault(k, []).append(c.error_pct)
            world[k] = c.world
    return [{"plan": k, "world": world[k], "runs": len(v), "mean_pct": sum(v) / len(v), "min_pct": min(v),
             "max_pct": max(v), "beyond": sum(abs(e) > LIMIT_PCT for e in v)} for k, v in errs.items()]


def format_per_plan(rows: list[dict]) -> str:
    lines = [f"{'plan':34s} {'procs':>5} {'runs':>4} {'mean error':>10} {'range':>17} {'beyond 15 %':>11}"]
    for r in rows:
        rng = f"{r['min_pct']:+.1f}..{r['max_pct']:+.1f} %"
        lines.append(f"{r['plan']:34s} {r['world']:>5} {r['runs']:>4} {r['mean_pct']:>+9.1f}% {rng:>17} "
                     f"{r['beyond']:>11}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    table = argv[0] == "--table"
    if table:
        argv = argv[1:]
        if not argv:
            raise InputError("validation_runs", "RESULTS_DIR", "give at least one results directory")
    loaded = [(d, comparisons(load_run(d))) for d in map(Path, argv)]  # every input checked before printing
    runs = [(d, run_scores(cs)) for d, cs in loaded]
    if table:
        print(markdown_table(loaded) + "\n")
    head = f"{'within':>6} {'worst':>6} {'strict':>6} {'resolved':>9} {'rho':>6}"
    print(f"{'run':46s} | all plans: {head} | the six: {head}")
    met = 0
    for d, (every, six) in runs:
        print(f"{str(d)[-46:]:46s} | {'':11s}{_fmt(every)} | {'':9s}{_fmt(six)}")
        met += bool(six and six["within"] == six["plans"] and six["resolved_order"])
    print(f"\nthe six within {LIMIT_PCT:g} % and in order (resolved): {met} of {len(runs)} runs")
    print("\nper plan over these runs (error = predicted / measured - 1):")
    print(format_per_plan(per_plan([cs for _, cs in loaded])))
    return 0


if __name__ == "__main__":
    run_cli(main)
