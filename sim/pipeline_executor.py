"""The pipeline side of one engine run: each simulated pipeline rank's compute stream
runs its schedule's action list in order (forward and backward work, tensor-parallel
collectives on the critical path), and sends activations and their gradients to the
neighbour stage as flows beside it.

Waits on the compute stream are classified so that a rank's breakdown sums to the step
time: waiting for a neighbour whose compute had not finished is pipeline bubble; waiting
after it had finished is exposed pipeline communication ('pp'); waiting for gradient
reduction or ZeRO gathers is exposed data-parallel communication ('dp'); waiting for
other, slower replicas before the reduction can start is 'idle'.
"""
from __future__ import annotations

from typing import NamedTuple

import simpy

from sim import collective_flows as cf
from sim.accountant import RankKey, StepAccountant
from sim.calls import EnginePart
from sim.program import group_kind
from sim.flownet import FlowNetwork
from sim.gradient_reducer import GradientReducer
from sim.program import Program


class Handoff(NamedTuple):
    """Microbatch ``mb``'s activation ('F') or activation gradient ('B') leaving virtual
    stage ``vstage`` of simulated class ``pipeline``: what the next stage waits for."""

    pipeline: int
    direction: str
    vstage: int
    mb: int


class PipelineExecutor(EnginePart):
    def __init__(self, env: simpy.Environment, net: FlowNetwork, program: Program,
                 accountant: StepAccountant, reducer: GradientReducer):
        super().__init__(env, net, program, accountant)
        self.reducer = reducer
        self.p, self.v = self.plan.pp, self.plan.vpp
        self.V = self.p * self.v
        # Cross-rank dependencies: arrival events and the time the producer finished.
        self._arrive: dict[Handoff, simpy.Event] = {}
        self._produced: dict[Handoff, float] = {}
        # Per (pipeline, source stage, destination stage): the send's path, its
        # multiplicity map (the TP peers and identical replicas that send alongside) and
        # the call latency, built once and reused for every microbatch.
        self._p2p_routes: dict[tuple[int, int, int], tuple] = {}
        # Share of compute speed lost per second a stage's gradient collectives overlap
        # it (profile fabrics.<kind>.compute_slowdown of the DP group's fabric).
        self._dp_slowdown = [program.profile.fabric(group_kind(self.cluster, self.plan.dp_group(s, 0))).compute_slowdown
                             for s in range(self.p)]

    # ------------------------------------------------------------ time on the compute stream
    def _busy(self, key: RankKey, cat: str, dt: float, label: str):
        t0 = self.env.now
        s = key[1]
        busy0 = self.acct.dp_busy_s(s, t0)
        if dt > 0:
            yield self.env.timeout(dt)
        self.acct.seg(key, "compute", cat, t0, self.env.now, label)
        if cat == "compute" and dt > 0 and self._dp_slowdown[s] > 0:
            overlap = self.acct.dp_busy_s(s, self.env.now) - busy0
            if overlap > 0:
                # Gradient collectives overlapped this kernel for `overlap` seconds; their
                # communication kernels took SMs and memory bandwidth, costing
                # compute_slowdown x overlap (profile fabrics.<kind>.compute_slowdown).
                # That loss is a cost of data-parallel communication: booked as 'dp'.
                t1 = self.env.now
                yield self.env.timeout(overlap * self._dp_slowdown[s])
                self.acct.seg(key, "compute", "dp", t1, self.env.now, f"{label} (slowed by DP comm)")

    def _wait(self, key: RankKey, ev: simpy.Event, cat: str, label: str):
        """Wait for ``ev`` on the compute stream, booking the wait under ``cat``."""
        t0 = self.env.now
        if not ev.triggered:
            yield ev
        self.acct.seg(key, "compute", cat, t0, self.env.now, label)

    # ------------------------------------------------------------ pipeline transfers
    def _event(self, k: Handoff) -> simpy.Event:
        ev = self._arrive.get(k)
        if ev is None:
            ev = self._arrive[k] = self.env.event()
        return ev

    def _wait_dep(self, key: RankKey, k: Handoff, label: str):
        """Wait for an arrival; split the wait into bubble (producer still computing)
        and exposed pipeline communication (data in flight)."""
        ev = self._event(k)
        t0 = self.env.now
        if not ev.triggered:
            yield ev
        t1 = self.env.now
        tp = self._produced.get(k, t1)
        split = min(max(tp, t0), t1)
        self.acct.seg(key, "compute", "bubble", t0, split, f"wait {label}")
        self.acct.seg(key, "compute", "pp", split, t1, f"recv {label}")

    def _send(self, pi: int, src_stage: int, dst_stage: int, nbytes: float, k: Handoff, label: str) -> None:
        """Point-to-point of one microbatch's activations (or gradients); the TP peers
        and identical replicas send alongside, so their flows share the links."""
        ev = self._event(k)
        self._produced[k] = self.env.now
        if src_stage == dst_stage or nbytes <= 0:
            ev.succeed()
            return
        route = self._p2p_routes.get((pi, src_stage, dst_stage))
        if route is None:
            pipe = self.prog.pipelines[pi]
            src, dst = pipe.ranks[src_stage], pipe.ranks[dst_stage]
            d0 = pipe.dp_indices[0]
            replicas = tuple((self.plan.rank(d, src_stage, t), self.plan.rank(d, dst_stage, t))
                             for d in pipe.dp_indices for t in range(self.plan.tp) if (d, t) != (d0, 0))
            route = self._p2p_routes[(pi, src_stage, dst_stage)] = (
                *cf.p2p_route(self.net, self.cluster.route, src, dst, replicas), self.call_latency_s([src, dst]))
        # One flow: the call's software cost and the path latency in one timeout, then
        # the bytes; the arrival event is the flow's own (no process, no forwarding).
        path, mult, call_s = route
        self.net.transfer(path, nbytes, mult, latency_steps=1, label=label, delay_s=call_s, event=ev)
        if self.acct.record:
            key, t_start = RankKey(pi, src_stage), self.env.now
            ev.callbacks.append(lambda _e: self.acct.seg(key, "pp", "send", t_start, self.env.now, label))

    def _wait_sent(self, key: RankKey, k: Handoff, label: str):
        """Blocking pipeline send (Program.p2p_blocking, e.g. DeepSpeed's pipeline engine):
        the sender computes on only once its transfer is done; the wait is exposed 'pp'."""
        yield from self._wait(key, self._event(k), "pp", f"send {label}")

    def _grad_ready(self, key: RankKey, stage: int, chunk: int, j: int):
        """A gradient bucket is complete. With top-k compression the device first adds
        the error-feedback residual and selects the top k: GPU kernels on the compute
        stream, so they delay the rest of backward (not hidden on the comm stream)."""
        if self.plan.topk_fraction is not None:
            t = self.reducer.compress_time_s(key, stage, chunk)
            yield from self._busy(key, "compute", t, f"top-k compress c{chunk}b{j}")
        self.reducer.bucket_ready(stage, chunk, j)

    # ------------------------------------------------------------ the compute stream
    def compute_stream(self, pi: int, s: int):
        pipe = self.prog.pipelines[pi]
        key = RankKey(pi, s)
        actions = pipe.actions[s]
        last_b = {}
        for idx, a in enumerate(actions):
            if a.kind == "B":
                last_b[a.chunk] = idx
        overlap = self.plan.overlap_grad_reduce and self.plan.zero < 3
        zero3 = self.plan.zero == 3 and self.plan.dp > 1
        gathers, scatters = {}, []
        if zero3:
            gathers[0] = self.reducer.zero3_gather(pi, s, actions[0])
        for idx, a in enumerate(actions):
            vs = a.chunk * self.p + s
            w = pipe.chunks[(s, a.chunk)]
            if zero3:
                if idx + 1 < len(actions):  # prefetch the next action's weights
                    gathers[idx + 1] = self.reducer.zero3_gather(pi, s, actions[idx + 1])
                yield from self._wait(key, gathers.pop(idx), "dp", "zero3 gather")
            label = f"{a.kind}{a.mb} c{a.chunk}"
            if a.kind == "F":
                if vs > 0:
                    yield from self._wait_dep(key, Handoff(pi, "F", vs - 1, a.mb), label)
                yield from self._forward(key, a, w, label)
                yield from self._busy(key, "tp", w.fwd_tp_s, f"tp {label}")
                if vs < self.V - 1:
                    out = Handoff(pi, "F", vs, a.mb)
                    self._send(pi, s, (vs + 1) % self.p, w.p2p_bytes, out, f"act {label}")
                    if self.prog.p2p_blocking:
                        yield from self._wait_sent(key, out, f"act {label}")
                else:
                    self._produced[Handoff(pi, "F", vs, a.mb)] = self.env.now
            else:
                if vs < self.V - 1:
                    yield from self._wait_dep(key, Handoff(pi, "B", vs + 1, a.mb), label)
                buckets = w.grad_buckets if (idx == last_b[a.chunk] and overlap) else ()
                if buckets:
                    # Gradients of the last microbatch complete layer by layer: bucket j
                    # is ready after (j+1)/K of this backward pass.
                    k = len(buckets)
                    for j in range(k):
                        yield from self._busy(key, "compute", w.bwd_s / k, label)
                        yield from self._busy(key, "tp", w.bwd_tp_s / k, f"tp {label}")
                        yield from self._grad_ready(key, s, a.chunk, j)
                else:
                    yield from self._busy(key, "compute", w.bwd_s, label)
                    yield from self._busy(key, "tp", w.bwd_tp_s, f"tp {label}")
                if zero3:
                    scatters.append(self.reducer.zero3_reduce_scatter(s, w))
                if vs > 0:
                    out = Handoff(pi, "B", vs, a.mb)
                    self._send(pi, s, (vs - 1) % self.p, w.p2p_bytes, out, f"grad {label}")
                    if self.prog.p2p_blocking:
                        yield from self._wait_sent(key, out, f"grad {label}")
        if not overlap and not zero3:
            for c in range(self.v):
                for j in range(len(pipe.chunks[(s, c)].grad_buckets)):
                    yield from self._grad_ready(key, s, c, j)
        if scatters:  # ZeRO-3: the last microbatches' gradient reduce-scatters
            t0 = self.env.now
            yield self.env.all_of(scatters)
            self.acct.seg(key, "compute", "dp", t0, self.env.now, "zero3 reduce-scatter")
        yield from self._finish_step(key, pi, s)

    def _forward(self, key: RankKey, a, w, label: str):
        """The forward compute of action ``a`` on chunk work ``w`` (a hook: the multi-step
        engine, sim/multistep_executor.py, gates the next step's first forward layer by layer)."""
        yield from self._busy(key, "compute", w.fwd_s, label)

    def _finish_step(self, key: RankKey, pi: int, s: int):
        """After the last backward: wait for the stage's gradient reduction, run the
        optimizer (and ZeRO-1/2's parameter gather); the rank is then done with the step.
        A hook: the multi-step engine's cross-step overlap replaces it."""
        pipe = self.prog.pipelines[pi]
        # Wait for this stage's gradient reduction; time before the first bucket could
        # start (slower replicas) is idle, the rest is exposed DP communication.
        t0 = self.env.now
        reduced = self.reducer.stage_reduced(s)
        if not reduced.triggered:
            yield reduced
        first = self.reducer.first_start(s, self.env.now)
        split = min(max(first, t0), self.env.now)
        self.acct.seg(key, "compute", "idle", t0, split, "wait replicas")
        self.acct.seg(key, "compute", "dp", split, self.env.now, "grad reduce")
        yield from self._busy(key, "compute", pipe.optimizer_s[s], "optimizer")
        if self.plan.zero in (1, 2) and self.plan.dp > 1:
            # Sharded optimizer: gather the updated weights once every replica is done.
            gathered = self.reducer.optimizer_done(pi, s)
            t0 = self.env.now
            yield gathered
            self.acct.seg(key, "compute", "dp", t0, self.env.now, "param all-gather")
        self.acct.finished(key)
