"""Benchmark: the issue-10 case. GPT-3 175B on 1,024 A100s (dgx-a100 --nodes 128,
tp=8,pp=8,dp=16,mbs=1,recompute=full, the README's 1,024-GPU plan) with one node at 60 %
from step 3 (scenarios/slow-node-175b.yaml), 50 steps: throughput of the unslowed
cluster, the fixed plan and the adaptive run (from step 3 on, transition steps and
migrations included), the share of the lost throughput recovered, and the CPU seconds of
simulating the 50 adaptive steps (time.process_time of this process: the simulation is
single-threaded), the median of N repeats with the load average beside it (the machine is
shared; wall times are not reported).

    python benchmarks/bench_adaptive.py [N] [--steps 50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costmodel.profile import load_profile  # noqa: E402
from sim.adaptive_control import SimController  # noqa: E402
from sim.multistep import compare_runs, simulate_steps  # noqa: E402
from specs.model import load_model  # noqa: E402
from specs.plan import resolve_plan  # noqa: E402
from specs.scenario import load_scenario  # noqa: E402
from specs.topology import load_topology  # noqa: E402

PLAN = "tp=8,pp=8,dp=16,mbs=1,recompute=full"
SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "slow-node-175b.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repeats", nargs="?", type=int, default=3)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    cluster = load_topology("dgx-a100", nodes=128)
    model = load_model("gpt3-175b")
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan(PLAN, model, cluster.num_devices)
    sc = load_scenario(SCENARIO, cluster)
    cpu, loads = [], []
    for _ in range(args.repeats):
        ad = simulate_steps(model, plan, cluster, profile, args.steps, sc,
                            SimController(model, plan, cluster, profile))
        cpu.append(ad.sim_cpu_s)
        loads.append(os.getloadavg()[0])
    fixed = simulate_steps(model, plan, cluster, profile, args.steps, sc)
    unslowed = simulate_steps(model, plan, cluster, profile, 3)
    c = compare_runs(ad, fixed, unslowed, sc)
    print(f"{model.name} on {cluster.num_devices} GPUs, {PLAN}, {sc.name}, {args.steps} steps")
    print(f"from step {c.from_step}: unslowed {c.unslowed_tokens_per_s:,.0f} tokens/s, fixed plan "
          f"{c.fixed_tokens_per_s:,.0f}, adaptive {c.adaptive_tokens_per_s:,.0f}: recovered {c.recovered_frac:.1%}")
    moves = [f"step {s.step}: {s.decision}" for s in ad.steps if s.decision]
    print(f"{len(moves)} moves; final step {ad.steps[-1].step_time_s:.3f} s (unslowed "
          f"{unslowed.steps[-1].step_time_s:.3f} s, fixed {fixed.steps[-1].step_time_s:.3f} s)")
    for m in moves:
        print("  " + m[:160])
    print(f"CPU of the {args.steps}-step adaptive simulation: median {statistics.median(cpu):.2f} s over "
          f"{len(cpu)} runs ({', '.join(f'{x:.2f}' for x in cpu)}); 1-min load average "
          f"{', '.join(f'{x:.1f}' for x in loads)} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
