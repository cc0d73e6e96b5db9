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

from collections import deque
from typing import NamedTuple

import simpy

from sim import collective_flows as cf
from sim.accountant import RankKey, StepAccountant
from sim.calls import EnginePart
from sim.context_parallel import ContextParallelExchange
from sim.core_sharing import cores_saturated
from costmodel.estimate import closing_straggler_s
from costmodel.profile import reshard_after_forward
from sim.tp_comm import group_kind
from sim.flownet import FlowNetwork
from sim.gradient_reducer import GradientReducer
from sim.program import Program


class Handoff(NamedTuple):
    """Microbatch ``mb``'s activation ('F') or activation gradient ('B') leaving virtual
    stage ``vstage`` of simulated class ``pipeline``: what the next stage waits for. The
    compute stream keys its dictionaries with plain tuples of these four fields (equal
    and hashed alike, and cheaper to build)."""

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
        # Per (pipeline, source stage, destination stage): ((path, multiplicity map, call
        # latency), the flow's weights, its start delay in s), built once and reused for
        # every microbatch (the map counts the TP peers and identical replicas that send
        # alongside).
        self._p2p_routes: dict[tuple[int, int, int], tuple] = {}
        # Rendezvous transfers (Program.p2p_rendezvous): the send was posted (event) with
        # (bytes, route, label); the receiver starts the transfer when it posts its receive.
        self._posted: dict[Handoff, simpy.Event] = {}
        self._pending: dict[Handoff, tuple] = {}
        # Ranks inside an action's compute now: a rendezvous receive of a message posted
        # earlier costs what its sender is doing (_rendezvous_recv).
        self._computing: set[RankKey] = set()
        # (pipeline, stage) -> backward finished, for the tied-embedding all-reduce.
        self._emb_done: dict[tuple[int, int], simpy.Event] = {}
        # Share of compute speed lost per second a stage's gradient collectives overlap
        # it (profile fabrics.<kind>.compute_slowdown of the DP group's fabric).
        self._dp_slowdown = [program.profile.fabric(group_kind(self.cluster, self.plan.grad_group(s, 0))).compute_slowdown
                             for s in range(self.p)]
        self.cp = ContextParallelExchange(env, net, program, accountant) if self.plan.cp > 1 else None
        # Whether a collective started beside compute runs only while its rank waits
        # (sim/core_sharing.cores_saturated): ZeRO-3's gathers, the CP ring's exchanges.
        self._comm_blocks = cores_saturated(self.cluster, program.profile)

    # ------------------------------------------------------------ time on the compute stream
    def _busy(self, key: RankKey, cat: str, dt: float, label: str):
        t0 = self.env.now
        busy0 = self.acct.dp_busy_s(key[1], t0)
        if dt > 0:
            yield self.env.timeout(dt)
        self.acct.seg(key, "compute", cat, t0, self.env.now, label)
        if cat == "compute" and dt > 0:
            slow = self._slowdown_s(key[1], busy0)
            if slow > 0:
                yield from self._slowed(key, slow, label)

    def _slowdown_s(self, s: int, busy0: float) -> float:
        """Seconds a compute kernel of stage ``s`` that ends now is slowed by the stage's
        gradient collectives, which had run ``busy0`` seconds when it began (0 if none
        overlapped it)."""
        if self._dp_slowdown[s] > 0:
            overlap = self.acct.dp_busy_s(s, self.env.now) - busy0
            if overlap > 0:
                # Gradient collectives overlapped this kernel for `overlap` seconds; their
                # communication kernels took SMs and memory bandwidth, costing
                # compute_slowdown x overlap (profile fabrics.<kind>.compute_slowdown).
                # That loss is a cost of data-parallel communication: booked as 'dp'.
                return overlap * self._dp_slowdown[s]
        return 0.0

    def _slowed(self, key: RankKey, slow: float, label: str):
        t1 = self.env.now
        yield self.env.timeout(slow)
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

    def _arrived(self, key: RankKey, k: Handoff, t0: float, label: str) -> None:
        """Book the compute stream's wait since ``t0`` for arrival ``k`` (there now):
        bubble while the producer was still computing, exposed pipeline communication
        ('pp') after (the data in flight)."""
        t1 = self.env.now
        tp = self._produced.get(k, t1)
        split = min(max(tp, t0), t1)
        rec = self.acct.record
        self.acct.seg(key, "compute", "bubble", t0, split, f"wait {label}" if rec else "")
        self.acct.seg(key, "compute", "pp", split, t1, f"recv {label}" if rec else "")

    def _rendezvous_recv(self, key: RankKey, k: Handoff, label: str):
        """Receive under rendezvous semantics (Program.p2p_rendezvous): the sender's bytes
        leave only once the receiver has posted its receive. gloo's TCP transport does
        this (gloo/transport/tcp/pair.cc: Pair::send queues an unbound-buffer send in
        localPendingSend_ until the peer's NOTIFY_RECV_READY arrives, and
        Pair::handleRemotePendingRecv then writes it), so a receive posted after the send
        pays a notification hop plus the data hop; one posted before it, the data hop
        only. Where the profile measured the first case whole (FabricEfficiency.
        send_recv_posted_busy_us / _idle_us), it costs what the sender is doing when the
        receive is posted: computing, its transport thread waits for a core; blocked or
        done, it answers at once. The wait for the sender to post is bubble, the transfer
        exposed 'pp'."""
        t0 = self.env.now
        posted = self._posted_event(k)
        if not posted.triggered:
            yield posted
        t1 = self.env.now
        self.acct.seg(key, "compute", "bubble", t0, t1, f"wait {label}")
        ev = self._event(k)
        if not ev.triggered:
            nbytes, route, lbl = self._pending[k]
            if route is None:
                ev.succeed()
            else:
                path, mult, call_s, posted_s = route
                src = RankKey(k[0], k[2] % self.p)  # the sender: (pipeline, vstage % p)
                steps = 1 if t1 > t0 else 2  # receive posted first: the notification is already there
                if steps == 2 and posted_s is not None:  # (busy s, idle s), measured whole
                    steps, call_s = 0, posted_s[0] if src in self._computing else posted_s[1]
                self.net.transfer(path, nbytes, mult, latency_steps=steps, label=lbl, delay_s=call_s, event=ev)
                if self.acct.record:
                    ev.callbacks.append(lambda _e: self.acct.seg(src, "pp", "send", t1, self.env.now, lbl))
            yield ev
        self.acct.seg(key, "compute", "pp", t1, self.env.now, f"recv {label}")

    def _posted_event(self, k: Handoff) -> simpy.Event:
        ev = self._posted.get(k)
        if ev is None:
            ev = self._posted[k] = self.env.event()
        return ev

    def _send(self, pi: int, src_stage: int, dst_stage: int, nbytes: float, k: Handoff, label: str) -> float:
        """Point-to-point of one microbatch's activations (or gradients); the TP peers
        and identical replicas send alongside, so their flows share the links. Returns
        the seconds the sender's compute stream spends in the call
        (FabricEfficiency.send_recv_preposted_call_us; 0 without it)."""
        ev = self._arrive.get(k)
        if ev is None:
            ev = self._arrive[k] = self.env.event()
        self._produced[k] = self.env.now
        if src_stage == dst_stage or nbytes <= 0:
            if self.prog.p2p_rendezvous:
                self._pending[k] = (0.0, None, label)
                self._posted_event(k).succeed()
            else:
                ev.succeed()
            return 0.0
        route = self._p2p_routes.get((pi, src_stage, dst_stage))
        if route is None:
            pipe = self.prog.pipelines[pi]
            src, dst = pipe.ranks[src_stage], pipe.ranks[dst_stage]
            # rank() is affine (Plan.rank_strides): the replica of (d, t, c) sends from
            # base + sd*d + st*t + sc*c to that plus the stages' offset; same order as
            # calling rank() per replica (thousands of calls at 16k GPUs). The simulated
            # pair (d0, 0, 0) comes first and is dropped.
            sd, ss, st, sc = self.plan.rank_strides()
            base = self.plan.rank(0, src_stage, 0, 0)
            inner = [sc * c + st * t for c in range(self.plan.cp) for t in range(self.plan.tp)]
            srcs = [b + o for b in [base + sd * d for d in pipe.dp_indices] for o in inner][1:]
            replicas = list(zip(srcs, map((ss * (dst_stage - src_stage)).__add__, srcs)))
            path, mult = cf.p2p_route(self.net, self.cluster.route, src, dst, replicas)
            call_s = self.call_latency_s([src, dst], "send_recv")
            fab = self.prog.profile.fabric(group_kind(self.cluster, [src, dst]))
            busy_us, idle_us = fab.send_recv_posted_busy_us, fab.send_recv_posted_idle_us
            posted_s = None if busy_us is None or idle_us is None else (busy_us * 1e-6, idle_us * 1e-6)
            weights, latency = self.net.prepare(path, mult)
            # The flow's start delay: the call's software cost, then one path latency
            # (transfer's latency * latency_steps + delay_s with one step); or, where the
            # profile measured a handoff into a receive posted first whole
            # (FabricEfficiency.send_recv_preposted_us), that alone.
            # The sender's isend call (send_recv_preposted_call_us) is part of that
            # handoff: the sender's compute stream pays it as well (compute_stream), while
            # the message still arrives the whole handoff after the sender finished
            # computing, as in the ping-pong both were measured in.
            pre_us = fab.send_recv_preposted_us
            sender_s = 0.0 if pre_us is None else (fab.send_recv_preposted_call_us or 0.0) * 1e-6
            delay = latency * 1 + call_s if pre_us is None else pre_us * 1e-6
            # (path, multiplicity, call latency, posted-first costs) for the rendezvous
            # receiver; the flow's weights; its start delay; the sender's call.
            route = self._p2p_routes[(pi, src_stage, dst_stage)] = (
                (path, mult, call_s, posted_s), weights, delay, sender_s)
        # One flow: the call's software cost and the path latency in one timeout, then
        # the bytes; the arrival event is the flow's own (no process, no forwarding).
        if self.prog.p2p_rendezvous:  # the receiver starts the transfer (_rendezvous_recv)
            self._pending[k] = (nbytes, route[0], label)
            self._posted_event(k).succeed()
            return 0.0
        self.net.start(route[1], route[2], nbytes, ev, label)
        if self.acct.record:
            key, t_start = RankKey(pi, src_stage), self.env.now
            ev.callbacks.append(lambda _e: self.acct.seg(key, "pp", "send", t_start, self.env.now, label))
        return route[3]

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

    def _forward_gathering(self, key: RankKey, pi: int, s: int, chunk: int, w, label: str, first_f: dict):
        """The first forward of ``chunk`` with the overlapped parameter gather (Megatron-Core
        --overlap-param-gather): before the layers of bucket j it waits for bucket j's
        all-gather (exposed 'dp'), then dispatches the next bucket's (the next chunk's
        bucket 0 after the last), and computes those layers. The gather is the one the
        previous step's optimizer left to this forward; in a steady state of identical
        steps, simulating it at the start of this step is the same."""
        k = max(1, len(w.grad_buckets))
        order = sorted(first_f, key=first_f.get)
        nxt = order[order.index(chunk) + 1] if order.index(chunk) + 1 < len(order) else None
        for j in range(k):
            yield from self._wait(key, self.reducer.param_gather_bucket(s, chunk, j), "dp", f"param gather c{chunk}b{j}")
            if j + 1 < k:
                self.reducer.param_gather_bucket(s, chunk, j + 1)
            elif nxt is not None:
                self.reducer.param_gather_bucket(s, nxt, 0)
            yield from self._compute(key, pi, s, w, False, w.fwd_s / k, label, parts=k)

    # ------------------------------------------------------------ context parallelism
    def _compute(self, key: RankKey, pi: int, s: int, w, backward: bool, dt: float, label: str, parts: int = 1):
        """``dt`` seconds of a chunk's forward or backward compute (1/parts of it when the
        backward is cut into gradient buckets). With context parallelism the core
        attention in it runs as cp block steps beside the K/V exchange (ring) or after
        the all-to-all (a2a); the exposed exchange is booked as 'cp'."""
        block = (w.cp_bwd_block_s if backward else w.cp_fwd_block_s) / parts
        if self.cp is None or block <= 0:
            yield from self._busy(key, "compute", dt, label)
            return
        cp = self.plan.cp
        nbytes = (w.cp_bwd_bytes if backward else w.cp_fwd_bytes) / parts
        yield from self._busy(key, "compute", dt - cp * block, label)
        if not self.cp.ring:
            ex = self.cp.exchange(pi, s, nbytes, f"a2a {label}")
            yield from self._wait(key, ex, "cp", f"cp a2a {label}")
            yield from self._busy(key, "compute", cp * block, f"attn {label}")
            return
        if self._comm_blocks:
            # Every core computing (sim/core_sharing.cores_saturated): an exchange started
            # beside a block makes next to no progress, so each layer's ring step is sent
            # and waited for before its block computes, one call per layer and step as the
            # runner makes them (validate/cp.py).
            layers = max(1, round(w.layers / parts))
            for _ in range(layers):
                for i in range(cp):
                    if i < cp - 1:
                        ex = self.cp.exchange(pi, s, nbytes / layers, f"kv{i + 1} {label}")
                        yield from self._wait(key, ex, "cp", f"cp kv{i + 1} {label}")
                    yield from self._busy(key, "compute", block / layers, f"attn{i} {label}")
            return
        for i in range(cp):
            ex = self.cp.exchange(pi, s, nbytes, f"kv{i + 1} {label}") if i < cp - 1 else None
            yield from self._busy(key, "compute", block, f"attn{i} {label}")
            if ex is not None:
                yield from self._wait(key, ex, "cp", f"cp kv{i + 1} {label}")

    def _embedding_sync(self, key: RankKey, pi: int, s: int, dt: float):
        """The tied embedding's gradient all-reduce between the first and the last stage
        (sim/program.embedding_grad_sync_s): it starts once both have finished backward;
        waiting for the other is idle, the call 'dp'. Like the gradient reduction that
        closes a backward (sim/gradient_reducer.py), it also waits for the stage that
        drifted behind over it where processes share cores (runtime.straggler_us,
        costmodel/estimate.closing_straggler_s over its group of two), booked as 'dp': the
        runner times that wait inside the all-reduce (docs/validation-cpu.md mechanism 33)."""
        ev = self._emb_done.setdefault((pi, s), self.env.event())
        ev.succeed()
        other = self._emb_done.setdefault((pi, self.p - 1 if s == 0 else 0), self.env.event())
        yield from self._wait(key, other, "idle", "wait embedding peer")
        lag = closing_straggler_s(self.prog.profile.runtime.straggler_us, 2, 0)
        if lag > 0:
            yield from self._busy(key, "dp", lag, "embedding grads: the stage that drifted")
        yield from self._busy(key, "dp", dt, "embedding grads all-reduce")

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
        zero3 = self.plan.zero == 3 and self.plan.grad_degree > 1
        scatters = []
        fsdp = _LayerGathers(self, pi, s, actions, scatters) if zero3 else None
        # Overlapped parameter gather: the first forward of each chunk waits bucket by bucket.
        early = self.prog.overlap_param_gather
        first_f = {}
        for idx, a in enumerate(actions):
            if a.kind == "F":
                first_f.setdefault(a.chunk, idx)
        if early:
            self.reducer.param_gather_bucket(s, actions[first_f[0]].chunk if first_f else 0, 0)
        # This loop runs for every action of every simulated rank: the plain case (one
        # compute kernel and the TP collectives, no context parallelism, no hook of a
        # subclass) is _busy written out here, and labels are built only when recorded.
        env, acct = self.env, self.acct
        rec, seg, timeout = acct.record, acct.seg, env.timeout
        p, last_vs = self.p, self.V - 1
        arrive = self._arrive
        rendezvous, blocking = self.prog.p2p_rendezvous, self.prog.p2p_blocking
        inline = self.cp is None and type(self)._forward is PipelineExecutor._forward
        slowed = self._dp_slowdown[s] > 0   # else the DP busy time is never read (_slowdown_s)
        works = [pipe.chunks[(s, c)] for c in range(self.v)]
        for idx, a in enumerate(actions):
            chunk, mb, kind = a.chunk, a.mb, a.kind
            fwd = kind == "F"
            vs = chunk * p + s
            w = works[chunk]
            label = f"{kind}{mb} c{chunk}" if rec else ""
            # The input: the previous virtual stage's activation, or the next one's gradient.
            src = vs - 1 if fwd else vs + 1
            if 0 <= src <= last_vs:
                k = (pi, kind, src, mb)      # a Handoff
                if rendezvous:
                    yield from self._rendezvous_recv(key, k, label)
                else:
                    ev = arrive.get(k)
                    if ev is None:
                        ev = arrive[k] = env.event()
                    if not ev.triggered:     # (else it is there: nothing to book)
                        t0 = env.now
                        yield ev
                        self._arrived(key, k, t0, label)
            if rendezvous:
                self._computing.add(key)
            tp_s = w.fwd_tp_s if fwd else w.bwd_tp_s
            work = None                      # a generator for the cases _busy does not cover
            if fwd:
                if fsdp is not None:
                    work = fsdp.run(key, w, False, label)
                elif early and first_f.get(chunk) == idx:
                    work = self._forward_gathering(key, pi, s, chunk, w, label, first_f)
                elif not inline:
                    work = self._forward(key, a, w, label)
            elif idx == last_b[chunk] and overlap and w.grad_buckets:
                work, tp_s = self._backward_buckets(key, pi, s, chunk, w, label), None
            elif fsdp is not None:
                work = fsdp.run(key, w, True, label)
            elif not inline:
                work = self._compute(key, pi, s, w, True, w.bwd_s, label)
            if work is not None:
                yield from work
            else:                            # _busy(key, "compute", dt, label)
                dt = w.fwd_s if fwd else w.bwd_s
                t0 = env.now
                busy0 = acct.dp_busy_s(s, t0) if slowed else 0.0
                if dt > 0:
                    yield timeout(dt)
                seg(key, "compute", "compute", t0, env.now, label)
                if slowed and dt > 0:
                    slow = self._slowdown_s(s, busy0)
                    if slow > 0:
                        yield from self._slowed(key, slow, label)
            if tp_s is not None:             # _busy(key, "tp", tp_s, ...): never slowed
                t0 = env.now
                if tp_s > 0:
                    yield timeout(tp_s)
                seg(key, "compute", "tp", t0, env.now, f"tp {label}" if rec else "")
            if rendezvous:
                self._computing.discard(key)
            # The output: this activation to the next virtual stage, or this gradient to
            # the previous one (the last stage's forward output stays: the loss).
            dst = vs + 1 if fwd else vs - 1
            if 0 <= dst <= last_vs:
                out = (pi, kind, vs, mb)     # a Handoff
                what = (f"act {label}" if fwd else f"grad {label}") if rec else ""
                sender_s = self._send(pi, s, dst % p, w.p2p_bytes, out, what)
                if sender_s > 0:             # the isend call on this stream (_send)
                    yield from self._busy(key, "pp", sender_s, f"send {what}" if rec else "")
                if blocking:
                    yield from self._wait_sent(key, out, what)
            elif fwd:
                self._produced[(pi, kind, vs, mb)] = env.now
        if pipe.embedding_sync_s > 0 and s in (0, self.p - 1):
            yield from self._embedding_sync(key, pi, s, pipe.embedding_sync_s)
        if not overlap and not zero3:
            for c in range(self.v):
                for j in range(len(pipe.chunks[(s, c)].grad_buckets)):
                    yield from self._grad_ready(key, s, c, j)
        if scatters:  # ZeRO-3: the last microbatches' gradient reduce-scatters
            t0 = self.env.now
            yield self.env.all_of(scatters)
            self.acct.seg(key, "compute", "dp", t0, self.env.now, "zero3 reduce-scatter")
        yield from self._finish_step(key, pi, s)

    def _backward_buckets(self, key: RankKey, pi: int, s: int, chunk: int, w, label: str):
        """The last backward of ``chunk`` with overlapped gradient reduction: its gradients
        complete layer by layer, so bucket j is ready after (j+1)/K of the pass (compute
        and TP collectives)."""
        k = len(w.grad_buckets)
        for j in range(k):
            yield from self._compute(key, pi, s, w, True, w.bwd_s / k, label, k)
            yield from self._busy(key, "tp", w.bwd_tp_s / k, f"tp {label}")
            yield from self._grad_ready(key, s, chunk, j)

    def _forward(self, key: RankKey, a, w, label: str):
        """The forward compute of action ``a`` on chunk work ``w`` (a hook: the multi-step
        engine, sim/multistep_executor.py, gates the next step's first forward layer by layer)."""
        yield from self._compute(key, key.pipeline, key.stage, w, False, w.fwd_s, label)

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
        if self.plan.zero in (1, 2) and self.plan.grad_degree > 1 and not self.prog.overlap_param_gather:
            # Sharded optimizer: gather the updated weights once every replica is done.
            gathered = self.reducer.optimizer_done(pi, s)
            t0 = self.env.now
            yield gathered
            self.acct.seg(key, "compute", "dp", t0, self.env.now, "param all-gather")
        self.acct.finished(key)


class _LayerGathers:
    """ZeRO-3 / FSDP with prefetch, one unit at a time (FSDP wraps each transformer block:
    TorchTitan's apply_fsdp, torchtitan/models/llama3/infra/parallelize.py; DeepSpeed's
    ZeRO-3 prefetches by module too): the all-gather of the next unit's weights starts
    when a unit starts computing, so it hides behind that unit's compute; a unit waits
    only for what its own gather has left. The sequence of units runs on across actions
    (the last unit of one action prefetches the first of the next). After each unit's
    backward its gradients are reduce-scattered. A chunk's weights outside its layers
    (the embedding, the final norm and output layer) are a unit of their own, gathered
    before the chunk's layers in forward and backward: FSDP's root unit (TorchTitan's
    fully_shard of the whole model after its blocks; PyTorch FSDP paper, Zhao et al.
    2023, Sec. 3.2: the root's parameters are what no wrapped submodule holds); its
    compute is the chunk's, so nothing hides its gather but the previous unit's compute.
    The runtime says how far ahead it gathers (fsdp_prefetch_layers, at least one unit)
    and whether a gathered unit is freed after its forward (re-gathered for every use) or
    kept for the rest of the step (gathered once per step: TorchTitan with pp > 1,
    costmodel/profile.reshard_after_forward). Where the host's cores are all computing
    (sim/core_sharing.cores_saturated: CPU worker processes, as many as cores) a
    collective in the background makes next to no progress, so nothing is prefetched: each
    unit's gather starts when the unit needs it and each reduce-scatter is waited for
    before the next unit computes."""

    def __init__(self, ex: "PipelineExecutor", pi: int, s: int, actions, scatters: list):
        self.ex, self.pi, self.s, self.scatters = ex, pi, s, scatters
        pipe = ex.prog.pipelines[pi]
        self._share_cache: dict[int, list[tuple[int, float]]] = {}  # id(chunk work) -> _shares
        # (chunk work, kind, microbatch, chunk, unit, share of the chunk's weights) of every
        # unit in the order the rank runs them; unit -1 is the chunk's outer weights.
        self.units = [(w, a.kind, a.mb, a.chunk, j, f) for a in actions
                      for w in (pipe.chunks[(s, a.chunk)],) for j, f in self._shares(w)]
        rt = ex.prog.profile.runtime
        self.keep = not reshard_after_forward(rt, ex.plan.pp)
        self.held: set[tuple[int, int]] = set()  # (chunk, unit) gathered and kept this step
        self.blocking = ex._comm_blocks
        self.ahead = 0 if self.blocking else max(1, rt.fsdp_prefetch_layers)
        self.pos = 0
        self.last = None  # the latest gather issued
        self.ready = ex.env.event()  # what a kept unit waits for: nothing
        self.ready.succeed()
        self.pending = deque(self._gather(u) for u in range(self.ahead))

    def _shares(self, w) -> list[tuple[int, float]]:
        """(unit, share of the chunk's weights) of a chunk's units in order: its outer
        weights first (unit -1) when it has any, then each layer. Worked out once per chunk
        (every action of the step asks again)."""
        got = self._share_cache.get(id(w))
        if got is None:
            outer = w.outer_params / w.params if w.params > 0 else 0.0
            layer = (1.0 - outer) / w.layers
            got = self._share_cache[id(w)] = ([(-1, outer)] if outer > 0 else []) + [(j, layer) for j in range(w.layers)]
        return got

    def _gather(self, u: int):
        if u >= len(self.units):
            return None
        w, kind, mb, chunk, j, share = self.units[u]
        if self.keep:
            if (chunk, j) in self.held:
                return self.ready
            self.held.add((chunk, j))
        label = f"fsdp gather {kind}{mb}"
        prev, self.last = self.last, None
        if prev is None or prev.triggered:
            got = self.ex.reducer.zero3_gather_layer(self.s, w, share, label)
        else:
            # Gathers further ahead queue behind the one in flight (one communication
            # stream, NCCL runs its collectives in order) rather than sharing the links.
            got = self.ex.env.process(self._after(prev, w, share, label))
        self.last = got
        return got

    def _after(self, prev, w, share: float, label: str):
        yield prev
        yield self.ex.reducer.zero3_gather_layer(self.s, w, share, label)

    def run(self, key: RankKey, w, backward: bool, label: str):
        """One action's compute, unit by unit, each after its weights are gathered (the
        chunk's compute spread over its layers; its outer unit computes nothing of its own)."""
        ex, n = self.ex, w.layers
        dt = w.bwd_s if backward else w.fwd_s
        for j, share in self._shares(w):
            if self.blocking:  # gathered when needed (class doc)
                ready, self.pos = self._gather(self.pos), self.pos + 1
            else:
                ready, self.pos = self.pending.popleft(), self.pos + 1
            name = "outer" if j < 0 else f"l{j}"
            yield from ex._wait(key, ready, "dp", f"fsdp gather {label} {name}")
            if not self.blocking:
                self.pending.append(self._gather(self.pos + self.ahead - 1))  # prefetch ahead
            if j >= 0:
                yield from ex._compute(key, self.pi, self.s, w, backward, dt / n, f"{label} {name}", n)
            if backward:
                rs = ex.reducer.zero3_reduce_scatter(self.s, w, share)
                self.scatters.append(rs)
                if self.blocking:
                    yield from ex._wait(key, rs, "dp", f"fsdp reduce-scatter {label} {name}")
