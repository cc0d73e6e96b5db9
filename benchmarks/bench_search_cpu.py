"""Benchmark: CPU seconds of the full plan search (`search.search`, one process, no
report: as `plansim search --json` runs it) for GPT-3 175B on 1,024 A100s (dgx-a100
--nodes 128) and Llama 3 405B on 16,384 H100s (dgx-h100 --nodes 2048), median of N, and
the best plan each finds. CPU seconds (time.process_time) because the machine is shared.

    python benchmarks/bench_search_cpu.py [N] [--cases 175b,405b]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.reference import EVENTS, bare_simpy_cpu_s  # noqa: E402
from costmodel.profile import load_profile  # noqa: E402
from search.search import search  # noqa: E402
from specs.model import load_model  # noqa: E402
from specs.topology import load_topology  # noqa: E402

CASES = {
    "175b": ("dgx-a100", 128, "gpt3-175b", 5.0),
    "405b": ("dgx-h100", 2048, "llama3-405b", 30.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=3)
    ap.add_argument("--cases", default="175b,405b")
    args = ap.parse_args()
    for key in args.cases.split(","):
        topo, nodes, model_name, target = CASES[key]
        times, refs, best = [], [], None
        for _ in range(args.n):
            refs.append(bare_simpy_cpu_s())    # the machine's speed now, in the same run
            t0 = time.process_time()
            cluster = load_topology(topo, nodes=nodes)
            model = load_model(model_name)
            profile = load_profile(None, bundled=cluster.profiles)
            res = search(model, cluster, profile, progress=False, record_best=False)
            times.append(time.process_time() - t0)
            best = res.ranked[0]
        med = statistics.median(times)
        print(f"search {model_name} on {cluster.num_devices:,} GPUs ({topo}): median "
              f"{med:.2f} CPU s over {args.n} (min {min(times):.2f}, max {max(times):.2f}) "
              f"[target <= {target:.0f} s: {'met' if med <= target else 'NOT met'}]; "
              f"= {med / statistics.median(refs):.0f}x the reference (bare SimPy, {EVENTS:,} events: "
              f"{statistics.median(refs):.3f} CPU s); {res.candidates:,} candidates, {res.estimated:,} estimated")
        print(f"  best {best.plan}: step {best.step_time_s:.4f} s, {best.tokens_per_s:,.0f} tokens/s, "
              f"fits={best.fits_memory}")


if __name__ == "__main__":
    main()
