"""Per-plan inputs of the analytic estimate (costmodel/estimate.py), computed fast.

Compute durations come from the simulator's own ``sim.program.chunk_work`` evaluated once
per layer shape (GPU type, tp, mbs, sp, recompute) and scaled by layer counts, so the
estimate and the simulation share every per-op cost. Communication is costed statically
on the cluster graph: each flow of a collective (the phases ``sim.collective_flows``
builds, as the engine runs them) gets the bandwidth of its path's tightest edge divided
by the number of concurrent flows on that edge, counting the symmetric replica groups that
run the same collective at the same time. Data-parallel reductions of all pipeline stages
are assumed concurrent (conservative where stages share NICs). Memory follows
``sim.program.stage_memory``, the function the simulator's program calls, so 'out of
memory' here is what the simulation reports.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import NamedTuple

from costmodel.context_parallel import ring_attention_s
from costmodel.dtypes import grad_reduce_bytes, param_gather_bytes, topk_entry_bytes
from costmodel.efficiency import optimizer_time_s, topk_compress_time_s, topk_decompress_time_s
from costmodel.estimate import ChunkGrads, PipelineCost, StageCost, closing_straggler_s
from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim import collective_flows as cf
from sim.context_parallel import all_to_all, ring_step
from sim.engine import hop_latency
from sim.flownet import edge_latency_s
from specs.plan import Plan
from sim.program import (ChunkWork, ReplicaClass, choose_allreduce, chunk_work, n_buckets,
                         overlapped_gather_exposed_s, replica_classes, stage_alive_factor, stage_chunks, stage_memory)
from sim.tp_comm import call_latency_s
from sim.schedules import make_schedule
from specs.topology import Cluster

GIB = 2.0 ** 30


class ChunkCost(NamedTuple):
    """One chunk of ``layers`` layers on one device, per microbatch."""

    fwd_s: float  # forward compute + exposed TP communication
    bwd_s: float  # backward (recompute included) + exposed TP communication
    tp_s: float  # the exposed TP communication of both
    params: float  # parameters this device holds for the chunk
    fwd_tp_s: float  # the forward's share of tp_s


class LinearCost(NamedTuple):
    """Seconds of a transfer as fixed + per_byte * bytes."""

    fixed_s: float
    s_per_byte: float


class PhaseCost(NamedTuple):
    """One phase of a collective: its latency and seconds per unit of the flows' bytes."""

    latency_s: float
    s_per_unit: float


class _PerLink(dict):
    """link -> value, computed by ``fn(link)`` on first look-up (KeyError for no link)."""

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def __missing__(self, e):
        value = self[e] = self._fn(e)
        return value


class CostTables:
    """Memoised costs for one (model, cluster, profile)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, profile: Profile):
        self.model, self.cluster, self.profile = model, cluster, profile
        # Per link, computed when first asked for: a 16k-GPU cluster has ~100k links (its
        # networkx graph is not even built) and a search prices the few its groups use.
        g = cluster.links
        self.bw = _PerLink(lambda e: g.edges[e]["bw_Bps"] * profile.fabric(g.edges[e].get("kind", "default")).bw_eff)
        # Latencies as the engine's flow network has them (a fitted hop latency replaces the topology's).
        hop = hop_latency(profile)
        self.lat = _PerLink(lambda e: edge_latency_s(g, e[0], e[1], g.edges[e], hop))
        self.runtime = profile.runtime
        self.heterogeneous = len({d.gpu.name for d in cluster.devices}) > 1 or len(cluster.groups()) > 1
        self._node_type = [cluster.nodes[d.node].node_type for d in cluster.devices]
        self._work: dict[tuple, ChunkWork] = {}
        self._chunk: dict[tuple, ChunkCost] = {}
        self._classes: dict[tuple, list[ReplicaClass]] = {}
        self._memory: dict[Plan, float] = {}
        self.memo: dict[str, dict] = {}  # for callers' own memoisation (search/hetero.py)
        self._phases: dict[tuple, LinearCost] = {}

    def grad_bytes(self, precision: str) -> int:
        """Bytes per gradient element in the DP reduction (the profile's runtime decides)."""
        return grad_reduce_bytes(precision, self.runtime)

    # ------------------------------------------------------------------ compute
    def work(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> ChunkWork:
        """chunk_work for 1 plain layer (layers=1) or the embedding/head extras (layers=0)."""
        key = (self._node_type[rank], plan.tp, plan.cp, plan.cp_comm, plan.mbs, plan.sp, plan.recompute,
               plan.precision, layers, first, last)
        w = self._work.get(key)
        if w is None:
            w = self._work[key] = chunk_work(self.model, plan, self.cluster, self.profile, rank, layers, first, last)
        return w

    def chunk(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> ChunkCost:
        """The costs of a chunk of ``layers`` layers on ``rank``'s GPU type."""
        key = (self._node_type[rank], plan.tp, plan.cp, plan.cp_comm, plan.mbs, plan.sp, plan.recompute,
               plan.precision, layers, first, last)
        got = self._chunk.get(key)
        if got is None:
            got = self._chunk[key] = self._chunk_uncached(plan, rank, layers, first, last)
        return got

    def _chunk_uncached(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> ChunkCost:
        one = self.work(plan, rank, 1, False, False)
        ext = self.work(plan, rank, 0, first, last)
        fwd = layers * (one.fwd_s + one.fwd_tp_s) + ext.fwd_s + ext.fwd_tp_s
        bwd = layers * (one.bwd_s + one.bwd_tp_s) + ext.bwd_s + ext.bwd_tp_s
        tp = layers * (one.fwd_tp_s + one.bwd_tp_s) + ext.fwd_tp_s + ext.bwd_tp_s
        return ChunkCost(fwd, bwd, tp, layers * one.params + ext.params, layers * one.fwd_tp_s + ext.fwd_tp_s)

    def layer_time_s(self, plan: Plan, rank: int) -> float:
        """Forward + backward of one layer and one microbatch on ``rank``'s GPU type: the
        speed the heterogeneous balancing divides work by."""
        one = self.work(plan, rank, 1, False, False)
        return one.fwd_s + one.fwd_tp_s + one.bwd_s + one.bwd_tp_s

    # ------------------------------------------------------------------ communication
    def call_s(self, ranks: list[int], op: str | None = None) -> float:
        """Per-call software latency of collective ``op`` on the fabric a group spans (as
        the engine charges)."""
        return call_latency_s(self.cluster, self.profile, ranks, op)

    def phase_costs(self, phases: list[cf.Phase], replicas: list[tuple[int, ...]]) -> list[PhaseCost]:
        """Per phase (latency seconds, seconds per unit of the flows' bytes): every flow
        of the phase and its replica copies count on the edges they cross; a flow gets
        the tightest edge's bandwidth divided by that count."""
        out = []
        route = self.cluster.route
        for ph in phases:
            pos = {r: i for i, r in enumerate(ph.group)}
            count: Counter = Counter()
            paths = []
            for s, d, nbytes in ph.flows:
                path = route(s, d)
                paths.append((path, nbytes))
                count.update(path)
                i, j = pos[s], pos[d]
                for rep in replicas:
                    count.update(route(rep[i], rep[j]))
            lat = worst = 0.0
            for path, nbytes in paths:
                if not path:
                    continue
                rate = min(self.bw[e] / count[e] for e in path)
                worst = max(worst, nbytes / rate)
                lat = max(lat, ph.latency_steps * sum(self.lat[e] for e in path))
            out.append(PhaseCost(lat, worst))
        return out

    def _dp_groups(self, plan: Plan, stage: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """The representative gradient-reduction (dp*cp) group of ``stage`` and every other
        one (all stages)."""
        rep = tuple(plan.grad_group(stage, 0))
        others = [tuple(plan.grad_group(s, t)) for s in range(plan.pp) for t in range(plan.tp)
                  if (s, t) != (stage, 0)]
        return rep, others

    def dp_op(self, plan: Plan, stage: int, op: str, algo: str = "ring") -> LinearCost:
        """(fixed seconds, seconds per byte) of one DP collective on ``stage``: op is
        all_reduce (with algo), reduce_scatter, all_gather, or sparse (per byte of one
        rank's (index, value) payload)."""
        if not self.heterogeneous:
            stage = 0  # every stage's DP groups look alike on a homogeneous cluster
        key = ("dp", plan.placement, plan.tp, plan.cp, plan.pp, plan.dp, stage, op, algo)
        got = self._phases.get(key)
        if got is None:
            rep, others = self._dp_groups(plan, stage)
            node_of = self.cluster.node_of
            if op == "sparse":
                phases = cf.sparse_allgather(rep, 1.0, 1.0)
            elif op == "all_reduce":
                phases = cf.build(algo, "all_reduce", rep, 1.0, node_of=node_of)
            else:
                phases = cf.build("ring", op, rep, 1.0, node_of=node_of)
            got = self._phases[key] = self._linear(list(rep), self.phase_costs(phases, others),
                                                   "all_gather" if op == "sparse" else op)
        return got

    def _linear(self, ranks: list[int], costs: list[PhaseCost], op: str | None) -> LinearCost:
        """A collective ``op``'s phases in sequence, plus one call's software latency."""
        return LinearCost(self.call_s(ranks, op) + sum(c.latency_s for c in costs), sum(c.s_per_unit for c in costs))

    def p2p(self, plan: Plan, d0: int, stage: int) -> LinearCost:
        """(fixed seconds, seconds per byte) of the activation send stage -> stage+1 of
        replica d0, with every replica's and TP peer's send alongside."""
        nxt = (stage + 1) % plan.pp
        key = ("p2p", plan.placement, plan.tp, plan.cp, plan.pp, plan.dp, stage, d0 if self.heterogeneous else 0)
        got = self._phases.get(key)
        if got is None:
            src, dst = plan.rank(d0, stage, 0), plan.rank(d0, nxt, 0)
            reps = [(plan.rank(d, stage, t, c), plan.rank(d, nxt, t, c)) for d in range(plan.dp)
                    for c in range(plan.cp) for t in range(plan.tp) if (d, t, c) != (d0, 0, 0)]
            got = self._phases[key] = self._linear([src, dst], self.phase_costs(cf.p2p(src, dst, 1.0), reps), "send_recv")
        return got

    def cp_step(self, plan: Plan, d0: int, stage: int) -> LinearCost:
        """(fixed seconds, seconds per byte) of one context-parallel exchange of replica
        d0's ``stage`` (a ring step, or the a2a all-to-all; sim/context_parallel.py), with
        the CP groups of every TP index and replica alongside, as the engine runs it."""
        key = ("cp", plan.placement, plan.tp, plan.cp, plan.cp_comm, plan.pp, plan.dp, stage if self.heterogeneous else 0,
               d0 if self.heterogeneous else 0)
        got = self._phases.get(key)
        if got is None:
            group = tuple(plan.cp_group(d0, stage, 0))
            reps = [tuple(plan.cp_group(d, stage, t)) for d in range(plan.dp) for t in range(plan.tp)
                    if (d, t) != (d0, 0)]
            phases = (ring_step if plan.cp_comm == "ring" else all_to_all)(group, 1.0)
            got = self._phases[key] = self._linear(list(group), self.phase_costs(phases, reps),
                                                   "send_recv" if plan.cp_comm == "ring" else None)
        return got

    def cp_exposed(self, plan: Plan, d0: int, stage: int, layers: int) -> tuple[float, float]:
        """Exposed context-parallel exchange of a chunk of ``layers`` layers, one
        microbatch, (forward, backward) seconds: the ring's closed form
        (costmodel.context_parallel.ring_attention_s less its compute), or the whole
        all-to-all."""
        one = self.work(plan, plan.rank(d0, stage, 0), 1, False, False)
        c0, c1 = self.cp_step(plan, d0, stage)
        out = []
        for block, nbytes in ((one.cp_fwd_block_s, one.cp_fwd_bytes), (one.cp_bwd_block_s, one.cp_bwd_bytes)):
            x = c0 + c1 * layers * nbytes
            if plan.cp_comm == "ring":
                out.append(ring_attention_s(plan.cp, layers * block, x) - plan.cp * layers * block)
            else:
                out.append(x)
        return out[0], out[1]

    def dp_ranks_per_node(self, plan: Plan) -> set[int]:
        """How many ranks of one DP group share a node, over all groups (hierarchical
        collectives need one number; {1} makes them a plain ring)."""
        key = ("per_node", plan.placement, plan.tp, plan.cp, plan.pp, plan.dp)
        got = self.memo.get(key)
        if got is None:
            node_of = self.cluster.node_of
            got = set()
            for s in range(plan.pp):
                for t in range(plan.tp):
                    got |= set(Counter(node_of(r) for r in plan.grad_group(s, t)).values())
            self.memo[key] = got
        return got

    def resolve_auto(self, plan: Plan) -> tuple[str, ...]:
        """allreduce=auto per stage (sim.program.choose_allreduce), sized on the first
        bucket of the stage's first chunk of replica 0, as build_program does."""
        out = []
        for s in range(plan.pp):
            first = stage_chunks(plan, s)[0]
            prm = self.chunk(plan, plan.rank(0, s, 0), first.layers, first.first, first.last).params
            gbytes = prm * self.grad_bytes(plan.precision)
            k = n_buckets(gbytes, first.layers)
            out.append(choose_allreduce(plan, self.cluster, self.profile, s, gbytes / k if k else 0.0))
        return tuple(out)

    # ------------------------------------------------------------------ whole plan
    def classes(self, plan: Plan) -> list[ReplicaClass]:
        """Replica classes as build_program forms them (sim.program.replica_classes)."""
        key = (plan.placement, plan.tp, plan.cp, plan.pp, plan.dp, plan.mb_shares)
        got = self._classes.get(key)
        if got is None:
            got = self._classes[key] = replica_classes(plan, self.cluster)
        return got

    def memory_shortfall_gib(self, plan: Plan) -> float:
        """Largest (peak - capacity) over simulated devices, GiB (<= 0: it fits)."""
        key = replace(plan, compress="none" if plan.topk_fraction is None else "topk", allreduce="ring")
        got = self._memory.get(key)
        if got is None:
            got = self._memory[key] = self._shortfall(plan)
        return got

    def _shortfall(self, plan: Plan) -> float:
        worst = -math.inf
        for cls in self.classes(plan):
            for s in range(plan.pp):
                peak = sum(stage_memory(self.model, plan, self.runtime, s, cls.microbatches).values())
                cap = self.cluster.devices[plan.rank(cls.members[0], s, 0)].gpu.mem_bytes
                worst = max(worst, (peak - cap) / GIB)
        return worst

    def pipelines(self, plan: Plan, algos: tuple[str, ...] | None = None) -> list[PipelineCost]:
        """The estimate's input for ``plan``; ``algos`` is the all-reduce algorithm per
        stage (allreduce=auto resolved; see resolve_allreduce)."""
        p, v = plan.pp, plan.vpp
        prec = plan.precision
        frac = plan.topk_fraction
        out = []
        for m_cls in self.classes(plan):
            m, d0 = m_cls.microbatches, m_cls.members[0]
            stages = []
            # Each stage's action list, for the alive factor below (only where it is measured).
            acts = make_schedule(plan.schedule, p, m, v) if self.runtime.alive_slowdown_per_doubling > 0 else None
            for s in range(p):
                rank = plan.rank(d0, s, 0)
                gpu = self.cluster.devices[rank].gpu
                eff = self.profile.gpu(gpu.name)
                fwd = bwd = tp = params = 0.0
                grads, z3_gather, z3_rs = [], 0.0, 0.0
                # The stage computes slower for the activations its action list holds, as
                # the simulator charges it (sim/program.stage_alive_factor): its compute,
                # not the TP collectives, times the factor.
                slow = stage_alive_factor(self.model, plan, self.runtime, acts[s], s) - 1.0 if acts else 0.0
                for ch in stage_chunks(plan, s):
                    n = ch.layers
                    f, b, t, prm, ftp = self.chunk(plan, rank, n, ch.first, ch.last)
                    f, b = f + slow * (f - ftp), b + slow * (b - (t - ftp))
                    fwd, bwd, tp, params = fwd + f, bwd + b, tp + t, params + prm
                    if plan.cp > 1:
                        cf_s, cb_s = self.cp_exposed(plan, d0, s, n)
                        fwd, bwd = fwd + cf_s, bwd + cb_s  # exposed K/V exchange (not TP)
                    if plan.grad_degree == 1:
                        continue
                    gbytes = prm * self.grad_bytes(prec)
                    if plan.zero == 3:
                        ag0, ag1 = self.dp_op(plan, s, "all_gather")
                        rs0, rs1 = self.dp_op(plan, s, "reduce_scatter")
                        # one layer's gather / reduce-scatter (FSDP works layer by layer)
                        z3_gather = max(z3_gather, ag0 + ag1 * prm / n * param_gather_bytes(prec, self.runtime))
                        z3_rs = max(z3_rs, rs0 + rs1 * gbytes / n)
                        continue
                    k = n_buckets(gbytes, n)
                    size = gbytes / k
                    if frac is not None:
                        elems = size / self.grad_bytes(prec)
                        nnz = max(1.0, frac * elems)
                        a0, a1 = self.dp_op(plan, s, "sparse")
                        entry = topk_entry_bytes(prec, self.runtime)
                        t_b = (topk_compress_time_s(elems, gpu, eff, plan.grad_degree, nnz) + a0
                               + a1 * nnz * entry
                               + topk_decompress_time_s(elems, plan.grad_degree * nnz, entry, gpu, eff))
                    elif plan.zero == 0 or self.runtime.zero1_grad_all_reduce:
                        a0, a1 = self.dp_op(plan, s, "all_reduce", algos[s] if algos else plan.allreduce)
                        t_b = a0 + a1 * size
                    else:
                        a0, a1 = self.dp_op(plan, s, "reduce_scatter")
                        t_b = a0 + a1 * size
                    grads.append(ChunkGrads(k, t_b))
                p2p = 0.0
                if s < p - 1 or v > 1:
                    c0, c1 = self.p2p(plan, d0, s)
                    p2p = c0 + c1 * self.work(plan, rank, 1, False, False).p2p_bytes
                if self.runtime.p2p_blocking and p > 1:
                    # The sender waits for each of its v sends per direction (engine._wait_sent).
                    fwd, bwd = fwd + v * p2p, bwd + v * p2p
                opt_params = params / plan.grad_degree if plan.zero >= 1 else params
                gather = 0.0
                if plan.zero in (1, 2) and plan.grad_degree > 1:
                    g0, g1 = self.dp_op(plan, s, "all_gather")
                    gather_bytes = params * param_gather_bytes(prec, self.runtime)
                    gather = g0 + g1 * gather_bytes
                    if self.runtime.overlap_param_gather:  # beside the first forward, bucket by bucket
                        k = sum(max(1, c.buckets) for c in grads)
                        gather = overlapped_gather_exposed_s(g0 + g1 * gather_bytes / k, k, fwd)
                stages.append(StageCost(fwd_s=fwd, bwd_s=bwd, tp_s=tp, p2p_s=p2p, grads=tuple(grads),
                                        optimizer_s=optimizer_time_s(opt_params, gpu, eff, prec, self.runtime),
                                        gather_s=gather, zero3_gather_s=z3_gather, zero3_rs_s=z3_rs, vpp=v,
                                        layers=sum(ch.layers for ch in stage_chunks(plan, s)) / v,
                                        straggler_s=closing_straggler_s(self.runtime.straggler_us,
                                                                        plan.grad_degree, plan.zero)))
            out.append(PipelineCost(tuple(stages), m, v, plan.schedule, len(m_cls.members)))
        return out
