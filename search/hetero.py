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

from costmodel import memory as mem
from specs.plan import Plan
from search.costs import CostTables, peak_inflight


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


def _stage_extras(tables: CostTables, plan: Plan, rank: int, s: int) -> tuple[float, float]:
    """(seconds per microbatch, parameters) of the embedding/head that stage s holds."""
    p, v = plan.pp, plan.vpp
    t = params = 0.0
    for c in range(v):
        vs = c * p + s
        f, b, _, prm, _ = tables.chunk(plan, rank, 0, vs == 0, vs == p * v - 1)
        t, params = t + f + b, params + prm
    return t, params


def _max_layers(tables: CostTables, plan: Plan, d: int, s: int, m: int) -> int:
    """Most layers stage s of replica d can hold: memory is linear in the layer count."""
    rank = plan.rank(d, s, 0)
    gpu = tables.cluster.devices[rank].gpu
    one = tables.work(plan, rank, 1, False, False)
    _, extra_params = _stage_extras(tables, plan, rank, s)
    state = lambda params: sum(mem.model_state_bytes(params, plan.dp, plan.zero, plan.precision).values())
    inflight = peak_inflight(plan.schedule, plan.pp, m, plan.vpp, s)
    fixed = state(extra_params)
    if s == plan.pp - 1:  # the last virtual stage is always on the last rank
        fixed += mem.logits_bytes(tables.model, plan.mbs, plan.tp)
    per_layer = state(one.params) + one.act_bytes * inflight / plan.vpp
    return max(0, math.floor((gpu.mem_bytes - fixed) / per_layer))


def balanced_layers(tables: CostTables, plan: Plan) -> tuple[int, ...] | None:
    """Layers per stage proportional to the slowest GPU type each stage runs on; None
    when no split fits in memory."""
    p = plan.pp
    m_max = max(plan.mb_shares)
    per_layer, fixed, hi = [], [], []
    for s in range(p):
        # A stage is as slow as its slowest replica (the DP reduction waits for it).
        d = max(range(plan.dp), key=lambda d: (tables.layer_time_s(plan, plan.rank(d, s, 0)), -d))
        rank = plan.rank(d, s, 0)
        per_layer.append(tables.layer_time_s(plan, rank))
        fixed.append(_stage_extras(tables, plan, rank, s)[0])
        hi.append(min(_max_layers(tables, plan, dd, s, m_max) for dd in range(plan.dp)))
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
                for c, n in enumerate(plan.chunk_layers(s)):
                    vs = c * p + s
                    f, b, *_ = tables.chunk(plan, rank, n, vs == 0, vs == p * v - 1)
                    t += f + b
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
