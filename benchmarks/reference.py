"""A fixed reference workload measured in the same run as a benchmark, so that figures
taken on a loaded, shared machine can be read as ratios: bare SimPy processing 100,000
timeout events (100 processes, 1,000 timeouts each; the same loop bench_scale.py uses
for its per-event baseline). On a quiet 2-core machine of this project it takes about
0.09 CPU s."""
from __future__ import annotations

import time

import simpy

EVENTS = 100_000


def bare_simpy_cpu_s(n_events: int = EVENTS) -> float:
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


def reference_wall_s() -> float:
    """Wall seconds of the reference workload (for benchmarks that time subprocesses)."""
    t0 = time.perf_counter()
    bare_simpy_cpu_s()
    return time.perf_counter() - t0
