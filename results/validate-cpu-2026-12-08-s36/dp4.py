"""dp=4 against dp=2 over every saved run with both (runs.txt): each one's compute phase,
measured and predicted, per session (medians), beside the host's speed probe, dp=2's step
and dp=4's error. The simulator's 4-on-2 slowdown is processor sharing, at most n/c = 2
(sim/core_sharing.py); this shows what the measured ratio did.

    python3 results/validate-cpu-2026-12-08-s36/dp4.py
"""
import collections
import statistics

from saved_runs import DP2, phase, runs_with, session

by = collections.defaultdict(list)
for d, p in runs_with({"dp2": DP2, "dp4": "tp=1,pp=1,dp=4"}):
    c2m, c2p = phase(p["dp2"], "compute", "measured"), phase(p["dp2"], "compute", "predicted")
    c4m, c4p = phase(p["dp4"], "compute", "measured"), phase(p["dp4"], "compute", "predicted")
    if min(c2m, c2p, c4m, c4p) <= 0:
        continue
    by[session(d)].append((c4m / c2m, c4p / c2p, (p["dp2"].get("speed_probe") or {}).get("run_s", 0) * 1e3,
                           p["dp2"]["measured_step_time_s"] * 1e3,
                           p["dp4"]["predicted_step_time_s"] / p["dp4"]["measured_step_time_s"] - 1))
print(f"{'session':14s} {'n':>3} {'meas c4/c2':>10} {'pred c4/c2':>10} {'probe ms':>8} {'dp2 ms':>7} {'dp4 err':>8}")
for k, v in by.items():
    def m(i):
        return statistics.median(x[i] for x in v)
    print(f"{k:14s} {len(v):3d} {m(0):10.3f} {m(1):10.3f} {m(2):8.2f} {m(3):7.1f} {100 * m(4):+7.1f}%")
