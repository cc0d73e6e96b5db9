"""Check that a change to the engine's internals leaves its results unchanged: record the
`plansim simulate ... --json` output of a fixed set of cases (every bundled topology;
pp, tp, dp, vpp, top-k, heterogeneous, hierarchical, tree, ZeRO plans; the benchmark's
1k/16k/405B cases) and later compare against the record.

    python benchmarks/identical_outputs.py record DIR      # before the change
    python benchmarks/identical_outputs.py compare DIR     # after: exit 1 on a difference

Floats must agree within --rel (default 1e-9, relative); everything else exactly.
`sim_wall_s` (a timing) is ignored. One case also writes a trace (recording on), whose
events are compared the same way.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

L16 = ":".join(["8"] * 14 + ["7"] * 2)
CASES = {
    "a100-1k": ["dgx-a100", "--nodes", "128", "--model", "gpt3-175b", "--plan", "tp=8,pp=8,dp=16,mbs=1"],
    "a100-16k": ["dgx-a100", "--nodes", "2048", "--model", "gpt3-175b", "--plan", "tp=8,pp=8,dp=256,mbs=1"],
    "a100-2k-vpp4": ["dgx-a100", "--nodes", "256", "--model", "gpt3-175b", "--plan", "tp=8,pp=8,dp=32,mbs=1,vpp=4"],
    "h100-405b-16k": ["dgx-h100", "--nodes", "2048", "--model", "llama3-405b",
                      "--plan", f"tp=8,pp=16,dp=128,mbs=1,layers={L16}"],
    "a100-tree": ["dgx-a100", "--nodes", "32", "--model", "gpt3-6.7b", "--plan", "tp=8,pp=2,mbs=1,allreduce=tree"],
    "a100-hier-zero1": ["dgx-a100", "--nodes", "32", "--model", "gpt3-13b",
                        "--plan", "tp=4,pp=2,mbs=1,allreduce=hierarchical,zero=1"],
    "a100-zero3": ["dgx-a100", "--nodes", "16", "--model", "gpt3-6.7b", "--plan", "tp=2,pp=2,mbs=1,zero=3"],
    "h100-vpp2": ["dgx-h100", "--nodes", "64", "--model", "gpt3-13b", "--plan", "tp=8,pp=4,mbs=1,vpp=2"],
    "h100-tp-dp-pp": ["dgx-h100", "--nodes", "64", "--model", "gpt3-6.7b",
                      "--plan", "tp=2,pp=4,mbs=1,placement=tp-dp-pp"],
    "hetero-pp": ["hetero-a100-v100", "--model", "gpt3-1.3b",
                  "--plan", "tp=1,pp=2,dp=32,mbs=2,layers=18:6,placement=tp-dp-pp"],
    "hetero-mixed": ["hetero-a100-v100", "--model", "gpt3-1.3b", "--plan", "tp=2,pp=1,mbs=1"],
    "jeanzay": ["jeanzay-a100-opa", "--model", "gpt3-13b", "--plan", "tp=8,pp=3,mbs=1,layers=14:13:13"],
    "l40s-topk": ["pcie-l40s", "--model", "gpt3-1.3b", "--plan", "tp=1,pp=2,mbs=1,compress=topk:0.01"],
    "l40s-hier": ["pcie-l40s", "--model", "gpt3-1.3b", "--plan", "tp=2,pp=1,mbs=1,allreduce=hierarchical"],
    "cpu": ["localhost-cpu", "--model", "gpt3-125m", "--plan", "tp=1,pp=1,mbs=1"],
}
TRACE_CASE = "h100-vpp2"
IGNORED = {"sim_wall_s"}


def run_case(key: str, trace: Path | None = None) -> dict:
    cmd = [sys.executable, "-m", "plansim", "simulate", *CASES[key], "--json"]
    if trace is not None:
        cmd += ["--trace", str(trace)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def diff(a, b, rel: float, where: str = "") -> list[str]:
    """Differences between two JSON values: floats within ``rel``, the rest exactly."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k in IGNORED:
                continue
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'new' if k in b else 'record'}")
            else:
                out += diff(a[k], b[k], rel, f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, rel, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if a == b or math.isclose(a, b, rel_tol=rel, abs_tol=1e-15):
            return []
        return [f"{where}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rel", type=float, default=1e-9)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    bad = 0
    for key in args.cases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.json" if key == TRACE_CASE else None
            res = run_case(key, trace)
            if trace is not None:
                res = {"result": res, "trace": json.loads(trace.read_text())}
        path = args.dir / f"{key}.json"
        if args.mode == "record":
            path.write_text(json.dumps(res, indent=1, sort_keys=True))
            print(f"{key}: recorded")
            continue
        d = diff(json.loads(path.read_text()), res, args.rel)
        bad += bool(d)
        print(f"{key}: {'identical' if not d else f'{len(d)} differences'}")
        for line in d[:10]:
            print("   ", line)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
