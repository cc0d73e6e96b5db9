"""Collective microbenchmarks: all-reduce, all-gather, reduce-scatter, broadcast and
send/recv from 4 KiB to 64 MiB over ``world`` processes, in groups of every size that
divides the world running side by side (a plan's TP or DP groups share the same cores),
printed in nccl-tests' columns (NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = size /
time, busbw = algbw x the collective's bus factor).

As nccl-tests does, back-to-back calls are timed together (a plan issues them back to
back with its compute, not each after a barrier: on a busy host, gloo's per-call cost back
to back was 5-10x the cost of one call right after a barrier, and the former is what the
runs showed); per repeat the slowest rank's mean (a collective ends when its last rank
does), then the median over repeats. The rows timed beside compute, in the same launches,
are validate/contention_bench.py's (calls after compute, after a long phase, their CPU)
and validate/handoff_bench.py's (pipeline handoffs in pairs). torch is imported inside
the functions only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from costmodel.collectives import busbw_factor

KIB, MIB = 1024, 1024 * 1024
# The suffix of a collective's op name in the rows timed right after compute
# (validate/contention_bench.after_compute_rows): the same bytes as the op.
AFTER_COMPUTE_SUFFIX = "_after_compute"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")
# nccl-tests' sendrecv: every rank sends S to its successor and receives S from its
# predecessor; its bus factor is 1 (NVIDIA/nccl-tests, src/sendrecv.cu, SendRecvGetBw).
# costmodel.collectives has no send/recv entry, so it is defined here, once.
_SENDRECV_FACTOR = 1.0


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw of ``op`` over n ranks (nccl-tests' definition); an op timed after
    compute (AFTER_COMPUTE_SUFFIX) moves the same bytes as the op."""
    op = op.removesuffix(AFTER_COMPUTE_SUFFIX)
    return _SENDRECV_FACTOR if op == "send_recv" else busbw_factor(op, n)


def sizes_bytes(min_bytes: int = 4 * KIB, max_bytes: int = 64 * MIB) -> list[int]:
    """Message sizes from min to max, doubling (nccl-tests' -b 4K -e 64M -f 2)."""
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= 2
    return out



@dataclass
class CollectiveSample:
    op: str
    nbytes: int  # the nccl-tests 'size': the buffer each rank holds (gathered size for all-gather)
    n: int  # ranks
    seconds: float  # median over repeats of the slowest rank's time

    @property
    def count(self) -> int:
        return self.nbytes // 4  # float32 elements

    @property
    def algbw_GBps(self) -> float:
        return self.nbytes / self.seconds / 1e9

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * bus_factor(self.op, self.n)


@dataclass(frozen=True)
class CollectiveConfig:
    sizes: tuple
    ops: tuple = COLLECTIVES
    group_sizes: tuple = ()  # n of each measurement: world/n groups of n ranks at once; () = (world,)
    repeats: int = 5
    warmup: int = 1
    budget_s: float = 0.5  # stop repeating a size once this much time went into it
    target_s: float = 0.01  # a timed repeat runs back-to-back calls for about this long
    max_inner: int = 20
    threads: int = 0
    backend: str = "gloo"
    # Collectives issued right after compute (contention_bench.AFTER_COMPUTE_OPS at these
    # sizes), as every collective of a plan is: see contention_bench.after_compute_rows.
    after_compute_sizes: tuple = ()
    after_compute_ops: tuple = ()  # () = contention_bench.AFTER_COMPUTE_OPS
    compute_gap_s: float = 1e-3
    after_compute_calls: int = 100  # rounds per mean at most (after_compute_rows)
    # ... and fewer where a round is long, so that a stream with its call lasts about this
    # long, but never fewer than after_compute_min_calls rounds (after_compute_rows).
    after_compute_stream_s: float = 0.4
    after_compute_min_calls: int = 40
    # Calls of the busy-fraction stream (contention_bench.busy_fraction_row); 0: not measured.
    busy_calls: int = 0
    # Long compute phases per group size (contention_bench.straggler_row); 0: not measured.
    straggler_reps: int = 0
    posted: bool = False  # time the pipeline handoff streams in pairs (handoff_bench.posted_rows)
    # ... the busy- and idle-sender receive streams among them too (handoff_bench.posted_rows);
    # else only the pre-posted ping-pong that the validator's handoffs cost.
    posted_busy_idle: bool = True
    probe: bool = False  # first, validate/probe.py's probe (a PROBE_OP row): one more draw of the host's speed
    # ... then one draw of the per-op overhead chain (host_draws.chain_drawer; rows
    # OVERHEAD_PLAIN_OP and OVERHEAD_TRAIN_OP): one more moment of the figure that tiny
    # plans' compute depends on most.
    overhead_chain: bool = False


# The row of the speed probe taken at the start of a collective launch: [PROBE_OP, world,
# 0, seconds (median over the ranks)]; validate/microbench.py pools these draws with the
# compute worker's into the calibrated probe (validate/probe.py).
PROBE_OP = "speed_probe"
# The rows of the overhead chain's draw at the start of a collective launch: [op, world, 0,
# seconds of one plain forward / one training step of the chain (median over the ranks)].
OVERHEAD_PLAIN_OP = "overhead_plain"
OVERHEAD_TRAIN_OP = "overhead_train"


def collective_call(op: str, count: int, n: int, group, first: int, nxt: int, prv: int, dev):
    """A no-argument function making one call of collective ``op`` on ``count`` float32
    elements (the whole buffer; all-gather sends count/n, reduce-scatter keeps count/n)
    in ``group`` (None: the world) of n ranks whose first rank is ``first``; send_recv is
    a ring of simultaneous sends to ``nxt`` and receives from ``prv``."""
    import torch
    import torch.distributed as dist
    from validate.comm import tensor_collectives
    gather, scatter = tensor_collectives()
    if op == "all_gather":
        send, recv = torch.ones(count // n, device=dev), torch.empty(count, device=dev)
        return lambda: gather(recv, send, group=group)
    if op == "reduce_scatter":
        send, recv = torch.ones(count, device=dev), torch.empty(count // n, device=dev)
        return lambda: scatter(recv, send, group=group)
    if op == "all_reduce":
        buf = torch.ones(count, device=dev)
        return lambda: dist.all_reduce(buf, group=group)
    if op == "broadcast":
        buf = torch.ones(count, device=dev)
        return lambda: dist.broadcast(buf, first, group=group)
    sbuf, rbuf = torch.ones(count, device=dev), torch.empty(count, device=dev)

    def call():
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, sbuf, nxt, group),
                                       dist.P2POp(dist.irecv, rbuf, prv, group)])
        for r in reqs:
            r.wait()
    return call


def collective_worker(rank: int, world: int, cfg: CollectiveConfig) -> list:
    """One rank's collective timings: [op, n, nbytes, seconds] per group size n, op and
    size. For n < world the ranks form world/n groups of n consecutive ranks that run the
    collective at the same time (as the TP groups of a tp x dp plan do). seconds = median
    over repeats of the slowest rank's time (one extra max-reduce over all ranks per repeat,
    outside the timed region)."""
    import torch
    import torch.distributed as dist

    from validate.contention_bench import after_compute_rows, busy_fraction_row, straggler_row
    from validate.handoff_bench import posted_rows

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    from validate.bench_timing import worker_device
    dev, dsync = worker_device(cfg.backend)
    rows = []

    def median_over_ranks(values: list[float]) -> list[float]:
        """Each of this rank's ``values``, its median over every rank of the world."""
        mine = torch.tensor(values, dtype=torch.float64, device=dev)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        return [statistics.median(float(t[i]) for t in every) for i in range(len(values))]

    kind = "cuda" if dsync else "cpu"
    tail = []
    if cfg.probe:  # fresh processes, before anything else: as the runner probes its ranks
        from validate.probe import probe_in_rounds
        tail.append([PROBE_OP, world, 0, median_over_ranks([probe_in_rounds(world, kind, dev, dsync)])[0]])
    if cfg.overhead_chain:  # in rounds, as calibration's compute worker runs it
        from validate.host_draws import chain_drawer
        from validate.probe import in_rounds
        got = median_over_ranks(in_rounds(world, kind, lambda: chain_drawer(torch, dev, dsync, cfg.repeats)()))
        tail += [[op, world, 0, x] for op, x in zip((OVERHEAD_PLAIN_OP, OVERHEAD_TRAIN_OP), got)]
    for n in cfg.group_sizes or (world,):
        if n == world:
            group, first = None, 0
        else:  # every rank creates every group, in the same order (torch.distributed's rule)
            groups = [dist.new_group(list(range(i, i + n))) for i in range(0, world, n)]
            group, first = groups[rank // n], rank // n * n
        nxt, prv = first + (rank - first + 1) % n, first + (rank - first - 1) % n
        for op in cfg.ops:
            for nbytes in cfg.sizes:
                count = nbytes // 4 // n * n
                call = collective_call(op, count, n, group, first, nxt, prv, dev)
                mx = torch.zeros(1, dtype=torch.float64, device=dev)
                t0 = time.perf_counter()
                for _ in range(max(1, cfg.warmup)):
                    call()
                if dsync:
                    dsync()
                # Calls per timed repeat, agreed by all ranks (the slowest one's estimate).
                mx[0] = (time.perf_counter() - t0) / max(1, cfg.warmup)
                dist.all_reduce(mx, op=dist.ReduceOp.MAX)
                inner = max(1, min(cfg.max_inner, int(cfg.target_s / max(float(mx[0]), 1e-7))))
                times, spent = [], 0.0
                while len(times) < cfg.repeats:
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(inner):  # back to back, as nccl-tests times its iterations
                        call()
                    if dsync:
                        dsync()
                    mx[0] = (time.perf_counter() - t0) / inner
                    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
                    times.append(float(mx[0]))
                    spent += times[-1] * inner
                    if spent > cfg.budget_s and len(times) >= 3:
                        break
                rows.append([op, n, count * 4, statistics.median(times)])
        if cfg.after_compute_sizes:
            rows += after_compute_rows(cfg, n, group, first, nxt, prv, dev, dsync)
        if cfg.straggler_reps:
            rows.append(straggler_row(cfg, n, group, dev, dsync, world))
        if cfg.posted and n == 2:  # pipeline handoffs are between two ranks
            rows += posted_rows(cfg, dev, dsync, world)
        if cfg.busy_calls and n == min(cfg.group_sizes or (world,)):
            rows.append(busy_fraction_row(cfg, n, group, first, nxt, prv, dev, world))
    return rows + tail


def format_collectives(samples: list[CollectiveSample]) -> str:
    """nccl-tests' columns, one block per collective: size (B), count (elements), type,
    time (us), algbw (GB/s), busbw (GB/s)."""
    lines = []
    for op, n in dict.fromkeys((s.op, s.n) for s in samples):
        lines.append(f"# {op}, groups of {n} ranks")
        lines.append(f"{'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}")
        lines.append(f"{'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
        for s in (x for x in samples if (x.op, x.n) == (op, n)):
            lines.append(f"{s.nbytes:>12d} {s.count:>12d} {'float':>6} {s.seconds * 1e6:>10.1f} "
                         f"{s.algbw_GBps:>8.3f} {s.busbw_GBps:>8.3f}")
    return "\n".join(lines)
