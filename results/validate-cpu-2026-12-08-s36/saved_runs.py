"""The saved runs of runs.txt, each with the plans of its validation.json picked by prefix
(shared by dp4.py and pp.py)."""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DP2 = "tp=1,pp=1,dp=2,mbs=1,schedule=1f1b,precision"  # plain dp=2, not its top-k variant


def runs_with(prefixes: dict) -> list:
    """[(run dir as runs.txt lists it, {key: that run's plan entry})] for every run that has a
    plan starting with each of ``prefixes`` ({key: plan prefix}), in runs.txt's order."""
    out = []
    for d in (HERE / "runs.txt").read_text().split():
        try:
            plans = json.loads((ROOT / d / "validation.json").read_text())["plans"]
        except (OSError, ValueError, KeyError):
            continue
        got = {k: next((p for p in plans if p["plan"].startswith(pre)), None) for k, pre in prefixes.items()}
        if all(got.values()):
            out.append((d, got))
    return out


def phase(plan: dict, name: str, which: str) -> float:
    """A plan entry's phase ``name``, ``which`` = 'measured' or 'predicted', seconds."""
    return float(plan["phases"][name][which + "_s"])


def session(d: str) -> str:
    """results/validate-cpu-2026-12-07-s35/b-2 -> 2026-12-07-s35."""
    return d.split("/")[1].removeprefix("validate-cpu-")
