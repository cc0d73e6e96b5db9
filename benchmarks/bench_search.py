"""Benchmark: wall time of the full plan search for GPT-3 175B on 1024 A100s,
`plansim search dgx-a100 --nodes 128 --model gpt3-175b --json --workers W`, end to end as a
user runs it (interpreter start, imports, enumeration, estimates and the top-10
simulations included). Prints the median of N runs, and the best plan against the
hand-made plan tp=8,pp=8,dp=16,mbs=1 (simulated as given and with full recompute, the
variant of it that fits in 80 GB).

    python benchmarks/bench_search.py [N] [WORKERS]
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

BASE = [sys.executable, "-m", "plansim"]
WHERE = ["dgx-a100", "--nodes", "128", "--model", "gpt3-175b"]
HAND = ("tp=8,pp=8,dp=16,mbs=1", "tp=8,pp=8,dp=16,mbs=1,recompute=full")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    cmd = BASE + ["search", *WHERE, "--json", "--workers", str(workers)]
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        out = json.loads(proc.stdout)
    print(f"search gpt3-175b on 1024 A100s (--workers {workers}): median {statistics.median(times):.1f} s "
          f"over {n} runs (min {min(times):.1f}, max {max(times):.1f}); "
          f"{out['candidates']:,} candidates, {out['estimated']:,} estimated, {len(out['ranked'])} shown")
    best = out["ranked"][0]
    print(f"best plan   {best['plan']}: {best['tokens_per_s']:,.0f} tokens/s, MFU {100 * best['mfu']:.1f} %, "
          f"{best['peak_memory_gib']:.1f} GiB")
    for plan in HAND:
        proc = subprocess.run(BASE + ["simulate", *WHERE, "--plan", plan, "--json"], check=True,
                              capture_output=True, text=True)
        res = json.loads(proc.stdout)
        fits = "fits" if res["fits_memory"] else f"does NOT fit (short by {res['memory_shortfall_gib']:.1f} GiB)"
        print(f"hand plan   {res['plan']}: {res['tokens_per_s']:,.0f} tokens/s ({fits}); "
              f"best/hand = {best['tokens_per_s'] / res['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
