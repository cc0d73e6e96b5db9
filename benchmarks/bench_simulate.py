"""Benchmark: wall time of `plansim simulate dgx-a100 --nodes 128 --model gpt3-175b
--plan tp=8,pp=8,dp=16,mbs=1 --json` (GPT-3 175B, 1024 A100s), end to end as a user
runs it (interpreter start and imports included). Prints the median of N runs.

    python benchmarks/bench_simulate.py [N]
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

CMD = [sys.executable, "-m", "plansim", "simulate", "dgx-a100", "--nodes", "128", "--model", "gpt3-175b",
       "--plan", "tp=8,pp=8,dp=16,mbs=1", "--json"]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(CMD, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    print(f"simulate gpt3-175b on 1024 A100s: median {statistics.median(times):.2f} s "
          f"over {n} runs (min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    main()
