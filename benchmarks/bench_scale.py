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
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import simpy  # noqa: E402

from benchmarks.reference import bare_simpy_cpu_s  # noqa: E402
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
              f"median {med[k]:.3f} CPU s over {args.n} (min {min(cpu[k]):.3f}, max {max(cpu[k]):.3f}); "
              f"engine alone {med_engine[k]:.3f}; step {step[k]:.4f} s")
    done: list[tuple[str, str, bool]] = []
    if "1k" in med and "16k" in med:
        r = med["16k"] / med["1k"]
        done.append((f"simulate 16,384 / 1,024 GPUs (gpt3-175b, CPU, topology loading included): {r:.2f}x "
                     f"(medians {med['16k']:.3f} vs {med['1k']:.3f} s; engine alone "
                     f"{med_engine['16k'] / med_engine['1k']:.2f}x)", "<= 2x", r <= 2))
    if "405b" in med:
        done.append((f"simulate llama3-405b on 16,384 H100s: {med['405b']:.3f} CPU s", "< 1 s", med["405b"] < 1))
    if "100k" in med:
        done.append((f"simulate 100,000 H100s: {med['100k']:.3f} CPU s", "< 5 s", med["100k"] < 5))
    if "1k" in keys:
        # Events are counted in a run of their own (the counter's wrapper costs time);
        # plansim's runs and bare SimPy's are then interleaved.
        c = CASES["1k"]
        cluster, model, profile, plan = _inputs(c)
        with _EventCounter() as ctr:
            simulate(model, plan, cluster, profile)
        n_ev = ctr.n
        ratios = []
        for _ in range(args.n):
            cluster, model, profile, plan = _inputs(c)
            gc.collect()
            t0 = time.process_time()
            simulate(model, plan, cluster, profile)
            t_sim = time.process_time() - t0
            ratios.append(t_sim / bare_simpy_cpu_s(n_ev))
        r = statistics.median(ratios)
        done.append((f"CPU per SimPy event, plansim / bare SimPy (1k case, {n_ev:,} events, topology load "
                     f"excluded): {r:.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})", "<= 3x", r <= 3))
    if not args.no_memory:
        # Peak resident memory of one simulation of each case, each in a fresh process
        # (interpreter and imports included), so that cases do not inherit each other's peaks.
        rss = {}
        for k in keys:
            out = subprocess.run([sys.executable, __file__, "--rss-of", k], check=True,
                                 capture_output=True, text=True).stdout.strip()
            rss[k] = float(out)
        done.append(("peak RSS per case: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in rss.items()),
                     "< 1024 MiB", max(rss.values()) < 1024))
    print(f"done-when figures of issue 11 (medians over {args.n} runs; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):")
    for text, target, met in done:
        print(f"  {text}  [target {target}: {'met' if met else 'NOT met'}]")


if __name__ == "__main__":
    main()
