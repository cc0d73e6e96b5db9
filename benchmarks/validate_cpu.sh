#!/usr/bin/env bash
# Reproduce the CPU validation table of the README in one command (run from the repository
# root; needs torch, e.g. pip install 'plansim[validate]'):
#
#   benchmarks/validate_cpu.sh [OUT_DIR]        (default: validate-cpu)
#
# 1. Calibrate the localhost-cpu profile from microbenchmarks only, once at 2 and once at 4
#    concurrent worker processes (GEMMs at the tiny model's TP shapes, memory-bound ops,
#    per-op overhead, gloo collectives 4 KiB..64 MiB). No plan is run here.
# 2. Run six plans of the tiny model for real and predict each with the profile calibrated
#    at its process count: measured vs predicted median step time, error, Spearman rank
#    correlation. Writes OUT_DIR/{cpu-w2,cpu-w4}.yaml (+ .bench.json), calibrate-w*.txt,
#    validation.txt, validation.json and OUT_DIR/report/ (HTML, Markdown, Chrome traces).
# Prints the wall time of the whole; the target is at most 5 minutes on a 2-core host.
set -euo pipefail
OUT="${1:-validate-cpu}"
STEPS="${STEPS:-10}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
start=$(date +%s)
for W in 2 4; do
    "$PY" -m plansim calibrate localhost-cpu --world "$W" --model tiny --out "$OUT/cpu-w$W.yaml" \
        > "$OUT/calibrate-w$W.txt"
    grep '^fitted:' "$OUT/calibrate-w$W.txt" | sed "s/^/world $W /"
done
PLANS=("dp=2" "tp=2" "pp=2,schedule=1f1b" "pp=2,schedule=gpipe" "dp=2,compress=topk:0.1" "tp=2,dp=2")
"$PY" -m plansim validate localhost-cpu --model tiny --plans "${PLANS[@]}" \
    --profile "2=$OUT/cpu-w2.yaml" --profile "4=$OUT/cpu-w4.yaml" --steps "$STEPS" \
    --report "$OUT/report" | tee "$OUT/validation.txt"
"$PY" - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
d = json.loads((out / "report" / "validation.json").read_text())
(out / "validation.json").write_text(json.dumps(d, indent=2))
PYEOF
echo "calibrate + validate wall time: $(( $(date +%s) - start )) s"
