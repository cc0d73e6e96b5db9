"""How many launches a plan's measurement needs: saved runs' launch medians, recombined.

    python3 benchmarks/launch_resample.py [--max-k K] RESULTS_DIR [RESULTS_DIR ...]

Each RESULTS_DIR is what benchmarks/validate_cpu.sh wrote (validation.json, with each
plan's launch_medians_s). On this host a launch is one draw of where a plan's processes and
threads land, and the draws differ by more than the model can follow (tp=2's launch
medians ran 371-549 ms over one day's runs). So the question is how often the measurement
alone, averaged over k launches, lands beyond 15 % of a prediction.

For every plan, the launch medians of all the runs given are pooled, and every k-subset of
the pool (k = 1 .. K) is paired with every run's prediction of that plan: the measured
figure is the subset's mean (standing in for the median of the pooled steps of k
launches), and the line gives the share of pairs whose prediction is more than 15 % off
it. Every combination is counted exactly (no sampling), so the figures are the same on
every run of the script. It assumes launches are exchangeable between runs, which they
are only roughly: the host's state moves over hours (docs/validation-cpu.md, Results).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.repredict import load_run, run_cli  # noqa: E402
from benchmarks.validation_runs import LIMIT_PCT  # noqa: E402
from costmodel.errors import InputError  # noqa: E402
from validate.compare import short_plan  # noqa: E402

# The count is exact, so its cost grows as C(launches, k): with the 69 launch medians per plan
# of 24 runs, k = 4 is 0.86 million subsets (10 s for all eight plans here), k = 5 already 11 million.
MAX_K = 4


def beyond_share(predictions: list[float], launches: list[float], k: int,
                 limit_pct: float = LIMIT_PCT) -> float:
    """Share of (prediction, k-subset of ``launches``) pairs whose prediction is more than
    ``limit_pct`` % off the subset's mean (error = predicted / measured - 1, as
    plansim validate reports it)."""
    if not predictions or len(launches) < k:
        raise ValueError("need at least one prediction and k launch medians")
    means = [sum(c) / k for c in itertools.combinations(launches, k)]
    bad = sum(abs(p / m - 1) * 100 > limit_pct for p in predictions for m in means)
    return bad / (len(predictions) * len(means))


def pooled(runs: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """short plan -> (each run's prediction, every launch median of every run), over the
    runs that recorded launch medians, plans in the first run's order."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for data in runs:
        for p in data["plans"]:
            medians = p.get("launch_medians_s") or []
            if not medians:
                continue
            preds, pool = out.setdefault(short_plan(p["plan"]), ([], []))
            preds.append(float(p["predicted_step_time_s"]))
            pool.extend(float(x) for x in medians)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    max_k = 4
    if argv[0] == "--max-k":
        try:
            max_k = int(argv[1])
        except (IndexError, ValueError):
            raise InputError("launch_resample", "--max-k", "expected a whole number of launches") from None
        if not 1 <= max_k <= MAX_K:
            raise InputError("launch_resample", "--max-k", f"{max_k}: must be 1 to {MAX_K}")
        argv = argv[2:]
    if not argv:
        raise InputError("launch_resample", "RESULTS_DIR", "give at least one results directory")
    table = pooled([load_run(Path(d)) for d in argv])  # every input checked before printing
    if not table:
        raise InputError("launch_resample", "launch_medians_s", "no run given recorded its launch medians")
    ks = range(1, max_k + 1)
    print(f"{'plan':28s} {'runs':>4} {'launches':>8}  " + " ".join(f"{f'k={k}':>6}" for k in ks)
          + f"   (share of measurements of k launches beyond {LIMIT_PCT:g} % of a prediction)")
    for plan, (preds, pool) in table.items():
        shares = [f"{100 * beyond_share(preds, pool, k):5.1f}%" if len(pool) >= k else f"{'-':>6}" for k in ks]
        print(f"{plan:28s} {len(preds):>4} {len(pool):>8}  " + " ".join(shares))
    return 0


if __name__ == "__main__":
    run_cli(main)
