"""Benchmark: CPU cost of `simulate` as the cluster grows, as ratios measured in one run.

The machine this runs on is shared and noisy, so every figure is CPU seconds of this
process (time.process_time: the simulation is single-threaded) and the headline figures
are ratios of two cases measured in the same run, each the median of N repeats:

- scale ratio: GPT-3 175B (tp=8, pp=8, mbs=1) on 16,384 vs 1,024 A100s (dgx-a100,
  --nodes 2048 vs 128; dp=256 vs 16);
- Llama 3 405B on 16,384 H100s (dgx-h100 --nodes 2048, tp=8, pp=16, dp=128, mbs=1, with
  126 layers split 8:8:...:7:7): CPU seconds;
- 100,000 H100s (dgx-h100 --nodes 12500; Llama 3 405B with a global batch of 2,500
  sequences so that dp=625 divides it; tp=8, pp=20, 126 layers split 7x6 + 14x6): CPU s;
- per-event overhead: plansim's CPU per SimPy event (events counted by wrapping
  Environment.step) over bare SimPy's CPU per event for a loop of the same number of
  timeouts, on the 1,024-GPU case;
- peak memory: the peak resident set (VmHWM) of a fresh process that simulates one case.

    python benchmarks/bench_scale.py [N] [--cases 1k,16k,405b,100k]
"""
from __future__ import annotations

import argparse
import gc
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simpy  # noqa: E402

from costmodel.profile import load_profile  # noqa: E402
from sim.metrics import simulate  # noqa: E402
from specs.model import load_model  # noqa: E402
from specs.plan import resolve_plan  # noqa: E402
from specs.topology import load_topology  # noqa: E402


@dataclass(frozen=True)
class Case:
    key: str
    topology: str
    nodes: int
    model: str
    plan: str
    batch: int | None = None     # override of the model's global batch (sequences)


LAYERS_16 = ":".join(["8"] * 14 + ["7"] * 2)          # 126 layers over 16 stages
LAYERS_20 = ":".join(["7"] * 6 + ["6"] * 14)          # 126 layers over 20 stages
CASES = {
    "1k": Case("1k", "dgx-a100", 128, "gpt3-175b", "tp=8,pp=8,dp=16,mbs=1"),
    "16k": Case("16k", "dgx-a100", 2048, "gpt3-175b", "tp=8,pp=8,dp=256,mbs=1"),
    "405b": Case("405b", "dgx-h100", 2048, "llama3-405b", f"tp=8,pp=16,dp=128,mbs=1,layers={LAYERS_16}"),
    "100k": Case("100k", "dgx-h100", 12500, "llama3-405b", f"tp=8,pp=20,dp=625,mbs=1,layers={LAYERS_20}",
                 batch=2500),
}


def _inputs(c: Case):
    cluster = load_topology(c.topology, nodes=c.nodes)
    model = load_model(c.model)
    if c.batch is not None:
        model = replace(model, global_batch_size=c.batch)
    profile = load_profile(None, bundled=cluster.profiles)
    plan = resolve_plan(c.plan, model, cluster.num_devices)
    return cluster, model, profile, plan


class _EventCounter:
    """Counts SimPy events processed by wrapping Environment.step for the block's duration."""

    def __enter__(self):
        self.n = 0
        self._orig = simpy.Environment.step
        orig = self._orig

        def step(env):
            self.n += 1
            return orig(env)
        simpy.Environment.step = step
        return self

    def __exit__(self, *exc):
        simpy.Environment.step = self._orig


def bare_simpy_cpu_s(n_events: int) -> float:
    """CPU seconds bare SimPy needs for n_events timeouts (100 processes yielding timeouts)."""
    env = simpy.Environment()
    per = max(1, n_events // 100)

    def proc(i):
        for k in range(per):
            yield env.timeout(1.0 + (i * 7 + k) % 13)
    for i in range(100):
        env.process(proc(i))
    t0 = time.process_time()
    env.run()
    return (time.process_time() - t0) * n_events / (per * 100)


def time_case(c: Case) -> tuple[float, float, float]:
    """CPU seconds of simulate() of one case with topology loading included (as the CLI
    does) and without it (the engine alone), and its step time."""
    gc.collect()
    t0 = time.process_time()
    cluster, model, profile, plan = _inputs(c)
    t1 = time.process_time()
    res = simulate(model, plan, cluster, profile)
    t2 = time.process_time()
    return t2 - t0, t2 - t1, res.step_time_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=3)
    ap.add_argument("--cases", default="1k,16k,405b,100k")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--rss-of", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_of:
        time_case(CASES[args.rss_of])
        # VmHWM (peak RSS of this address space, kB): ru_maxrss would carry the parent's
        # peak across fork and exec on Linux.
        status = Path("/proc/self/status").read_text()
        hwm_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
        print(hwm_kb / 1024 if hwm_kb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return
    keys = args.cases.split(",")
    cpu: dict[str, list[float]] = {k: [] for k in keys}
    engine: dict[str, list[float]] = {k: [] for k in keys}
    step: dict[str, float] = {}
    for _ in range(args.n):                 # interleaved, so load changes hit all cases alike
        for k in keys:
            t, t_engine, s = time_case(CASES[k])
            cpu[k].append(t)
            engine[k].append(t_engine)
            step[k] = s
    med = {k: statistics.median(v) for k, v in cpu.items()}
    med_engine = {k: statistics.median(v) for k, v in engine.items()}
    for k in keys:
        c = CASES[k]
        print(f"{k:5s} {c.model} on {c.topology} --nodes {c.nodes} ({c.plan.split(',layers')[0]}): "
              f"median {med[k]:.2f} CPU s over {args.n} (min {min(cpu[k]):.2f}, max {max(cpu[k]):.2f}); "
              f"step {step[k]:.4f} s")
    if "1k" in med and "16k" in med:
        print(f"scale ratio 16k/1k GPUs (gpt3-175b): {med['16k'] / med['1k']:.2f}x  (target <= 2); "
              f"engine alone (topology loaded beforehand): {med_engine['16k'] / med_engine['1k']:.2f}x "
              f"({med_engine['16k']:.3f} vs {med_engine['1k']:.3f} CPU s)")
    if "1k" in keys:
        ratios = []
        for _ in range(args.n):
            c = CASES["1k"]
            cluster, model, profile, plan = _inputs(c)
            gc.collect()
            with _EventCounter() as ctr:
                t0 = time.process_time()
                simulate(model, plan, cluster, profile)
                t_sim = time.process_time() - t0
            ratios.append((t_sim / ctr.n) / (bare_simpy_cpu_s(ctr.n) / ctr.n))
            n_ev = ctr.n
        print(f"per-event CPU, plansim / bare SimPy (1k case, {n_ev:,} events, topology load excluded): "
              f"median {statistics.median(ratios):.1f}x over {args.n} (min {min(ratios):.1f}, "
              f"max {max(ratios):.1f})  (target <= 3)")
    if not args.no_memory:
        # Peak resident memory of one simulation of each case, each in a fresh process
        # (interpreter and imports included), so that cases do not inherit each other's peaks.
        for k in keys:
            out = subprocess.run([sys.executable, __file__, "--rss-of", k], check=True,
                                 capture_output=True, text=True).stdout.strip()
            print(f"peak RSS {k}: {float(out):.0f} MiB (target < 1024)")


if __name__ == "__main__":
    main()
