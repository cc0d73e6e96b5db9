"""Per-plan inputs of the analytic estimate (costmodel/estimate.py), computed fast.

Compute durations come from the simulator's own ``sim.program.chunk_work`` evaluated once
per layer shape (GPU type, tp, mbs, sp, recompute) and scaled by layer counts, so the
estimate and the simulation share every per-op cost. Communication is costed statically
on the cluster graph: each flow of a collective (the phases ``sim.collective_flows``
builds, as the engine runs them) gets the bandwidth of its path's tightest edge divided
by the number of concurrent flows on that edge, counting the symmetric replica groups that
run the same collective at the same time. Data-parallel reductions of all pipeline stages
are assumed concurrent (conservative where stages share NICs). Memory follows
``sim.program.build_program`` term by term, so 'out of memory' here is what the
simulation would report.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from costmodel import collectives as cc
from costmodel import memory as mem
from costmodel.efficiency import optimizer_time_s, topk_compress_time_s, topk_decompress_time_s
from costmodel.estimate import ChunkGrads, PipelineCost, StageCost
from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from sim import collective_flows as cf
from sim.engine import effective_graph
from specs.plan import Plan
from sim.program import (BUCKET_BYTES, BYTES, TOPK_ENTRY_BYTES, ChunkWork, chunk_work,
                         grad_reduce_bytes, group_link)
from specs.topology import Cluster

GIB = 2.0 ** 30


def peak_inflight(schedule: str, p: int, m: int, v: int, rank: int) -> int:
    """Chunk-activations rank ``rank`` holds at its peak (closed forms of the action lists
    in sim/schedules.py: GPipe all m; 1F1B min(p - r, m); interleaved its warm-up
    forwards plus one)."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - rank, m)
    warm = min((v - 1) * p + 2 * (p - rank - 1), m * v)
    return min(warm + 1, m * v)


def n_buckets(total_bytes: float, layers: int) -> int:
    """Gradient buckets of a chunk, as sim.program._buckets splits them."""
    if total_bytes <= 0:
        return 0
    return max(1, min(layers, math.ceil(total_bytes / BUCKET_BYTES)))


class CostTables:
    """Memoised costs for one (model, cluster, profile)."""

    def __init__(self, model: ModelSpec, cluster: Cluster, profile: Profile):
        self.model, self.cluster, self.profile = model, cluster, profile
        g = cluster.graph
        self.bw = {(u, v): d["bw_Bps"] * profile.fabric(d.get("kind", "default")).bw_eff
                   for u, v, d in g.edges(data=True)}
        # Latencies as the engine's flow network has them (a fitted hop latency replaces the topology's).
        fitted = any(f.hop_latency_us is not None for f in profile.fabrics.values())
        lat_g = effective_graph(cluster, profile) if fitted else g
        self.lat = {(u, v): d["latency_s"] for u, v, d in lat_g.edges(data=True)}
        self.runtime = profile.runtime
        self.heterogeneous = len({d.gpu.name for d in cluster.devices}) > 1 or len(cluster.groups()) > 1
        self._node_type = [cluster.nodes[d.node].node_type for d in cluster.devices]
        self._work: dict[tuple, ChunkWork] = {}
        self._chunk: dict[tuple, tuple] = {}
        self._classes: dict[tuple, list] = {}
        self._memory: dict[Plan, float] = {}
        self.memo: dict[str, dict] = {}  # for callers' own memoisation (sim/hetero.py)
        self._phases: dict[tuple, list[tuple[float, float]]] = {}
        self._call: dict[tuple, float] = {}

    def grad_bytes(self, precision: str) -> int:
        """Bytes per gradient element in the DP reduction (the profile's runtime decides)."""
        return grad_reduce_bytes(precision, self.runtime)

    # ------------------------------------------------------------------ compute
    def work(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> ChunkWork:
        """chunk_work for 1 plain layer (layers=1) or the embedding/head extras (layers=0)."""
        key = (self._node_type[rank], plan.tp, plan.mbs, plan.sp, plan.recompute, plan.precision, layers, first, last)
        w = self._work.get(key)
        if w is None:
            w = self._work[key] = chunk_work(self.model, plan, self.cluster, self.profile, rank, layers, first, last)
        return w

    def chunk(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> tuple:
        """(fwd_s, bwd_s, tp_s, params, act_bytes) of a chunk of ``layers`` layers."""
        key = (self._node_type[rank], plan.tp, plan.mbs, plan.sp, plan.recompute, plan.precision, layers, first, last)
        got = self._chunk.get(key)
        if got is None:
            got = self._chunk[key] = self._chunk_uncached(plan, rank, layers, first, last)
        return got

    def _chunk_uncached(self, plan: Plan, rank: int, layers: int, first: bool, last: bool) -> tuple:
        one = self.work(plan, rank, 1, False, False)
        ext = self.work(plan, rank, 0, first, last)
        fwd = layers * (one.fwd_s + one.fwd_tp_s) + ext.fwd_s + ext.fwd_tp_s
        bwd = layers * (one.bwd_s + one.bwd_tp_s) + ext.bwd_s + ext.bwd_tp_s
        tp = layers * (one.fwd_tp_s + one.bwd_tp_s) + ext.fwd_tp_s + ext.bwd_tp_s
        return fwd, bwd, tp, layers * one.params + ext.params, layers * one.act_bytes

    def layer_time_s(self, plan: Plan, rank: int) -> float:
        """Forward + backward of one layer and one microbatch on ``rank``'s GPU type: the
        speed the heterogeneous balancing divides work by."""
        one = self.work(plan, rank, 1, False, False)
        return one.fwd_s + one.fwd_tp_s + one.bwd_s + one.bwd_tp_s

    # ------------------------------------------------------------------ communication
    def call_s(self, ranks: list[int]) -> float:
        """Per-call software latency of the fabric a group spans (as the engine charges)."""
        nodes = {self.cluster.node_of(r) for r in ranks}
        kind = self.cluster.nodes[next(iter(nodes))].intra_kind if len(nodes) == 1 else "network"
        return self.profile.fabric(kind).call_latency_us * 1e-6

    def phase_costs(self, phases: list[cf.Phase], replicas: list[tuple[int, ...]]) -> list[tuple[float, float]]:
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
            out.append((lat, worst))
        return out

    def _dp_groups(self, plan: Plan, stage: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """The representative DP group of ``stage`` and every other DP group (all stages)."""
        rep = tuple(plan.dp_group(stage, 0))
        others = [tuple(plan.dp_group(s, t)) for s in range(plan.pp) for t in range(plan.tp)
                  if (s, t) != (stage, 0)]
        return rep, others

    def dp_op(self, plan: Plan, stage: int, op: str, algo: str = "ring") -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of one DP collective on ``stage``: op is
        all_reduce (with algo), reduce_scatter, all_gather, or sparse (per byte of one
        rank's (index, value) payload)."""
        if not self.heterogeneous:
            stage = 0  # every stage's DP groups look alike on a homogeneous cluster
        key = ("dp", plan.placement, plan.tp, plan.pp, plan.dp, stage, op, algo)
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
            costs = self.phase_costs(phases, others)
            got = self._phases[key] = [(self.call_s(list(rep)) + sum(c[0] for c in costs),
                                        sum(c[1] for c in costs))]
        return got[0]

    def p2p(self, plan: Plan, d0: int, stage: int) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of the activation send stage -> stage+1 of
        replica d0, with every replica's and TP peer's send alongside."""
        nxt = (stage + 1) % plan.pp
        key = ("p2p", plan.placement, plan.tp, plan.pp, plan.dp, stage, d0 if self.heterogeneous else 0)
        got = self._phases.get(key)
        if got is None:
            src, dst = plan.rank(d0, stage, 0), plan.rank(d0, nxt, 0)
            reps = [(plan.rank(d, stage, t), plan.rank(d, nxt, t)) for d in range(plan.dp)
                    for t in range(plan.tp) if (d, t) != (d0, 0)]
            costs = self.phase_costs(cf.p2p(src, dst, 1.0), reps)
            got = self._phases[key] = [(self.call_s([src, dst]) + sum(c[0] for c in costs),
                                        sum(c[1] for c in costs))]
        return got[0]

    def resolve_allreduce(self, plan: Plan, stage: int, bucket_bytes: float) -> str:
        """What allreduce=auto becomes on ``stage`` (sim.program._choose_allreduce's rule:
        the cheapest algorithm for one bucket by the alpha-beta formulas)."""
        if plan.allreduce != "auto":
            return plan.allreduce
        if plan.dp == 1:
            return "ring"
        group = plan.dp_group(stage, 0)
        bw, lat, kind = group_link(self.cluster, group, self.profile)
        fab = self.profile.fabric(kind)
        nodes = sorted({self.cluster.node_of(r) for r in group})
        local = len(group) // len(nodes)
        costs = {"ring": cc.ring_allreduce_s(bucket_bytes, len(group), bw * fab.bw_eff, lat),
                 "tree": cc.tree_allreduce_s(bucket_bytes, len(group), bw * fab.bw_eff, lat)}
        if local > 1 and len(nodes) > 1:
            node = self.cluster.nodes[nodes[0]]
            ifab = self.profile.fabric(node.intra_kind)
            costs["hierarchical"] = cc.hierarchical_allreduce_s(
                bucket_bytes, local, len(nodes), node.intra_bw_Bps * ifab.bw_eff, ifab.hop_latency_s(node.intra_latency_s),
                bw * fab.bw_eff, lat)
        return min(sorted(costs), key=lambda k: costs[k])

    def dp_ranks_per_node(self, plan: Plan) -> set[int]:
        """How many ranks of one DP group share a node, over all groups (hierarchical
        collectives need one number; {1} makes them a plain ring)."""
        key = ("per_node", plan.placement, plan.tp, plan.pp, plan.dp)
        got = self.memo.get(key)
        if got is None:
            node_of = self.cluster.node_of
            got = set()
            for s in range(plan.pp):
                for t in range(plan.tp):
                    got |= set(Counter(node_of(r) for r in plan.dp_group(s, t)).values())
            self.memo[key] = got
        return got

    def resolve_auto(self, plan: Plan) -> tuple[str, ...]:
        """allreduce=auto per stage, sized on the first bucket of the stage's first chunk
        of replica 0 (as build_program does)."""
        out = []
        p, v = plan.pp, plan.vpp
        for s in range(p):
            n = plan.chunk_layers(s)[0]
            *_, prm, _ = self.chunk(plan, plan.rank(0, s, 0), n, s == 0, s == p * v - 1)
            gbytes = prm * self.grad_bytes(plan.precision)
            k = n_buckets(gbytes, n)
            out.append(self.resolve_allreduce(plan, s, gbytes / k if k else 0.0))
        return tuple(out)

    # ------------------------------------------------------------------ whole plan
    def classes(self, plan: Plan) -> list[tuple[int, list[int]]]:
        """Replica classes as build_program forms them: (microbatches, member replicas)."""
        key = (plan.placement, plan.tp, plan.pp, plan.dp, plan.mb_shares)
        got = self._classes.get(key)
        if got is not None:
            return got
        if not self.heterogeneous and len(set(plan.mb_shares)) == 1:
            got = self._classes[key] = [(plan.mb_shares[0], list(range(plan.dp)))]
            return got
        out: dict[tuple, list[int]] = {}
        for d in range(plan.dp):
            sig = (tuple(self.cluster.devices[plan.rank(d, s, 0)].gpu.name for s in range(plan.pp)),
                   plan.mb_shares[d])
            out.setdefault(sig, []).append(d)
        got = self._classes[key] = [(sig[1], members) for sig, members in out.items()]
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
        p, v = plan.pp, plan.vpp
        for m, members in self.classes(plan):
            d0 = members[0]
            for s in range(p):
                rank = plan.rank(d0, s, 0)
                params = acts = 0.0
                holds_last = False
                for c, n in enumerate(plan.chunk_layers(s)):
                    vs = c * p + s
                    *_, prm, act = self.chunk(plan, rank, n, vs == 0, vs == p * v - 1)
                    params += prm
                    acts += act
                    holds_last |= vs == p * v - 1
                states = mem.model_state_bytes(params, plan.dp, plan.zero, plan.precision,
                                               grad_bytes=self.grad_bytes(plan.precision))
                peak = sum(states.values()) + acts / v * peak_inflight(plan.schedule, p, m, v, s)
                if holds_last:
                    peak += mem.logits_bytes(self.model, plan.mbs, plan.tp)
                if plan.topk_fraction is not None:
                    peak += mem.topk_residual_bytes(params)
                cap = self.cluster.devices[rank].gpu.mem_bytes
                worst = max(worst, (peak - cap) / GIB)
        return worst

    def pipelines(self, plan: Plan, algos: tuple[str, ...] | None = None) -> list[PipelineCost]:
        """The estimate's input for ``plan``; ``algos`` is the all-reduce algorithm per
        stage (allreduce=auto resolved; see resolve_allreduce)."""
        p, v = plan.pp, plan.vpp
        prec = plan.precision
        frac = plan.topk_fraction
        out = []
        for m, members in self.classes(plan):
            d0 = members[0]
            stages = []
            for s in range(p):
                rank = plan.rank(d0, s, 0)
                gpu = self.cluster.devices[rank].gpu
                eff = self.profile.gpu(gpu.name)
                fwd = bwd = tp = params = 0.0
                grads, z3_gather, z3_rs = [], 0.0, 0.0
                for c, n in enumerate(plan.chunk_layers(s)):
                    vs = c * p + s
                    f, b, t, prm, _ = self.chunk(plan, rank, n, vs == 0, vs == p * v - 1)
                    fwd, bwd, tp, params = fwd + f, bwd + b, tp + t, params + prm
                    if plan.dp == 1:
                        continue
                    gbytes = prm * self.grad_bytes(prec)
                    if plan.zero == 3:
                        ag0, ag1 = self.dp_op(plan, s, "all_gather")
                        rs0, rs1 = self.dp_op(plan, s, "reduce_scatter")
                        z3_gather = max(z3_gather, ag0 + ag1 * prm * BYTES[prec])
                        z3_rs = max(z3_rs, rs0 + rs1 * gbytes)
                        continue
                    k = n_buckets(gbytes, n)
                    size = gbytes / k
                    if frac is not None:
                        elems = size / self.grad_bytes(prec)
                        nnz = max(1.0, frac * elems)
                        a0, a1 = self.dp_op(plan, s, "sparse")
                        t_b = (topk_compress_time_s(elems, gpu, eff) + a0 + a1 * nnz * TOPK_ENTRY_BYTES
                               + topk_decompress_time_s(elems, (plan.dp - 1) * nnz, TOPK_ENTRY_BYTES, gpu, eff))
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
                opt_params = params / plan.dp if plan.zero >= 1 else params
                gather = 0.0
                if plan.zero in (1, 2) and plan.dp > 1:
                    g0, g1 = self.dp_op(plan, s, "all_gather")
                    gather = g0 + g1 * params * BYTES[prec]
                stages.append(StageCost(fwd_s=fwd, bwd_s=bwd, tp_s=tp, p2p_s=p2p, grads=tuple(grads),
                                        optimizer_s=optimizer_time_s(opt_params, gpu, eff, prec, self.runtime),
                                        gather_s=gather, zero3_gather_s=z3_gather, zero3_rs_s=z3_rs, vpp=v))
            out.append(PipelineCost(tuple(stages), m, v, plan.schedule, len(members)))
        return out
