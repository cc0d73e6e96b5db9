"""pp=2 against dp=2 over every saved run with both (runs.txt), per session (medians):
1F1B's and GPipe's compute, predicted / measured, over dp=2's; 1F1B's bubble phase measured
and predicted; 1F1B's error; dp=2's step (the host's speed).

    python3 results/validate-cpu-2026-12-08-s36/pp.py
"""
import collections
import statistics

from saved_runs import DP2, phase, runs_with, session


def priced_over_measured(plan: dict) -> float:
    return phase(plan, "compute", "predicted") / phase(plan, "compute", "measured")


by = collections.defaultdict(list)
for d, p in runs_with({"dp2": DP2, "1f1b": "tp=1,pp=2,dp=1,mbs=1,schedule=1f1b",
                       "gpipe": "tp=1,pp=2,dp=1,mbs=1,schedule=gpipe"}):
    try:
        dp2 = priced_over_measured(p["dp2"])
        by[session(d)].append((priced_over_measured(p["1f1b"]) / dp2, priced_over_measured(p["gpipe"]) / dp2,
                               phase(p["1f1b"], "bubble", "measured") * 1e3,
                               phase(p["1f1b"], "bubble", "predicted") * 1e3,
                               p["1f1b"]["predicted_step_time_s"] / p["1f1b"]["measured_step_time_s"] - 1,
                               p["dp2"]["measured_step_time_s"] * 1e3))
    except (KeyError, ZeroDivisionError):
        pass
print(f"{'session':14s} {'n':>3} {'1f1b c p/m over dp2':>19} {'gpipe c p/m over dp2':>20} "
      f"{'1f1b bubble m/p ms':>18} {'1f1b err':>8} {'dp2 ms':>7}")
for k, v in by.items():
    def m(i):
        return statistics.median(x[i] for x in v)
    print(f"{k:14s} {len(v):3d} {m(0):19.3f} {m(1):20.3f} {m(2):8.1f} / {m(3):6.1f} {100 * m(4):+7.1f}% {m(5):7.1f}")
