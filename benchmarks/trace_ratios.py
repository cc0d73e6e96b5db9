"""Each plan's forwards, backwards and optimizer step, measured over simulated, from a
validation run's traces (docs/validation-cpu.md, mechanism 57 and Known gaps).

    python3 benchmarks/trace_ratios.py RUN_DIR [RUN_DIR ...]

RUN_DIR holds validation.json and the report's Chrome traces, trace-<i>-measured.json and
trace-<i>-simulated.json for the i-th plan (in RUN_DIR/report/ as `plansim validate
--report` writes them, or in RUN_DIR/traces/ as the saved results keep them). Each trace
is one step; for every rank the simulated trace draws (its pid), the compute spans named
F..., B... and 'optimizer' are summed, and the measured sums printed over the simulated
ones. The TP plans' measured forward and backward spans hold their all-reduces, which the
simulated trace draws apart, so their ratios are not the compute's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

KINDS = (("F", "forward"), ("B", "backward"), ("optimizer", "optimizer"))


def span_sums(path: Path) -> dict[int, dict[str, float]]:
    """{pid: {'F': ms, 'B': ms, 'optimizer': ms}} of one Chrome trace's compute spans."""
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    out: dict[int, dict[str, float]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "compute":
            continue
        name = e.get("name", "")
        kind = "optimizer" if name.startswith("optimizer") else name[:1] if name[:1] in ("F", "B") else None
        if kind is not None:
            sums = out.setdefault(int(e["pid"]), {})
            sums[kind] = sums.get(kind, 0.0) + float(e["dur"]) / 1e3
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    for run in map(Path, argv):
        plans = json.loads((run / "validation.json").read_text())["plans"]
        where = run / "report" if (run / "report").is_dir() else run / "traces"
        print(run)
        for i, p in enumerate(plans, 1):
            meas = span_sums(where / f"trace-{i}-measured.json")
            sim = span_sums(where / f"trace-{i}-simulated.json")
            cells = []
            for pid in sorted(sim):
                m, s = meas.get(pid, {}), sim[pid]
                cells.append(f"rank {pid} " + ", ".join(
                    f"{label} {m.get(k, 0.0):.1f}/{s[k]:.1f} = {m.get(k, 0.0) / s[k]:.2f}"
                    for k, label in KINDS if s.get(k)))
            print(f"  {p['plan']}: error {p['error_pct']:+.1f} %; " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
