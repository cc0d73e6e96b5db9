#!/usr/bin/env bash
# Calibrate and validate on a CUDA machine with NCCL, in one command (repository root,
# torch with CUDA installed):
#
#   benchmarks/calibrate_cuda.sh OUT_DIR [TOPOLOGY]
#
# 1. Finds the GPUs (torch.cuda), their catalog name (costmodel/gpus.py) and count N.
#    Without TOPOLOGY, writes OUT_DIR/host.yaml: one node of N such GPUs on the fabric
#    their form factor implies (NVSwitch for SXM parts, PCIe otherwise), bandwidths at
#    the line rate (calibration fits the achieved share under it).
# 2. plansim calibrate on N processes (NCCL, CUDA tensors): writes
#    OUT_DIR/<gpu>-<date>.yaml, whose `source` names the GPU, host, torch and date.
# 3. plansim validate of a few tiny plans that fit N GPUs, with that profile: writes
#    OUT_DIR/validation.txt and OUT_DIR/report/ (table, curves, Chrome traces).
# Exits 2 without CUDA. Runs in a few minutes.
set -euo pipefail
OUT="${1:?usage: benchmarks/calibrate_cuda.sh OUT_DIR [TOPOLOGY]}"
TOPO="${2:-}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
INFO="$("$PY" - "$OUT" "$TOPO" <<'PYEOF'
import sys, pathlib
import yaml
try:
    import torch
except ImportError:
    sys.exit("calibrate_cuda.sh: torch is not installed (pip install 'plansim[validate]')")
if not torch.cuda.is_available():
    print("calibrate_cuda.sh: no CUDA device visible to torch; this script is for a GPU machine", file=sys.stderr)
    sys.exit(2)
from costmodel.gpus import GPU_CATALOG, catalog_name_for_product, intra_link_for_product
out, topo = pathlib.Path(sys.argv[1]), sys.argv[2]
name = torch.cuda.get_device_name(0)
n = torch.cuda.device_count()
cat = catalog_name_for_product(name)  # "NVIDIA H100 80GB HBM3" -> H100-SXM5-80GB, ...
if cat is None or cat not in GPU_CATALOG:
    sys.exit(f"calibrate_cuda.sh: no catalog entry for {name!r}; add one to costmodel/gpus.py or pass a TOPOLOGY")
if not topo:
    intra = intra_link_for_product(name)  # NVSwitch at the part's NVLink rate, or PCIe
    host = {"name": "cuda-host", "description": f"this machine: {n} x {name}",
            "node_types": {"host": {"gpu": cat, "gpus_per_node": n, "intra": intra}},
            "groups": [{"name": "host", "node_type": "host", "nodes": 1}]}
    (out / "host.yaml").write_text(yaml.safe_dump(host, sort_keys=False))
print(cat, n)
PYEOF
)"  # set -e: a failure above (no CUDA: exit 2) ends the script with its status
read -r GPU N <<<"$INFO"
[ -n "$TOPO" ] || TOPO="$OUT/host.yaml"
DATE=$(date -u +%Y-%m-%d)
PROFILE="$OUT/$GPU-$DATE.yaml"
echo "calibrating $N x $GPU on $TOPO -> $PROFILE"
"$PY" -m plansim calibrate "$TOPO" --world "$N" --model tiny --out "$PROFILE" | tee "$OUT/calibrate.txt"
if [ "$N" -ge 4 ]; then
    PLANS=("dp=2" "tp=2" "pp=2,schedule=1f1b" "pp=2,schedule=gpipe" "tp=2,dp=2")
elif [ "$N" -ge 2 ]; then
    PLANS=("dp=2" "tp=2" "pp=2,schedule=1f1b" "pp=2,schedule=gpipe")
else
    PLANS=("mbs=1" "mbs=2" "mbs=4" "recompute=full")
fi
# A profile calibrated at N processes serves plans of N processes; smaller plans use it
# too (the GPUs are not shared between processes, unlike CPU cores).
"$PY" -m plansim validate "$TOPO" --model tiny --plans "${PLANS[@]}" --profile "$PROFILE" \
    --report "$OUT/report" | tee "$OUT/validation.txt"
echo "results in $OUT"
