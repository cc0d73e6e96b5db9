"""Collective microbenchmarks: all-reduce, all-gather, reduce-scatter, broadcast and
send/recv from 4 KiB to 64 MiB over ``world`` processes, in groups of every size that
divides the world running side by side (a plan's TP or DP groups share the same cores),
printed in nccl-tests' columns (NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = size /
time, busbw = algbw x the collective's bus factor).

As nccl-tests does, back-to-back calls are timed together (a plan issues them back to
back with its compute, not each after a barrier: on a busy host, gloo's per-call cost back
to back was 5-10x the cost of one call right after a barrier, and the former is what the
runs showed); per repeat the slowest rank's mean (a collective ends when its last rank
does), then the median over repeats. torch is imported inside the functions only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from costmodel.collectives import busbw_factor

KIB, MIB = 1024, 1024 * 1024
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
    # Collectives issued right after compute (AFTER_COMPUTE_OPS at these sizes), as every
    # collective of a plan is: see after_compute_rows.
    after_compute_sizes: tuple = ()
    after_compute_ops: tuple = ()  # () = AFTER_COMPUTE_OPS
    compute_gap_s: float = 1e-3
    after_compute_calls: int = 100  # rounds per mean at most (after_compute_rows)
    # ... and fewer where a round is long, so that a stream with its call lasts about this
    # long, but never fewer than after_compute_min_calls rounds (after_compute_rows).
    after_compute_stream_s: float = 0.4
    after_compute_min_calls: int = 40
    busy_calls: int = 0  # calls of the busy-fraction stream (busy_fraction_row); 0: not measured
    straggler_reps: int = 0  # long compute phases per group size (straggler_row); 0: not measured
    posted: bool = False  # time the pipeline handoff streams in pairs (posted_rows)
    # ... the busy- and idle-sender receive streams among them too (posted_rows); else only the
    # pre-posted ping-pong that the validator's handoffs cost.
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


def _collective_call(op: str, count: int, n: int, group, first: int, nxt: int, prv: int, dev):
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
                call = _collective_call(op, count, n, group, first, nxt, prv, dev)
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


BUSY_OP = "busy_fraction"  # the row's op; its 'seconds' field holds the fraction
BUSY_BYTES = 32 * 1024  # a tensor-parallel activation of a small model


def busy_fraction_row(cfg: CollectiveConfig, n: int, group, first: int, nxt: int, prv: int, dev, world: int) -> list:
    """[BUSY_OP, n, BUSY_BYTES, fraction]: the CPU time the processes spend per second of
    wall time while they run a stream of small all-reduces back to back in groups of n
    (getrusage of the whole process, its communication threads included; mean over the
    ranks that ran it). A process waiting in a collective over gloo's TCP transport is not
    idle: the kernel copies its messages and its threads wake and poll. sim/core_sharing.py
    counts that share of a wait as occupying a core (runtime.comm_busy_fraction). Only as
    many groups run as the host has cores for (the others wait at a barrier): with more
    processes than cores each would get a share of a core at most, and the figure would
    measure the scheduler, not the transport (measured here: 0.6-0.7 with 2 processes on 2
    cores; 0.41-0.57 with 4 processes all running)."""
    import resource

    import torch
    import torch.distributed as dist

    from validate.microbench import host_cores

    def cpu_s():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    active_groups = world // n if cfg.backend == "nccl" else max(1, host_cores() // n)
    active = first // n < active_groups
    frac = torch.zeros(2, dtype=torch.float64)
    if active:
        call = _collective_call("all_reduce", BUSY_BYTES // 4 // n * n, n, group, first, nxt, prv, dev)
        for _ in range(10):
            call()
        c0, t0 = cpu_s(), time.perf_counter()
        for _ in range(cfg.busy_calls):
            call()
        frac[0], frac[1] = (cpu_s() - c0) / max(time.perf_counter() - t0, 1e-9), 1.0
    dist.barrier()
    dist.all_reduce(frac)
    return [BUSY_OP, n, BUSY_BYTES, float(frac[0] / frac[1])]


def units_in_gap(unit, gap_s: float, dev, dsync) -> int:
    """How many calls of ``unit`` (a no-argument function) take about ``gap_s`` on this
    rank (timed over 20 after 3 unmeasured), the smallest count over all ranks so that
    every rank computes the same amount."""
    import torch
    import torch.distributed as dist

    for _ in range(3):
        unit()
    t0 = time.perf_counter()
    for _ in range(20):
        unit()
    if dsync:
        dsync()
    per = (time.perf_counter() - t0) / 20
    count = torch.tensor([max(1, int(gap_s / max(per, 1e-7)))], dtype=torch.float64, device=dev)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    return int(count[0])


def gap_gemms(gap_s: float, dev, dsync):
    """(a, w, k): operands of a layer-shaped GEMM (64 tokens, 512 -> 128) and the number k
    of them that takes about ``gap_s`` (units_in_gap)."""
    import torch

    a, w = torch.randn(64, 512, device=dev), torch.randn(128, 512, device=dev)
    return a, w, units_in_gap(lambda: torch.nn.functional.linear(a, w), gap_s, dev, dsync)


# In a plan every collective follows compute: the ranks' main threads were busy on the
# cores a moment before, so the threads that carry the collective (gloo's worker and TCP
# loop threads; kernel and proxy threads elsewhere) are woken while cores may still be
# computing, and on a host whose cores all compute a woken thread can wait for the running
# one's time slice (Linux EEVDF runs the current task to its slice before a waking one,
# the RUN_TO_PARITY feature, kernel/sched/features.h). Back-to-back calls never meet that.
AFTER_COMPUTE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
AFTER_COMPUTE_SUFFIX = "_after_compute"


def gap_layers(gap_s: float, dev, dsync):
    """A no-argument function running about ``gap_s`` of the runner's own layer code (the
    width-8 GPT's forward, validate/host_draws.chain_functions: embedding, layer norms,
    attention, MLP, logits; dozens of small ops), the same number of forwards on every
    rank (units_in_gap)."""
    import torch

    from validate.host_draws import chain_functions
    plain, _ = chain_functions(torch, dev)
    j = units_in_gap(plain, gap_s, dev, dsync)

    def run():
        for _ in range(j):
            plain()
    return run


def after_compute_rows(cfg: CollectiveConfig, n: int, group, first: int, nxt: int, prv: int, dev, dsync) -> list:
    """[op + '_after_compute', n, nbytes, seconds] for AFTER_COMPUTE_OPS at each size: the
    cost one call adds to a stream of (compute, call) iterations, as a plan's rank pays it.

    Every rank first times ``after_compute_calls`` rounds of about cfg.compute_gap_s of
    the runner's layer code alone (gap_layers), then as many rounds of the same compute
    each followed by the collective; the call's cost is the difference of the two mean
    round times, the slowest rank's. The compute is a layer's small ops, as between a
    plan's collectives, not GEMMs: small ops pay more for what a call's threads did to the
    caches and the core (measured here, a 32 KiB 2-rank all-reduce added 1.53 ms to rounds
    of the width-8 GPT's forward, mean of six, against 1.39 ms to rounds of GEMMs of the
    same length).
    A plan's step is the sum of its calls, so the figure is a mean over a long stream, not
    a median: on a host whose cores time-share (a guest that halts idle vCPUs, a scheduler
    tick of a few ms) a fraction of calls wait a whole tick for a woken thread, and those
    calls are most of the mean (measured here: 32 KiB 2-rank all-reduce after 0.9 ms of
    GEMMs, median 1.2 ms, mean 1.7-1.9 ms). Measuring the whole round also counts what a
    call does to the compute around it (a peer's late start, a descheduled main thread),
    which a per-call timer misses.

    A stream has cfg.after_compute_calls rounds, or fewer where its rounds are long (groups
    of 4 processes on 2 cores: 10-20 ms a round here on 2026-12-03, against 2-4 ms for a
    pair), so that it lasts about cfg.after_compute_stream_s, never fewer than
    cfg.after_compute_min_calls rounds: those streams were 60 % of a 4-process calibration's
    after-compute launches (24 of 41 s), and what they fit (the per-rank call cost, a few
    bucket all-reduces a step for dp=4) needs no more draws than a pair's 32 KiB calls do,
    whose rounds stay at 100. The round count comes from 3 timed rounds, the fewest any
    group asked for."""
    import torch
    import torch.distributed as dist

    compute = gap_layers(cfg.compute_gap_s, dev, dsync)
    mx = torch.zeros(1, dtype=torch.float64, device=dev)
    agreed = torch.zeros(1, dtype=torch.float64, device=dev)

    def mean_round(call, calls: int) -> float:
        """The slowest rank's mean time of one round (the layers, then ``call``)."""
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            compute()
            call()
        if dsync:
            dsync()
        mx[0] = (time.perf_counter() - t0) / calls
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=group)
        return float(mx[0])

    rows = []
    for op in cfg.after_compute_ops or AFTER_COMPUTE_OPS:
        for nbytes in cfg.after_compute_sizes:
            count = nbytes // 4 // n * n
            call = _collective_call(op, count, n, group, first, nxt, prv, dev)
            call()
            agreed[0] = stream_calls(mean_round(call, 3), cfg)
            # Every group runs as many rounds (the fewest any asked for), so that no group
            # ends its stream early and times the rest of another's on freer cores.
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            calls = int(agreed[0])
            alone = mean_round(lambda: None, calls)
            with_call = mean_round(call, calls)
            rows.append([op + AFTER_COMPUTE_SUFFIX, n, count * 4, max(with_call - alone, 1e-7)])
    return rows


def stream_calls(round_s: float, cfg: CollectiveConfig) -> int:
    """Rounds of an after-compute stream whose rounds (compute and call) take ``round_s``:
    cfg.after_compute_calls, or as many as fill cfg.after_compute_stream_s when that is
    fewer, never fewer than cfg.after_compute_min_calls."""
    if round_s <= 0:
        return cfg.after_compute_calls
    fill = int(cfg.after_compute_stream_s / round_s)
    return max(min(cfg.after_compute_min_calls, cfg.after_compute_calls), min(cfg.after_compute_calls, fill))


POSTED_BUSY_OP = "send_recv_posted_busy"  # rows' 'seconds': a posted-first message's receive,
POSTED_IDLE_OP = "send_recv_posted_idle"  # its sender computing, or blocked
PREPOSTED_OP = "send_recv_preposted"  # a handoff into a receive posted before the send
PREPOSTED_CALL_OP = "send_recv_preposted_call"  # the sender's own isend call within that handoff
POSTED_BYTES = 32 * 1024  # one microbatch's activation of the validator's tiny model (1 x 64 x 128 fp32)
POSTED_LAG_ROUNDS = 4  # the receiver starts this many rounds behind, so every message is there first
POSTED_BUSY_MARGIN = 6  # the busy sender computes on for this many times the stream's rounds


def posted_rows(cfg: CollectiveConfig, dev, dsync, world: int) -> list:
    """[[POSTED_BUSY_OP, 2, POSTED_BYTES, s_busy], [POSTED_IDLE_OP, 2, POSTED_BYTES, s_idle],
    [PREPOSTED_OP, 2, POSTED_BYTES, s_preposted], [PREPOSTED_CALL_OP, 2, POSTED_BYTES, s_call]].
    The last two (gloo only; 0 elsewhere): what a handoff into a receive posted before its
    send adds to a ping-pong of compute rounds (preposted_handoff_s), as validate/pp.py's
    handoffs are, and how much of it the sender's isend call takes. The first two:
    what receiving a message its sender posted earlier adds to a stream of compute rounds,
    in pairs of ranks (world/2 pairs at once, as the pipelines of a pp x dp plan run),
    mean over the pairs. gloo's rendezvous (gloo/transport/tcp/pair.cc: the sender's bytes
    leave once the receive is posted) makes such a receive a notification to the sender's
    transport thread and the data back, so it costs what the sender is doing:

    - busy: the sender runs cfg.after_compute_calls rounds of about cfg.compute_gap_s of
      the runner's layer code (gap_layers), posting a non-blocking send after each, and
      computes on (POSTED_BUSY_MARGIN times as long, by the host's clock) while the
      receiver, POSTED_LAG_ROUNDS rounds behind, runs as many rounds each ending with a
      blocking receive of the next message;
    - idle: the sender posts every send at once and blocks until they are taken; the
      receiver runs the same rounds.
    Each is the receiver's mean round less its mean round of the compute alone.
    Without cfg.posted_busy_idle only the pre-posted rows are returned: the busy and idle
    streams (most of the 1.9 s the whole of posted_rows took here on 2026-12-03: the busy
    sender alone computes on for POSTED_BUSY_MARGIN times the stream) price a rendezvous runtime's receives
    (runtime.p2p_rendezvous), which the validator's runtime is not, so calibration times
    them in its first launch only, where the pre-posted ping-pong takes the median over
    POSTED_LAUNCHES launches (validate/microbench.py)."""
    import torch
    import torch.distributed as dist

    compute = gap_layers(cfg.compute_gap_s, dev, dsync)
    rounds, rank = cfg.after_compute_calls, dist.get_rank()
    sender, peer = rank % 2 == 0, rank + 1 if rank % 2 == 0 else rank - 1
    buf = torch.ones(POSTED_BYTES // 4, device=dev)

    def mean_round(call) -> float:
        t0 = time.perf_counter()
        for r in range(rounds):
            compute()
            call(r)
        if dsync:
            dsync()
        return (time.perf_counter() - t0) / rounds

    dist.barrier()
    base = mean_round(lambda r: None) if cfg.posted_busy_idle else 0.0
    got = torch.zeros(2, dtype=torch.float64)
    for i, busy in enumerate((True, False) if cfg.posted_busy_idle else ()):
        tag0 = i * rounds
        dist.barrier()
        if sender:
            if busy:
                t_end = time.perf_counter() + POSTED_BUSY_MARGIN * rounds * base
                works = []
                mean_round(lambda r: works.append(dist.isend(buf, peer, tag=tag0 + r)))
                while time.perf_counter() < t_end:
                    compute()
            else:
                works = [dist.isend(buf, peer, tag=tag0 + r) for r in range(rounds)]
            for w in works:
                w.wait()
        else:
            for _ in range(POSTED_LAG_ROUNDS):
                compute()
            got[i] = mean_round(lambda r: dist.irecv(buf, peer, tag=tag0 + r).wait()) - base
    got2 = torch.zeros(4, dtype=torch.float64)
    got2[:2] = got
    if dist.get_backend() == "gloo":  # NCCL runs a pair's calls in order: receives posted ahead would block its sends
        pre, call = preposted_handoff_s(compute, rounds, sender, peer, tag0=2 * rounds)
        got2[2], got2[3] = (0.0, 0.0) if sender else (pre, call)
    dist.all_reduce(got2)
    pairs = world // 2
    pre_s = max(0.0, float(got2[2]) / pairs)
    busy_idle = ([[POSTED_BUSY_OP, 2, POSTED_BYTES, max(0.0, float(got2[0]) / pairs)],
                  [POSTED_IDLE_OP, 2, POSTED_BYTES, max(0.0, float(got2[1]) / pairs)]]
                 if cfg.posted_busy_idle else [])
    return busy_idle + [[PREPOSTED_OP, 2, POSTED_BYTES, pre_s],
                        [PREPOSTED_CALL_OP, 2, POSTED_BYTES, min(pre_s, max(0.0, float(got2[3]) / pairs))]]


def preposted_handoff_s(compute, rounds: int, first: bool, peer: int, tag0: int) -> tuple[float, float]:
    """Seconds one pipeline handoff adds when its receive was posted before the send, as
    validate/pp.py posts every receive at the start of a step: a ping-pong of ``rounds``
    messages each way between this rank and ``peer``, every receive posted up front, each
    rank computing one round (``compute``) between receiving and sending, so each handoff
    is on the critical path. Returns ((round trip - the two ranks' rounds of compute) / 2,
    the mean isend call) from the rank that does not start, on which the whole exchange is
    timed; collective (both ranks of the pair call it, ``first`` on the one that starts).

    The rounds of compute taken out are timed as the ping-pong runs them: one rank of each
    pair at a time, every pair at once (``_solo_round_s``). Timed with every rank computing
    at once, as they were until 2026-12-02, a world of 4 processes on 2 cores measured its
    rounds at the cores' sharing, about twice what a ping-pong round takes with one rank of
    each pair waiting, and the handoff came out at 0 in most launches (0-262 us against
    150-625 at 2 processes), so pp=2 x dp=2's handoffs were priced at a fraction of the
    0.8-1.1 ms a send its runs measured.

    The isend call is timed apart because it is the sender's share of the handoff: with
    the receive posted, gloo's TCP pair writes the bytes from the calling thread
    (gloo/transport/tcp/pair.cc, the send path once the peer's receive is known), so the
    sender's own compute stream pays it, where the rest (the receiver's transport thread
    and its wake-up) delays only the receiver. In a ping-pong both lie on the critical
    path; in a pipeline whose sender is the slower stage only the call does (a GPipe
    trace, docs/validation-cpu.md, mechanism 22)."""
    import torch
    import torch.distributed as dist

    base = _solo_round_s(compute, rounds, first, peer, tag0 + 2 * rounds)
    buf_out = torch.ones(POSTED_BYTES // 4)
    bufs = [torch.empty(POSTED_BYTES // 4) for _ in range(rounds)]
    in_tag, out_tag = (tag0 + rounds, tag0) if first else (tag0, tag0 + rounds)
    works = [dist.irecv(bufs[r], peer, tag=in_tag + r) for r in range(rounds)]
    sends = []
    call_s = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for r in range(rounds):
        if not first:
            works[r].wait()
        compute()
        t_call = time.perf_counter()
        sends.append(dist.isend(buf_out, peer, tag=out_tag + r))
        call_s += time.perf_counter() - t_call
        if first:
            works[r].wait()
    elapsed = time.perf_counter() - t0
    for w in sends:
        w.wait()
    return max(0.0, (elapsed / rounds - 2.0 * base) / 2.0), call_s / rounds


def _solo_round_s(compute, rounds: int, first: bool, peer: int, tag: int) -> float:
    """The mean of a pair's two ranks' rounds of ``compute``, each rank timed while its
    peer waits (first ranks of every pair, then the others), as a ping-pong computes;
    known on the rank that does not start (0.0 on the other). Collective over the world."""
    import torch
    import torch.distributed as dist
    mine = torch.zeros(1, dtype=torch.float64)
    for turn in (True, False):
        dist.barrier()
        if first == turn:
            t0 = time.perf_counter()
            for _ in range(rounds):
                compute()
            mine[0] = (time.perf_counter() - t0) / rounds
    dist.barrier()
    if first:
        dist.send(mine, peer, tag=tag)
        return 0.0
    theirs = torch.zeros(1, dtype=torch.float64)
    dist.recv(theirs, peer, tag=tag)
    return float(mine[0] + theirs[0]) / 2.0


STRAGGLER_OP = "straggler"  # the row's op; its 'seconds' field holds the extra wait
STRAGGLER_BYTES = 32 * 1024
STRAGGLER_ROUNDS = 50  # a long compute phase: this many rounds of compute_gap_s (about 50 ms)


def straggler_row(cfg: CollectiveConfig, n: int, group, dev, dsync, world: int) -> list:
    """[STRAGGLER_OP, n, STRAGGLER_BYTES, seconds]: how much longer a collective waits when
    it ends a long compute phase (STRAGGLER_ROUNDS rounds of about cfg.compute_gap_s of
    GEMMs, as a backward pass is) than when it follows one such round, in groups of n
    (world/n groups at once); the mean over ranks and cfg.straggler_reps phases, less the
    mean over as many short rounds, never below 0.

    Where processes share cores (more processes than cores, a time-sliced guest), ranks
    given the same work drift apart over a long phase, by up to a scheduler slice or so
    (the scheduler is fair over its period, not within it), and the collective that
    closes the phase waits for the last; after a short round they are still in step.
    Measured here (gloo, 2026-11-30, 32 KiB all-reduce, mean of 3 launches, four
    calibrations): 1.1-1.4 ms with 2 processes on 2 cores; 6.4-9.9 ms with 4.
    sim/gradient_reducer.py adds it to the gradient reduction that closes each backward
    (runtime.straggler_us)."""
    import torch
    import torch.distributed as dist

    a, w, k = gap_gemms(cfg.compute_gap_s, dev, dsync)
    buf = torch.ones(STRAGGLER_BYTES // 4 // n * n, device=dev)

    def waits(rounds: int, reps: int) -> float:
        got = []
        for i in range(reps + 1):
            for _ in range(rounds):
                for _ in range(k):
                    torch.nn.functional.linear(a, w)
            if dsync:
                dsync()
            t = time.perf_counter()
            dist.all_reduce(buf, group=group)
            if i:  # the first phase warms up
                got.append(time.perf_counter() - t)
        return statistics.fmean(got)
    dist.barrier()
    short = waits(1, 4 * STRAGGLER_ROUNDS)
    dist.barrier()
    long = waits(STRAGGLER_ROUNDS, cfg.straggler_reps)
    extra = torch.tensor([long - short], dtype=torch.float64)
    dist.all_reduce(extra)
    return [STRAGGLER_OP, n, STRAGGLER_BYTES, max(0.0, float(extra[0]) / world)]


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
