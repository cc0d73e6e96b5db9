"""World-4 calibrations: the after-compute rows of all_gather, reduce_scatter and send_recv in
groups of 4, priced by the fit with every row (in-fit) against left out of the fit (held
out; KEEP_SIZES=32768,...: those sizes stay in the fit); and the other after-compute rows,
both ways. Could a 4-process calibration skip those streams (about 17 s)?

    KEEP_SIZES= python3 results/validate-cpu-2026-12-08-s36/heldout.py RUN_DIR ...
"""
import math
import os
import statistics
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from plansim.cmd_calibrate import resolve_world  # noqa: E402
from validate.bench_record import load_bench  # noqa: E402
from validate.calibrate import collective_time_s, profile_from_bench  # noqa: E402
from validate.collective_bench import AFTER_COMPUTE_SUFFIX  # noqa: E402
HELD = {o + AFTER_COMPUTE_SUFFIX for o in ("all_gather", "reduce_scatter", "send_recv")}
cluster, _ = resolve_world("localhost-cpu", 4, "--world", "")
node = cluster.nodes[0]
bw, lat = node.intra_bw_Bps, node.intra_latency_s
out = {"held in-fit": [], "held out-of-fit": [], "kept after full fit": [], "kept after reduced fit": []}
for d in sys.argv[1:]:
    f = Path(d) / "cpu-w4.bench.json"
    if not f.exists():
        continue
    res = load_bench(f, "file")
    held = [c for c in res.collectives if c.op in HELD and c.n == 4]
    kept = [c for c in res.collectives if c.op.endswith(AFTER_COMPUTE_SUFFIX) and c not in held]
    if not held:
        continue
    full, _ = profile_from_bench(cluster, res, "x")
    red = load_bench(f, "file")

    KEEP = {int(x) for x in os.environ.get("KEEP_SIZES", "").split(",") if x}
    red.collectives = [c for c in red.collectives if not (c.op in HELD and c.n == 4 and c.nbytes not in KEEP)]
    red.launch_samples = [r for r in red.launch_samples if not (r[0] in HELD and r[1] == 4 and r[2] not in KEEP)]
    reduced, _ = profile_from_bench(cluster, red, "x")
    for name, fab, rows in (("held in-fit", full.fabric, held), ("held out-of-fit", reduced.fabric, held),
                            ("kept after full fit", full.fabric, kept), ("kept after reduced fit", reduced.fabric, kept)):
        out[name] += [100 * math.log(collective_time_s(c.op, c.nbytes, c.n, bw, lat, fab) / c.seconds) for c in rows]
for name, e in out.items():
    rms = math.sqrt(statistics.fmean(x * x for x in e))
    print(f"{name:24s} rows {len(e):5d}  mean log error {statistics.fmean(e):+6.1f} %  RMS {rms:5.1f} %  "
          f"median |e| {statistics.median(map(abs, e)):5.1f} %")
