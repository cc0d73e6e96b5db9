"""The saved runs re-predicted (benchmarks/repredict.py --refit --pool) with the world-4
calibrations' after-compute rows of all_gather, reduce_scatter and send_recv in groups of
4 removed before the fit, as if those streams (about 17 s of a slow-host calibration) had
not been timed: what the 4-process plans of validate_cpu.sh would have lost.

    python3 results/validate-cpu-2026-12-08-s36/drop_rows.py RUN_DIR ...
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import repredict  # noqa: E402
import validate.bench_record as br  # noqa: E402

DROP = {op + "_after_compute" for op in ("all_gather", "reduce_scatter", "send_recv")}
plain_load = br.load_bench


def load_without(path, flag="--compute-from"):
    res = plain_load(path, flag)
    if res.world == 4:
        res.collectives = [c for c in res.collectives if not (c.op in DROP and c.n == 4)]
        res.launch_samples = [r for r in res.launch_samples if not (r[0] in DROP and r[1] == 4)]
    return res


br.load_bench = load_without  # repredict.refit_profile imports it from the module at call time
sys.exit(repredict.main(["--refit", "--pool", *sys.argv[1:]]))
