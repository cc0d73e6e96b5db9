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
STARTUP = [sys.executable, "-m", "plansim", "models"]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    times, starts = [], []
    for _ in range(n):
        # Interleaved with the run: `plansim models`, the interpreter start and imports
        # alone, so that what the simulation adds reads as a difference in the same run.
        t0 = time.perf_counter()
        subprocess.run(STARTUP, check=True, capture_output=True)
        starts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(CMD, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    med, start = statistics.median(times), statistics.median(starts)
    print(f"simulate gpt3-175b on 1024 A100s: median {med:.2f} s wall over {n} runs "
          f"(min {min(times):.2f}, max {max(times):.2f}) [target <= 10 s: {'met' if med <= 10 else 'NOT met'}]; "
          f"start-up alone (plansim models) {start:.2f} s, so the simulation adds {med - start:.2f} s")


if __name__ == "__main__":
    main()
