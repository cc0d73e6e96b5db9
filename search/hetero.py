"""Heterogeneous clusters: split layers over pipeline stages and microbatches over
data-parallel replicas in proportion to each device group's speed.

Speed is what the cost model says one layer's forward + backward takes on a GPU type
(catalogued datasheet peaks x the hardware profile's efficiencies; a calibrated profile
makes it a measured speed). Stages on faster GPUs get more layers; replicas on faster GPUs
get more microbatches. Both are min-max problems with increasing linear costs, solved
exactly by water-filling: hand out one unit (a layer, or a group of microbatches) at a time
to whoever would finish it soonest. Memory caps the layers a stage may take.

Stage placement: ``placement=tp-dp-pp`` keeps every pipeline stage's replicas side by side
in rank order, so whole stages land on one device group (the first stages on the group
listed first in the topology file); ``tp-pp-dp`` puts whole replicas on groups. The search
tries both and keeps what the estimate and the simulation prefer.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import replace

from costmodel.device_memory import ChunkSpec, device_memory
from sim.program import memory_config, schedule_inflight, stage_chunks
from specs.plan import Plan
from search.costs import CostTables


def water_fill(total: int, unit_cost: list[float], fixed: list[float], lo: list[int],
               hi: list[int] | None = None, step: int = 1) -> tuple[int, ...] | None:
    """Integers n_i (multiples of ``step``, lo_i <= n_i <= hi_i, summing to ``total``)
    minimising max_i (fixed_i + n_i * unit_cost_i). None if no split fits the bounds.
    Ties go to the lower index (deterministic)."""
    k = len(unit_cost)
    hi = hi if hi is not None else [total] * k
    n = list(lo)
    left = total - sum(n)
    if left < 0 or left % step or any(a > b for a, b in zip(lo, hi)):
        return None
    heap = [(fixed[i] + (n[i] + step) * unit_cost[i], i) for i in range(k) if n[i] + step <= hi[i]]
    heapq.heapify(heap)
    while left > 0:
        if not heap:
            return None
        _, i = heapq.heappop(heap)
        n[i] += step
        left -= step
        if n[i] + step <= hi[i]:
            heapq.heappush(heap, (fixed[i] + (n[i] + step) * unit_cost[i], i))
    return tuple(n)


def _type_grid(tables: CostTables, plan: Plan) -> list[list[str]]:
    devs = tables.cluster.devices
    return [[devs[plan.rank(d, s, 0)].gpu.name for s in range(plan.pp)] for d in range(plan.dp)]


def _stage_extras(tables: CostTables, plan: Plan, rank: int, s: int) -> float:
    """Seconds per microbatch of the embedding/head that stage s holds."""
    t = 0.0
    for ch in stage_chunks(plan, s):
        cost = tables.chunk(plan, rank, 0, ch.first, ch.last)
        t += cost.fwd_s + cost.bwd_s
    return t


def _max_layers(tables: CostTables, plan: Plan, s: int, m: int) -> int:
    """Most layers stage s can hold on every replica (the smallest device among them
    bounds it), by the one memory model (sim.program.stage_memory) with ``m``
    microbatches in flight; memory grows with the layer count, so bisect."""
    cap = min(tables.cluster.devices[plan.rank(d, s, 0)].gpu.mem_bytes for d in range(plan.dp))
    memo = tables.memo.setdefault("max_layers", {})
    key = (memory_config(plan, tables.runtime), plan.schedule, plan.pp, plan.vpp, s, m, cap)
    got = memo.get(key)
    if got is None:
        got = memo[key] = _bisect_layers(tables, plan, s, m, cap)
    return got


def _bisect_layers(tables: CostTables, plan: Plan, s: int, m: int, cap: float) -> int:
    """Largest n with stage s's memory at n layers (costmodel.device_memory, as
    sim.program.stage_memory calls it) <= cap. With n a multiple of vpp every chunk holds
    n/vpp layers, so memory is linear in n there: two evaluations place the answer within
    one vpp-wide window, which a bisection then resolves."""
    v = plan.vpp
    cfg = memory_config(plan, tables.runtime)
    inflight = schedule_inflight(plan.schedule, plan.pp, m, v)[s]
    flags = stage_chunks(plan, s)
    splits = tables.memo.setdefault("chunk_split", {})

    def need(n: int) -> float:
        split = splits.get((n, v))
        if split is None:  # Plan.chunk_layers depends on the layer count and vpp only
            split = splits[(n, v)] = replace(plan, layers=(n,) * plan.pp).chunk_layers(s)
        chunks = tuple(ChunkSpec(k, f.first, f.last) for k, f in zip(split, flags))
        return sum(device_memory(tables.model, cfg, chunks, inflight).values())

    base = need(0)
    if base > cap:
        return 0
    per_window = need(v) - base
    top = tables.model.num_layers
    k = top // v if per_window <= 0 else min(top // v, math.floor((cap - base) / per_window))
    while k > 0 and need(k * v) > cap:  # guard against rounding in the division
        k -= 1
    lo, hi = k * v, min(top, k * v + v - 1)
    while lo < hi:  # invariant: need(lo) <= cap; nothing above hi fits
        mid = (lo + hi + 1) // 2
        if need(mid) <= cap:
            lo = mid
        else:
            hi = mid - 1
    return lo


def balanced_layers(tables: CostTables, plan: Plan) -> tuple[int, ...] | None:
    """Layers per stage proportional to the slowest GPU type each stage runs on; None
    when no split fits in memory."""
    p = plan.pp
    m_max = max(plan.mb_shares)
    if plan.schedule == "interleaved":  # its microbatch shares become multiples of p
        m_max = -(-m_max // p) * p
    per_layer, fixed, hi = [], [], []
    for s in range(p):
        # A stage is as slow as its slowest replica (the DP reduction waits for it).
        d = max(range(plan.dp), key=lambda d: (tables.layer_time_s(plan, plan.rank(d, s, 0)), -d))
        rank = plan.rank(d, s, 0)
        per_layer.append(tables.layer_time_s(plan, rank))
        fixed.append(_stage_extras(tables, plan, rank, s))
        hi.append(_max_layers(tables, plan, s, m_max))
    return water_fill(tables.model.num_layers, per_layer, fixed, [plan.vpp] * p, hi)


def balanced_shares(tables: CostTables, plan: Plan) -> tuple[int, ...] | None:
    """Microbatches per replica so that every replica's pipeline finishes together:
    replica d needs about m_d * max_s t_ds + (sum_s t_ds - max_s t_ds)/v for m_d
    microbatches (costmodel/estimate.py's flush time)."""
    total = sum(plan.mb_shares)
    unit = plan.pp if plan.schedule == "interleaved" else 1
    slope, fixed = [], []
    cache: dict[tuple, tuple[float, float]] = {}
    p, v = plan.pp, plan.vpp
    for d in range(plan.dp):
        sig = tuple(tables.cluster.devices[plan.rank(d, s, 0)].gpu.name for s in range(p))
        if sig not in cache:
            ts = []
            for s in range(p):
                rank = plan.rank(d, s, 0)
                t = 0.0
                for ch in stage_chunks(plan, s):
                    cost = tables.chunk(plan, rank, ch.layers, ch.first, ch.last)
                    t += cost.fwd_s + cost.bwd_s
                ts.append(t)
            cache[sig] = (max(ts), (sum(ts) - max(ts)) / v)
        slope.append(cache[sig][0])
        fixed.append(cache[sig][1])
    return water_fill(total, slope, fixed, [unit] * plan.dp, None, unit)


def nonuniform_variant(tables: CostTables, plan: Plan) -> tuple[Plan | None, str]:
    """Memoised on the tables (the search asks for the same plan shape repeatedly)."""
    memo = tables.memo.setdefault("nonuniform", {})
    key = replace(plan, compress="none", allreduce="ring")
    got = memo.get(key)
    if got is None:
        got = memo[key] = _nonuniform_variant(tables, key)
    var, why = got
    if var is not None:
        var = replace(var, compress=plan.compress, allreduce=plan.allreduce)
    return var, why


def _nonuniform_variant(tables: CostTables, plan: Plan) -> tuple[Plan | None, str]:
    """The balanced version of ``plan``: layers per stage by the stages' GPU types,
    microbatches per replica by the replicas' speeds, with explicit ``layers`` /
    ``mb_shares`` wherever they are not all equal. None and the reason when there is
    nothing to balance or no split fits."""
    grid = _type_grid(tables, plan)
    layers, shares = plan.layers, plan.mb_shares
    if len({tuple(sorted({grid[d][s] for d in range(plan.dp)})) for s in range(plan.pp)}) > 1:
        layers = balanced_layers(tables, plan)
        if layers is None:
            return None, "no layer split fits in memory"
    trial = replace(plan, layers=layers)
    if len({tuple(row) for row in grid}) > 1:
        shares = balanced_shares(tables, trial)
        if shares is None:
            return None, "no microbatch split fits the schedule"
    explicit_layers, explicit_shares = len(set(layers)) > 1, len(set(shares)) > 1
    if not (explicit_layers or explicit_shares):
        return None, "uniform split is already balanced"
    return replace(plan, layers=layers, mb_shares=shares, explicit_layers=explicit_layers,
                   explicit_shares=explicit_shares), ""


def describe_split(tables: CostTables, plan: Plan) -> str:
    """Which device group got how many layers / microbatches, in words."""
    devs = tables.cluster.devices
    parts = []
    if plan.explicit_layers:
        by_group: dict[str, list[str]] = {}
        for s in range(plan.pp):
            g = devs[plan.rank(0, s, 0)].group
            by_group.setdefault(g, []).append(f"stage {s}: {plan.layers[s]}")
        parts.append("layers per stage " + "; ".join(f"{g} ({', '.join(v)})" for g, v in by_group.items()))
    if plan.explicit_shares:
        by_group2: dict[str, list[int]] = {}
        for d in range(plan.dp):
            g = "+".join(sorted({devs[plan.rank(d, s, 0)].group for s in range(plan.pp)}))
            by_group2.setdefault(g, []).append(plan.mb_shares[d])
        parts.append("microbatches per replica " + "; ".join(
            f"{g}: {', '.join(map(str, sorted(set(v), reverse=True)))} (x{len(v)} replicas)"
            for g, v in by_group2.items()))
    return "; ".join(parts) if parts else "even split"


def group_speeds(tables: CostTables, plan: Plan) -> dict[str, tuple[str, float]]:
    """Device group -> (GPU type, seconds for one layer's forward + backward of one
    microbatch under ``plan``'s tp/mbs/sp/recompute)."""
    out: dict[str, tuple[str, float]] = {}
    for name, ranks in tables.cluster.groups().items():
        r = ranks[0]
        out[name] = (tables.cluster.devices[r].gpu.name, tables.layer_time_s(plan, r))
    return out
