"""Two forked worker processes that start their timed work together (a multiprocessing
barrier, no process group), as a plan's two replicas share the host's two cores: the
harness of benchmarks/topk_gap.py and benchmarks/forward_split.py."""
from __future__ import annotations

import multiprocessing as mp


def run_pair(target, *args, timeout_s: float = 600.0) -> list:
    """Run ``target(rank, barrier, queue, *args)`` in two forked processes, each putting
    ``(rank, result)`` on the queue once; return the two results in rank order."""
    ctx = mp.get_context("fork")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, barrier, queue, *args)) for r in range(2)]
    for p in procs:
        p.start()
    out = sorted((queue.get(timeout=timeout_s) for _ in procs), key=lambda x: x[0])
    for p in procs:
        p.join()
    return [res for _, res in out]
