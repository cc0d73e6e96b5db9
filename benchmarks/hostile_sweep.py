"""Break one field of an input file at a time and check the command line's contract.

    python3 benchmarks/hostile_sweep.py KIND [--few] [--jobs N] [--file F]

KIND is what is broken: ``topology`` (topologies/dgx-h100.yaml), ``model`` (a 24-layer GPT
written out as a model YAML), ``profile`` (costmodel/profiles/h100-ib-ndr.yaml),
``runtime`` (costmodel/profiles/runtime-megatron-core.yaml) or ``cpu-profile`` (a profile
that `plansim calibrate` wrote: --file, e.g. results/validate-cpu-*/*/cpu-w2.yaml). For
every leaf of the file (every scalar, at any depth of mappings and lists) it writes one
copy with that leaf replaced by each of BAD_VALUES (--few: FEW_VALUES), and one with the
leaf deleted, and runs `plansim simulate` on it. The contract (README, "Standards"): exit 0,
or exit 2 with exactly one line on stderr and no traceback; anything else (another exit
code, a traceback, several lines, 120 s without an answer) is printed as it is found.
The last line counts the cases and the breaches. Deterministic: the cases come in the
file's own order.

Why a script and not a test: each case starts an interpreter (about 1 s here), and a sweep
is several hundred cases; tests/test_hostile.py keeps the hand-picked ones in CI.
"""
from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Negative, zero, huge, not a number, text, empty containers, null, a 5,000-character
# string, a boolean, a subnormal, an integer beyond float range, a numeral that is infinite.
BAD_VALUES = [-1, 0, 1e308, float("nan"), "abc", [], {}, None, "x" * 5000, True, -1e-300, 10**30, "1e400"]
FEW_VALUES = [-1, float("nan"), "abc", None, 10**30]
MODEL = {"name": "m", "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
         "vocab_size": 50257, "global_batch_size": 512}
# KIND: (the file broken, or None for MODEL / --file; the command, FILE standing for the copy)
KINDS = {
    "topology": ("topologies/dgx-h100.yaml", ["simulate", "FILE", "--model", "gpt3-1.3b", "--plan", "tp=8,dp=16"]),
    "model": (None, ["simulate", "dgx-a100", "--model", "FILE", "--plan", "tp=2,pp=2,dp=4"]),
    "profile": ("costmodel/profiles/h100-ib-ndr.yaml", ["simulate", "dgx-h100", "--profile", "FILE",
                                                         "--plan", "tp=8,dp=16"]),
    "runtime": ("costmodel/profiles/runtime-megatron-core.yaml", ["simulate", "dgx-h100", "--profile", "FILE",
                                                                   "--plan", "tp=8,dp=16"]),
    "cpu-profile": (None, ["simulate", "localhost-cpu", "--model", "tiny", "--profile", "FILE", "--plan", "pp=2"]),
}


def leaves(node, path=()):
    """Every path to a scalar of ``node`` (mappings and lists), in the file's order."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))
    elif path:
        yield path


def broken(base, path, value, delete: bool):
    """A copy of ``base`` with the leaf at ``path`` set to ``value`` (or deleted)."""
    out = copy.deepcopy(base)
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    if delete:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return out


def verdict(rc: int, stderr: str) -> str | None:
    """None where the contract holds, else what breaks it."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if rc == 0 or (rc == 2 and len(lines) == 1 and "Traceback" not in stderr):
        return None
    return f"exit {rc}, {len(lines)} stderr line(s): {stderr.strip()[-200:]!r}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--few", action="store_true", help="five bad values a leaf instead of thirteen")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--file", help="the profile to break (cpu-profile)")
    args = ap.parse_args(argv)
    rel, cmd = KINDS[args.kind]
    if args.kind == "cpu-profile" and not args.file:
        ap.error("cpu-profile needs --file")
    base = MODEL if args.kind == "model" else yaml.safe_load(Path(args.file or ROOT / rel).read_text())
    values = FEW_VALUES if args.few else BAD_VALUES
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for path in leaves(base):
            for value, delete in [(v, False) for v in values] + [(None, True)]:
                f = Path(tmp) / f"case-{len(cases)}.yaml"
                f.write_text(yaml.safe_dump(broken(base, path, value, delete)))
                cases.append((f, path, "deleted" if delete else repr(value)[:20]))

        def run(case):
            f, path, what = case
            try:
                p = subprocess.run([sys.executable, "-m", "plansim"] + [str(f) if a == "FILE" else a for a in cmd],
                                   cwd=ROOT, capture_output=True, text=True, timeout=120)
                return case, verdict(p.returncode, p.stderr)
            except subprocess.TimeoutExpired:
                return case, "no answer within 120 s"

        breaches = 0
        with ThreadPoolExecutor(args.jobs) as ex:
            for (f, path, what), bad in ex.map(run, cases):
                if bad:
                    breaches += 1
                    print(f"{'.'.join(map(str, path))} = {what}: {bad}", flush=True)
    print(f"{args.kind}: {len(cases)} cases, {breaches} breach(es) of the one-line exit-2 contract")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
