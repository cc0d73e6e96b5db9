"""The SimPy engine: runs a Program (schedule action lists + per-chunk work) on the
cluster's flow network and measures one training step.

Streams per simulated device: a compute stream that executes its pipeline rank's
action list in order (tensor-parallel collectives sit on it, on the critical path);
pipeline sends run as flows beside it; one data-parallel stream per pipeline stage
reduces gradient buckets as backward produces them (overlapping earlier layers'
backward), shared by every simulated replica of that stage.

Waits on the compute stream are classified so the breakdown sums to the step time:
waiting for a neighbour whose compute had not finished is pipeline bubble; waiting
after it had finished is exposed pipeline communication ('pp'); waiting for gradient
reduction or ZeRO gathers is exposed data-parallel communication ('dp'); waiting for
other, slower replicas before the reduction can start is 'idle'.
"""
from __future__ import annotations

from collections import defaultdict

import simpy

from costmodel import efficiency as ce
from costmodel.dtypes import WORKING_BYTES as BYTES, grad_reduce_bytes
from sim import collective_flows as cf
from sim.flownet import FlowNetwork
from sim.program import TOPK_ENTRY_BYTES, Program
from sim.result import CATEGORIES, Segment


def effective_graph(cluster, profile):
    """The cluster graph with each link's line rate scaled by its class's achievable
    fraction (profile ``fabrics.<kind>.bw_eff``): flows share what a collective can
    really use of a link, not its datasheet rate."""
    g = cluster.graph.copy()
    for _u, _v, data in g.edges(data=True):
        data["bw_Bps"] = data["bw_Bps"] * profile.fabric(data.get("kind", "default")).bw_eff
    return g


class Engine:
    def __init__(self, program: Program, record: bool = False):
        self.prog = program
        self.plan = program.plan
        self.cluster = program.cluster
        self.record = record
        self.env = simpy.Environment()
        self.net = FlowNetwork(self.env, effective_graph(self.cluster, program.profile), record=record)
        self.p, self.v = self.plan.pp, self.plan.vpp
        self.V = self.p * self.v
        self.totals: dict[tuple[int, int], dict[str, float]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0.0))
        self.segments: list[Segment] = []
        self.done_at: dict[tuple[int, int], float] = {}
        # Cross-rank dependencies: arrival events and the time the producer finished.
        self.arrive: dict[tuple, simpy.Event] = {}
        self.produced: dict[tuple, float] = {}
        # Data-parallel machinery, per pipeline stage.
        n_classes = len(program.pipelines)
        self.n_classes = n_classes
        self.dp_queue = [simpy.Store(self.env) for _ in range(self.p)]
        self.ready_count: dict[tuple, int] = defaultdict(int)
        self.dp_done = [self.env.event() for _ in range(self.p)]
        self.dp_started: dict[tuple, float] = {}
        self.gather_done = [self.env.event() for _ in range(self.p)]
        self.opt_count = [0] * self.p
        self.p2p_call_s: dict[tuple[int, int], float] = {}
        # The TP peers and identical replicas that send alongside each simulated send,
        # per (pipeline, source stage, destination stage): built once, reused per microbatch.
        self._p2p_replicas: dict[tuple[int, int, int], tuple] = {}
        self.dp_call_s = [self._call_latency(self.plan.dp_group(s, 0)) if self.plan.dp > 1 else 0.0
                          for s in range(self.p)]
        # Gradient collectives in flight per stage, and how much they slow compute.
        self.dp_inflight: list[float | None] = [None] * self.p  # start time of the running one
        self.dp_busy_s = [0.0] * self.p  # finished collectives' time
        self.dp_slowdown = [self.prog.profile.fabric(self._group_kind(self.plan.dp_group(s, 0))).compute_slowdown
                            for s in range(self.p)]
        if self.plan.zero == 3 and n_classes > 1:
            from costmodel.errors import InputError
            raise InputError("--plan", "zero", "zero=3 is simulated only when all data-parallel replicas "
                             "are identical (one GPU type per stage and equal mb_shares)")

    # ------------------------------------------------------------------ helpers
    def _group_kind(self, ranks):
        """The link class a group's collective runs on: the node's fabric or the network."""
        nodes = {self.cluster.node_of(r) for r in ranks}
        return self.cluster.nodes[next(iter(nodes))].intra_kind if len(nodes) == 1 else "network"

    def _call_latency(self, ranks):
        """Per-call software latency of the fabric a group spans (profile call_latency_us)."""
        return self.prog.profile.fabric(self._group_kind(ranks)).call_latency_us * 1e-6

    def _seg(self, key, stream, cat, t0, t1, label):
        if t1 <= t0:
            return
        if stream == "compute":
            self.totals[key][cat] += t1 - t0
        if self.record:
            rank = self.prog.pipelines[key[0]].ranks[key[1]]
            self.segments.append(Segment(rank, stream, cat, t0, t1, label))

    def _busy(self, key, cat, dt, label):
        t0 = self.env.now
        s = key[1]
        busy0 = self._dp_busy(s, t0)
        if dt > 0:
            yield self.env.timeout(dt)
        self._seg(key, "compute", cat, t0, self.env.now, label)
        if cat == "compute" and dt > 0 and self.dp_slowdown[s] > 0:
            overlap = self._dp_busy(s, self.env.now) - busy0
            if overlap > 0:
                # Gradient collectives overlapped this kernel for `overlap` seconds; their
                # communication kernels took SMs and memory bandwidth, costing
                # compute_slowdown x overlap (profile fabrics.<kind>.compute_slowdown).
                # That loss is a cost of data-parallel communication: booked as 'dp'.
                t1 = self.env.now
                yield self.env.timeout(overlap * self.dp_slowdown[s])
                self._seg(key, "compute", "dp", t1, self.env.now, f"{label} (slowed by DP comm)")

    def _dp_busy(self, s, t):
        """Seconds stage s's gradient collectives have run up to time t (t = now)."""
        busy = self.dp_busy_s[s]
        if self.dp_inflight[s] is not None:
            busy += t - self.dp_inflight[s]
        return busy

    def _event(self, k):
        ev = self.arrive.get(k)
        if ev is None:
            ev = self.arrive[k] = self.env.event()
        return ev

    def _wait_dep(self, key, k, label):
        """Wait for an arrival; split the wait into bubble (producer still computing)
        and exposed pipeline communication (data in flight)."""
        ev = self._event(k)
        t0 = self.env.now
        if not ev.triggered:
            yield ev
        t1 = self.env.now
        tp = self.produced.get(k, t1)
        split = min(max(tp, t0), t1)
        self._seg(key, "compute", "bubble", t0, split, f"wait {label}")
        self._seg(key, "compute", "pp", split, t1, f"recv {label}")

    def _send(self, pi, src_stage, dst_stage, nbytes, k, label):
        """Point-to-point of one microbatch's activations (or gradients); the TP peers
        and identical replicas send alongside, so their flows share the links."""
        ev = self._event(k)
        self.produced[k] = self.env.now
        if src_stage == dst_stage or nbytes <= 0:
            ev.succeed()
            return
        pipe = self.prog.pipelines[pi]
        src, dst = pipe.ranks[src_stage], pipe.ranks[dst_stage]
        replicas = self._p2p_replicas.get((pi, src_stage, dst_stage))
        if replicas is None:
            d0 = pipe.dp_indices[0]
            replicas = tuple((self.plan.rank(d, src_stage, t), self.plan.rank(d, dst_stage, t))
                             for d in pipe.dp_indices for t in range(self.plan.tp) if (d, t) != (d0, 0))
            self._p2p_replicas[(pi, src_stage, dst_stage)] = replicas
        call_s = self.p2p_call_s.get((src, dst))
        if call_s is None:
            call_s = self.p2p_call_s[(src, dst)] = self._call_latency([src, dst])
        done = self.env.process(self._call(cf.p2p(src, dst, nbytes), replicas, label, call_s))
        t_start = self.env.now
        if self.record:
            key = (pi, src_stage)

            def _rec(_e, t_start=t_start):
                self._seg(key, "pp", "send", t_start, self.env.now, label)
                ev.succeed()
            done.callbacks.append(_rec)
        else:
            done.callbacks.append(lambda _e: ev.succeed())

    def _wait_sent(self, key, k, label):
        """Blocking pipeline send (Program.p2p_blocking, e.g. DeepSpeed's pipeline engine):
        the sender computes on only once its transfer is done; the wait is exposed 'pp'."""
        ev = self._event(k)
        t0 = self.env.now
        if not ev.triggered:
            yield ev
        self._seg(key, "compute", "pp", t0, self.env.now, f"send {label}")

    def _bucket_elements(self, stage, chunk):
        w = self.prog.pipelines[0].chunks[(stage, chunk)]
        return w.params / len(w.grad_buckets)

    def _grad_ready(self, key, stage, chunk, j):
        """A gradient bucket is complete. With top-k compression the device first adds
        the error-feedback residual and selects the top k: GPU kernels on the compute
        stream, so they delay the rest of backward (not hidden on the comm stream)."""
        frac = self.plan.topk_fraction
        if frac is not None:
            pi, s = key
            gpu = self.cluster.devices[self.prog.pipelines[pi].ranks[s]].gpu
            t = ce.topk_compress_time_s(self._bucket_elements(stage, chunk), gpu, self.prog.profile.gpu(gpu.name))
            yield from self._busy(key, "compute", t, f"top-k compress c{chunk}b{j}")
        self._bucket_ready(stage, chunk, j)

    def _bucket_ready(self, stage, chunk, j):
        k = (stage, chunk, j)
        self.ready_count[k] += 1
        if self.ready_count[k] == self.n_classes:
            self.dp_queue[stage].put((chunk, j))

    # ------------------------------------------------------------------ streams
    def compute_stream(self, pi, s):
        pipe = self.prog.pipelines[pi]
        key = (pi, s)
        actions = pipe.actions[s]
        last_b = {}
        for idx, a in enumerate(actions):
            if a.kind == "B":
                last_b[a.chunk] = idx
        overlap = self.plan.overlap_grad_reduce and self.plan.zero < 3
        zero3 = self.plan.zero == 3 and self.plan.dp > 1
        gathers, scatters = {}, []
        if zero3:
            gathers[0] = self._zero3_gather(pi, s, actions[0])
        for idx, a in enumerate(actions):
            vs = a.chunk * self.p + s
            w = pipe.chunks[(s, a.chunk)]
            if zero3:
                if idx + 1 < len(actions):  # prefetch the next action's weights
                    gathers[idx + 1] = self._zero3_gather(pi, s, actions[idx + 1])
                t0 = self.env.now
                ev = gathers.pop(idx)
                if not ev.triggered:
                    yield ev
                self._seg(key, "compute", "dp", t0, self.env.now, "zero3 gather")
            label = f"{a.kind}{a.mb} c{a.chunk}"
            if a.kind == "F":
                if vs > 0:
                    yield from self._wait_dep(key, (pi, "F", vs - 1, a.mb), label)
                yield from self._busy(key, "compute", w.fwd_s, label)
                yield from self._busy(key, "tp", w.fwd_tp_s, f"tp {label}")
                if vs < self.V - 1:
                    self._send(pi, s, (vs + 1) % self.p, w.p2p_bytes, (pi, "F", vs, a.mb), f"act {label}")
                    if self.prog.p2p_blocking:
                        yield from self._wait_sent(key, (pi, "F", vs, a.mb), f"act {label}")
                else:
                    self.produced[(pi, "F", vs, a.mb)] = self.env.now
            else:
                if vs < self.V - 1:
                    yield from self._wait_dep(key, (pi, "B", vs + 1, a.mb), label)
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
                    scatters.append(self._zero3_reduce_scatter(pi, s, w))
                if vs > 0:
                    self._send(pi, s, (vs - 1) % self.p, w.p2p_bytes, (pi, "B", vs, a.mb), f"grad {label}")
                    if self.prog.p2p_blocking:
                        yield from self._wait_sent(key, (pi, "B", vs, a.mb), f"grad {label}")
        if not overlap and not zero3:
            for c in range(self.v):
                for j in range(len(pipe.chunks[(s, c)].grad_buckets)):
                    yield from self._grad_ready(key, s, c, j)
        if scatters:  # ZeRO-3: the last microbatches' gradient reduce-scatters
            t0 = self.env.now
            yield self.env.all_of(scatters)
            self._seg(key, "compute", "dp", t0, self.env.now, "zero3 reduce-scatter")
        # Wait for this stage's gradient reduction; time before the first bucket could
        # start (slower replicas) is idle, the rest is exposed DP communication.
        t0 = self.env.now
        if not self.dp_done[s].triggered:
            yield self.dp_done[s]
        first = self.dp_started.get(s, self.env.now)
        split = min(max(first, t0), self.env.now)
        self._seg(key, "compute", "idle", t0, split, "wait replicas")
        self._seg(key, "compute", "dp", split, self.env.now, "grad reduce")
        yield from self._busy(key, "compute", pipe.optimizer_s[s], "optimizer")
        if self.plan.zero in (1, 2) and self.plan.dp > 1:
            # Sharded optimizer: gather the updated weights once every replica is done.
            self.opt_count[s] += 1
            if self.opt_count[s] == self.n_classes:
                self.env.process(self._param_gather(pi, s))
            t0 = self.env.now
            yield self.gather_done[s]
            self._seg(key, "compute", "dp", t0, self.env.now, "param all-gather")
        self.done_at[key] = self.env.now

    def _dp_phases(self, s, nbytes, op):
        group = self.plan.dp_group(s, 0)
        algo = self.prog.dp_algorithm[s]
        if op == "all_reduce":
            return cf.build(algo, "all_reduce", group, nbytes, node_of=self.cluster.node_of)
        # Reduce-scatter and all-gather have ring and hierarchical forms (no tree): the
        # hierarchical one spreads the inter-node traffic over every local member's NIC, as
        # NCCL's multi-channel rings do.
        return cf.build("hierarchical" if algo == "hierarchical" else "ring", op, group, nbytes,
                        node_of=self.cluster.node_of)

    def _dp_replicas(self, s):
        return [self.plan.dp_group(s, t) for t in range(1, self.plan.tp)]

    def _run_dp(self, s, phases, label):
        """One data-parallel collective call: the software cost of the call, then its flows."""
        return self.env.process(self._call(phases, self._dp_replicas(s), label, self.dp_call_s[s]))

    def _call(self, phases, replicas, label, call_s):
        if call_s > 0:
            yield self.env.timeout(call_s)
        yield cf.run_phases(self.env, self.net, self.cluster.route, phases, replicas=replicas, label=label)

    def dp_stream(self, s):
        """Reduce each gradient bucket of stage `s` as soon as every replica has it."""
        pipe = self.prog.pipelines[0]
        total = sum(len(pipe.chunks[(s, c)].grad_buckets) for c in range(self.v))
        if self.plan.zero == 3:
            total = 0  # ZeRO-3 reduce-scatters per microbatch instead (see compute_stream)
        frac = self.plan.topk_fraction
        rank = pipe.ranks[s]
        gpu = self.cluster.devices[rank].gpu
        eff = self.prog.profile.gpu(gpu.name)
        dpn = self.plan.dp
        for i in range(total):
            chunk, j = yield self.dp_queue[s].get()
            if i == 0:
                self.dp_started[s] = self.env.now
            nbytes = pipe.chunks[(s, chunk)].grad_buckets[j]
            t0 = self.env.now
            self.dp_inflight[s] = t0
            if frac is not None:
                elems = self._bucket_elements(s, chunk)
                nnz = max(1.0, frac * elems)
                yield self._run_dp(s, cf.sparse_allgather(self.plan.dp_group(s, 0), nnz, TOPK_ENTRY_BYTES),
                                   f"topk c{chunk}b{j}")
                yield self.env.timeout(ce.topk_decompress_time_s(elems, (dpn - 1) * nnz, TOPK_ENTRY_BYTES, gpu, eff))
            else:
                reduce_all = self.plan.zero == 0 or self.prog.zero_grad_all_reduce
                op = "all_reduce" if reduce_all else "reduce_scatter"
                yield self._run_dp(s, self._dp_phases(s, nbytes, op), f"{op} c{chunk}b{j}")
            self.dp_inflight[s] = None
            self.dp_busy_s[s] += self.env.now - t0
            if self.record:
                for pi in range(self.n_classes):
                    self._seg((pi, s), "dp", "collective", t0, self.env.now, f"grad c{chunk}b{j}")
        self.dp_done[s].succeed()

    def _param_gather(self, pi, s):
        pipe = self.prog.pipelines[0]
        params = sum(pipe.chunks[(s, c)].params for c in range(self.v))
        nbytes = params * BYTES[self.plan.precision]
        t0 = self.env.now
        yield self._run_dp(s, self._dp_phases(s, nbytes, "all_gather"), "param all-gather")
        if self.record:
            for q in range(self.n_classes):
                self._seg((q, s), "dp", "collective", t0, self.env.now, "param all-gather")
        self.gather_done[s].succeed()

    def _zero3_gather(self, pi, s, a):
        w = self.prog.pipelines[pi].chunks[(s, a.chunk)]
        nbytes = w.params * BYTES[self.plan.precision]
        return self._run_dp(s, self._dp_phases(s, nbytes, "all_gather"), f"zero3 gather {a.kind}{a.mb}")

    def _zero3_reduce_scatter(self, pi, s, w):
        nbytes = w.params * grad_reduce_bytes(self.plan.precision, self.prog.profile.runtime)
        return self._run_dp(s, self._dp_phases(s, nbytes, "reduce_scatter"), "zero3 reduce-scatter")

    # ------------------------------------------------------------------ run
    def run(self):
        for s in range(self.p):
            self.env.process(self.dp_stream(s))
        for pi, pipe in enumerate(self.prog.pipelines):
            for s in range(self.p):
                self.env.process(self.compute_stream(pi, s))
        self.env.run()
        if len(self.done_at) != self.n_classes * self.p:
            raise RuntimeError("simulation deadlocked: some pipeline ranks never finished")
        return max(self.done_at.values())
