#!/usr/bin/env bash
# Issue 10's "done when" figures for a real run, in one command (run from the repository
# root; needs torch, e.g. pip install 'plansim[validate]'):
#
#   benchmarks/adaptive_cpu.sh [OUT_DIR]        (default: adaptive-cpu)
#
# 1. Calibrate the localhost-cpu profile at 2 worker processes from microbenchmarks only
#    (skipped when OUT_DIR/cpu-w2.yaml exists; PROFILE=FILE uses that one instead).
# 2. In one launch of 2 gloo processes, train the tiny model three times: equal split
#    (unslowed), equal split with rank 1 at half speed (fixed), and rank 1 at half speed
#    with samples re-allocated every step by costmodel/rebalance.py (adaptive).
# 3. Print the figures: unslowed, fixed (about 2x), ideal (4/3 x unslowed), adaptive median
#    after it settles, its error vs the ideal (target within 15 %), and the simulator's
#    prediction of each run vs the measured step times (target within 15 %).
# Writes OUT_DIR/adaptive.json (every step of the three runs, figures, predictions) and
# OUT_DIR/adaptive.txt. STEPS (default 24) and SETTLE (default 4) override the step counts.
set -euo pipefail
OUT="${1:-adaptive-cpu}"
STEPS="${STEPS:-24}"
SETTLE="${SETTLE:-4}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
start=$(date +%s)
PROF="${PROFILE:-$OUT/cpu-w2.yaml}"
if [ ! -f "$PROF" ]; then
    "$PY" -m plansim calibrate localhost-cpu --world 2 --model tiny --out "$PROF" > "$OUT/calibrate-w2.txt"
    grep '^fitted:' "$OUT/calibrate-w2.txt" || true
fi
"$PY" -m plansim validate-adaptive localhost-cpu --model tiny --mode dp --slow-rank 1:0.5 \
    --steps "$STEPS" --settle "$SETTLE" --profile "$PROF" --out "$OUT/adaptive.json" | tee "$OUT/adaptive.txt"
"$PY" - "$OUT/adaptive.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
f = d["figures"]
u = f["unslowed_s"]
print(f"DONE-WHEN unslowed {u*1e3:.1f} ms | fixed {f['fixed_s']*1e3:.1f} ms ({f['fixed_ratio']:.2f}x) | "
      f"ideal {f['ideal_s']*1e3:.1f} ms ({f['ideal_ratio']:.3f}x) | adaptive median {f['adaptive_s']*1e3:.1f} ms "
      f"({f['adaptive_ratio']:.2f}x) | error vs ideal {f['error_vs_ideal_pct']:+.1f} % (target |e| <= 15 %)")
for name, p in d["simulated"].items():
    print(f"SIM-VS-MEASURED {name}: predicted {p['predicted_s']*1e3:.1f} ms, measured {p['measured_s']*1e3:.1f} ms, "
          f"error {p['error_pct']:+.1f} % (target |e| <= 15 %); x unslowed: predicted {p['predicted_ratio']:.2f}, "
          f"measured {p['measured_ratio']:.2f}")
PYEOF
echo "adaptive benchmark wall time: $(( $(date +%s) - start )) s"
