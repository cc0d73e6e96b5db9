"""Which kinds of work the simulator prices high or low: over saved runs' Chrome traces (the
last measured step of each plan and its simulation, laid out alike: reports/trace), each
rank's total of forward (F*), backward (B*), optimizer and embedding spans, measured over
simulated, the median over runs per plan and span kind.

    python3 results/validate-cpu-2026-12-08-s36/op_classes.py RUN_DIR ...

A RUN_DIR holds traces/ (saved results) or report/ (a fresh validate_cpu.sh output) and
validation.json (the plans, in the traces' order).
"""
import collections
import json
import statistics
import sys
from pathlib import Path

KINDS = ("F", "B", "optimizer", "embedding")


def totals(path: Path) -> dict:
    d = json.loads(path.read_text())
    ev = d["traceEvents"] if isinstance(d, dict) else d
    out = collections.defaultdict(float)
    for e in ev:
        if e.get("ph") != "X":
            continue
        name = e["name"]
        kind = name[0] if name[:1] in "FB" and name[1:2].isdigit() else name.split(" ")[0]
        if kind in KINDS:
            out[(e["pid"], kind)] += e["dur"] / 1e3
    return out


ratios = collections.defaultdict(list)
for run in map(Path, sys.argv[1:]):
    plans = json.loads((run / "validation.json").read_text())["plans"]
    where = run / "traces" if (run / "traces").is_dir() else run / "report"
    for i, p in enumerate(plans, 1):
        m, s = where / f"trace-{i}-measured.json", where / f"trace-{i}-simulated.json"
        if not (m.exists() and s.exists()):
            continue
        tm, ts = totals(m), totals(s)
        for kind in KINDS:
            got = [tm[k] / ts[k] for k in tm if k[1] == kind and ts.get(k, 0) > 0]
            if got:
                ratios[(p["plan"].split(",precision")[0], kind)].append(statistics.median(got))
print(f"{'plan':52s} {'kind':10s} {'runs':>4} {'measured / simulated (median, p10..p90 over runs)':>50}")
for (plan, kind), v in sorted(ratios.items()):
    q = statistics.quantiles(v, n=10) if len(v) > 2 else [min(v)] * 9 + [max(v)]
    print(f"{plan:52s} {kind:10s} {len(v):>4} {statistics.median(v):>10.2f} ({q[0]:.2f}..{q[-1]:.2f})")
