"""Does the pipelines' gap to dp=2 follow the host's speed? Over saved validation runs.

    python3 benchmarks/pipeline_gap.py DIR...     (each DIR holds a validation.json)

For each run: dp=2's measured step (the host's speed at the time), dp=2's error, and the
1F1B and GPipe errors less dp=2's (how much further below its price a pipeline stage ran
than a data-parallel rank did in the same run); sorted by dp=2's step, then the Spearman
rank correlation of that step with each gap (validate.accuracy.spearman, mean ranks for
ties). Reads the records only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from validate.accuracy import spearman  # noqa: E402
from validate.compare import short_plan  # noqa: E402

PLANS = ("dp=2", "pp=2,schedule=1f1b", "pp=2,schedule=gpipe")


def main(dirs: list[str]) -> int:
    rows = []
    for d in dirs:
        f = Path(d) / "validation.json"
        if not f.is_file():
            continue
        plans = {short_plan(p["plan"]): p for p in json.loads(f.read_text())["plans"]}
        if not all(k in plans for k in PLANS):
            continue
        dp, f1, gp = (plans[k] for k in PLANS)
        rows.append((f"{Path(d).parent.name}/{Path(d).name}", dp["measured_step_time_s"] * 1e3, dp["error_pct"],
                     f1["error_pct"] - dp["error_pct"], gp["error_pct"] - dp["error_pct"]))
    if len(rows) < 3:
        print("pipeline_gap: need at least 3 runs with dp=2, 1F1B and GPipe", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: r[1])
    print(f"{'run':44s} {'dp=2 ms':>8} {'dp=2 err':>9} {'1f1b-dp':>8} {'gpipe-dp':>9}")
    for r in rows:
        print(f"{r[0]:44s} {r[1]:8.1f} {r[2]:+8.1f}% {r[3]:+7.1f}pt {r[4]:+8.1f}pt")
    ms = [r[1] for r in rows]
    print(f"{len(rows)} runs; Spearman of dp=2's step with 1F1B's gap {spearman(ms, [r[3] for r in rows]):+.3f}, "
          f"with GPipe's {spearman(ms, [r[4] for r in rows]):+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
