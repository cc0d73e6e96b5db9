"""Pipeline handoffs as calibration times them, in pairs of ranks: what receiving a message
costs a stream of compute rounds when its sender posted it earlier, busy or blocked
(posted_rows), and a handoff into a receive posted before the send, as validate/pp.py's
are, with the sender's own isend call apart (preposted_handoff_s). Run by
validate/collective_bench.collective_worker; torch is imported inside the functions only.
"""
from __future__ import annotations

import time

from validate.collective_bench import CollectiveConfig
from validate.contention_bench import gap_layers


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
    got = torch.zeros(2, dtype=torch.float64, device=dev)  # NCCL reduces device tensors only
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
    got2 = torch.zeros(4, dtype=torch.float64, device=dev)
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
