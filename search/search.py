"""Plan search: enumerate -> prune (with reasons) -> analytic estimate -> simulate the best.

Explored: tp, cp (context parallelism, for long sequences), pp (dp follows), mbs, schedule and vpp, sp, recompute, ZeRO stage, top-k
compression and the all-reduce algorithm; on heterogeneous clusters also the placement
(whole stages or whole replicas per device group) and the balanced non-uniform split of
layers and microbatches (search/hetero.py). Every dropped plan is counted under the reason it
was dropped. Survivors are ranked by costmodel/estimate.py; the best ``top`` (at least 10)
are re-scored by the discrete-event simulation, which sets the final order.

Lossy compression policy: top-k with error feedback changes the optimiser's trajectory,
which a step-time model cannot price, so a compressed plan ranks above a dense one only if
its step is at least ``compress_margin`` (default 5 %) shorter; the same margin applies to
one-step-delayed gradients (search/overlap.py). Ties break on the plan string.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace

from tqdm import tqdm

from costmodel.errors import InputError
from costmodel.estimate import StepEstimate, estimate_step
from costmodel.profile import Profile
from costmodel.shapes import ModelSpec
from search.executor import ExecutorSpec, run_tasks
from search.executor import bar_off as _bar_off
from search.hetero import nonuniform_variant
from sim.metrics import simulate
from specs.plan import Plan, resolve_plan
from sim.result import SearchResult, StepResult
from search.costs import CostTables
from search.cp_findings import cp_note
from search.findings import compression_note, estimate_note, hetero_note
from search.overlap import is_stale, overlap_note, overlap_variants
from specs.topology import Cluster

MIN_SIMULATED = 10

R_TP_HEADS = "tp does not divide heads / ffn"
R_TP_NODES = "tp spans nodes"
R_TP_MIXED = "TP group mixes GPU types"
R_LAYERS = "layers not divisible by pp*vpp"
R_BATCH = "batch not divisible by dp*mbs"
R_IL_PP = "interleaved needs pp >= 2"
R_IL_M = "interleaved needs microbatches % pp == 0"
R_OOM = "out of memory"
R_NO_DP = "no effect without data parallelism"
R_ALGO_UNUSED = "allreduce algorithm unused (ZeRO or top-k)"
R_COMPRESS_Z3 = "compression unused with zero=3"
R_RECOMPUTE = "dominated: less recompute fits"
R_ZERO2 = "dominated: zero=1 fits and is as fast"
R_AUTO = "duplicate: allreduce=auto resolves to a listed algorithm"
R_HIER_RING = "duplicate: hierarchical is ring with one DP rank per node"
R_HIER_UNEVEN = "hierarchical needs the same DP ranks on every node"
R_Z3_CLASSES = "zero=3 needs identical replicas (engine)"
R_GPIPE = "dominated: gpipe = 1f1b with pp=1 or one microbatch, more memory"
R_PLACEMENT = "duplicate: placement has no effect with pp=1 or dp=1"
R_SP_SEQ = "sequence parallelism needs tp to divide seq_length"
R_CP_HEADS = "cp_comm=a2a needs tp*cp to divide heads and cp the K/V heads per TP rank"


@dataclass(frozen=True)
class SearchSpace:
    mbs: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
    vpp: tuple[int, ...] = (2, 3, 4, 6)  # chunks per rank for the interleaved schedule
    recompute: tuple[str, ...] = ("none", "selective", "full")
    zero: tuple[int, ...] = (0, 1, 2, 3)
    compress: tuple[str, ...] = ("none", "topk:0.01", "topk:0.001")
    allreduce: tuple[str, ...] = ("ring", "tree", "hierarchical", "auto")
    overlap_step: tuple[str, ...] = ("layerwise", "delayed")  # cross-step variants of the best plans
    tp: tuple[int, ...] | None = None  # None: divisors of the device count up to 2 nodes
    # None: 1 and the powers of two that leave every rank at least MIN_CP_TOKENS tokens
    # (homogeneous clusters; see cp_options)
    cp: tuple[int, ...] | None = None
    cp_comm: tuple[str, ...] = ("ring",)
    pp: tuple[int, ...] | None = None  # None: divisors of devices/tp up to the layer count

    def schedule_options(self) -> list[tuple[str, int]]:
        out = [(s, 1) for s in self.schedules if s != "interleaved"]
        if "interleaved" in self.schedules:
            out += [("interleaved", v) for v in self.vpp]
        return out


# Context parallelism is searched only where it leaves each rank at least this many
# tokens of every sequence: below it a K/V block's attention (quadratic in the block) is
# too short to hide the block's transfer, and activations are small anyway. Llama 3 405B's
# 128k-token phase ran cp=16, 8,192 tokens per rank (Dubey et al. 2024, Table 4).
MIN_CP_TOKENS = 4096


def cp_options(model: ModelSpec, devices_per_tp: int, space: "SearchSpace", heterogeneous: bool) -> list[int]:
    """cp degrees to try: the space's, or 1 and every power of two c with seq % (2c) == 0
    (causal load balancing), seq/c >= MIN_CP_TOKENS and c dividing the devices left."""
    seq = model.seq_length
    if space.cp is not None:
        return [c for c in space.cp if c == 1 or (seq % (2 * c) == 0 and devices_per_tp % c == 0)]
    out, c = [1], 2
    while not heterogeneous and seq // c >= MIN_CP_TOKENS and seq % (2 * c) == 0 and devices_per_tp % c == 0:
        out.append(c)
        c *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _split(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


class NoPlanFits(InputError):
    """No candidate plan fits the cluster. ``closest`` is the plan that missed by the least
    memory (``shortfall_gib`` per GPU), None when nothing came that close (structural
    prunes only); the command line adds the smallest change that would fit."""

    def __init__(self, model: ModelSpec, cluster: Cluster, pruned: dict[str, int],
                 closest: str | None, shortfall_gib: float | None):
        self.closest, self.shortfall_gib, self.pruned = closest, shortfall_gib, pruned
        top = "; ".join(f"{reason}: {n:,}" for reason, n in list(pruned.items())[:3])
        why = f"no plan fits (pruned: {top})"
        if closest is not None:
            why += f"; closest: {closest} needs {shortfall_gib:.1f} GiB more per GPU"
        super().__init__("search", None, f"{model.name} on {cluster.name} ({cluster.num_devices} devices): {why}")


class _Pruner:
    def __init__(self):
        self.counts: Counter = Counter()
        self.examples: dict[str, str] = {}
        self.generated = 0  # candidates added beyond the cross product (balanced variants)
        self.closest: tuple[float, str] | None = None  # (shortfall GiB, plan) of the nearest miss

    def out_of_memory(self, plan: Plan, shortfall_gib: float, n: int) -> None:
        text = plan.to_string()
        self.add(R_OOM, n, text)
        if self.closest is None or (shortfall_gib, text) < self.closest:
            self.closest = (shortfall_gib, text)

    def add(self, reason: str, n: int, example: str) -> None:
        if n <= 0:
            return
        self.counts[reason] += n
        self.examples.setdefault(reason, example)


def _enumerate(model: ModelSpec, cluster: Cluster, tables: CostTables, space: SearchSpace,
               pr: _Pruner, compress_margin: float, bar) -> tuple[list, int]:
    """All surviving plans with their estimates: [(rank key, plan string, plan, estimate)]."""
    n = cluster.num_devices
    gpn = min(len(node.ranks) for node in cluster.nodes)
    hetero = tables.heterogeneous
    placements = ("tp-pp-dp", "tp-dp-pp") if hetero else ("tp-pp-dp",)
    sched = space.schedule_options()
    n_dpv = len(space.zero) * len(space.compress) * len(space.allreduce)
    n_sp = lambda tp: 2 if tp > 1 else 1
    tps = space.tp or tuple(t for t in _divisors(n) if t <= 2 * gpn)
    L, gbs = model.num_layers, model.global_batch_size
    out: list = []
    candidates = 0

    node_sizes = {len(node.ranks) for node in cluster.nodes}
    pps_of = lambda tp, cp: space.pp or tuple(p for p in _divisors(n // (tp * cp)) if p <= L)
    for tp in tps:
        cps = cp_options(model, n // tp, space, hetero)
        n_pp = sum(len(pps_of(tp, c)) * (len(space.cp_comm) if c > 1 else 1) for c in cps)
        size_tp = n_pp * len(placements) * len(space.mbs) * len(sched) * n_sp(tp) * len(space.recompute) * n_dpv
        ex = f"tp={tp}"
        if model.num_attention_heads % tp or model.ffn % tp or (model.kv_groups % tp and tp % model.kv_groups):
            pr.add(R_TP_HEADS, size_tp, ex)
            candidates += size_tp
            bar.update(n_pp * len(placements))
            continue
        # Every TP group must sit within one node: with tp=3 on 8-GPU nodes the third group
        # would straddle two nodes (and simulate refuses such plans).
        if tp > gpn or any(size % tp for size in node_sizes):
            pr.add(R_TP_NODES, size_tp, ex)
            candidates += size_tp
            bar.update(n_pp * len(placements))
            continue
        for cp, cp_comm, pp in ((c, cc, p) for c in cps for cc in (space.cp_comm if c > 1 else space.cp_comm[:1])
                                for p in pps_of(tp, c)):
            dp = n // (tp * cp * pp)
            for placement in placements:
                bar.update(1)
                size_pl = len(space.mbs) * len(sched) * n_sp(tp) * len(space.recompute) * n_dpv
                candidates += size_pl
                if placement != "tp-pp-dp" and (pp == 1 or dp == 1):
                    pr.add(R_PLACEMENT, size_pl, f"tp={tp},pp={pp},dp={dp},placement={placement}")
                    continue
                if cp_comm == "a2a" and (model.num_attention_heads % (tp * cp)
                                         or max(model.kv_groups // tp, 1) % cp):
                    pr.add(R_CP_HEADS, size_pl, f"tp={tp},cp={cp},cp_comm=a2a")
                    continue
                base = Plan(tp=tp, pp=pp, dp=dp, mbs=1, vpp=1, schedule="1f1b", sp=False, recompute="none",
                            zero=0, overlap_grad_reduce=True, compress="none", allreduce="ring",
                            precision="bf16", placement=placement, layers=_split(L, pp), mb_shares=(1,) * dp,
                            cp=cp, cp_comm=cp_comm if cp > 1 else "ring")
                if hetero and any(len({cluster.devices[r].gpu.name for r in base.tp_group(d, s, c)}) > 1
                                  or len({cluster.devices[r].gpu.name for r in base.cp_group(d, s, 0)}) > 1
                                  for d in range(dp) for s in range(pp) for c in range(cp)):
                    pr.add(R_TP_MIXED, size_pl, base.to_string())
                    continue
                for mbs in space.mbs:
                    size_m = len(sched) * n_sp(tp) * len(space.recompute) * n_dpv
                    total_mb, rem = divmod(gbs, mbs)
                    even = not rem and total_mb % dp == 0
                    ex = f"tp={tp},{f'cp={cp},' if cp > 1 else ''}pp={pp},dp={dp},mbs={mbs}"
                    if rem or total_mb < dp or (not even and not hetero):
                        pr.add(R_BATCH, size_m, ex)
                        continue
                    shares = _split(total_mb, dp)
                    for schedule, vpp in sched:
                        size_s = n_sp(tp) * len(space.recompute) * n_dpv
                        ex = (f"tp={tp},{f'cp={cp},' if cp > 1 else ''}pp={pp},dp={dp},mbs={mbs},"
                              + (f"vpp={vpp}," if vpp > 1 else "")
                              + f"schedule={schedule}")
                        if schedule == "interleaved" and pp < 2:
                            pr.add(R_IL_PP, size_s, ex)
                            continue
                        if schedule == "gpipe" and "1f1b" in space.schedules and (pp == 1 or total_mb == dp):
                            pr.add(R_GPIPE, size_s, ex)
                            continue
                        uniform_layers = L % (pp * vpp) == 0
                        if not uniform_layers and not hetero:
                            pr.add(R_LAYERS, size_s, ex)
                            continue
                        for sp in ((False, True) if tp > 1 else (False,)):
                            if sp and (model.seq_length // cp) % tp:
                                pr.add(R_SP_SEQ, len(space.recompute) * n_dpv, ex + ",sp=true")
                                continue
                            for rc in space.recompute:
                                core = replace(base, mbs=mbs, vpp=vpp, schedule=schedule, sp=sp, recompute=rc,
                                               mb_shares=shares)
                                out += _dp_variants(core, tables, space, pr, even and uniform_layers,
                                                    compress_margin)
    return out, candidates


def _variants_of(plan: Plan, tables: CostTables, uniform_ok: bool, pr: _Pruner, n_below: int) -> list[Plan]:
    """The uniform plan (if its even split is valid) and, on heterogeneous clusters, the
    balanced non-uniform plan (each a family of ``n_below`` candidates)."""
    out = []
    if uniform_ok:
        out.append(plan)
    else:
        reason = R_LAYERS if tables.model.num_layers % (plan.pp * plan.vpp) else R_BATCH
        # The example is the uniform plan that was refused: its string without the split.
        pr.add(reason, n_below, plan.to_string(split=False))
    if tables.heterogeneous:
        var, _why = nonuniform_variant(tables, plan)
        if var is not None:
            pr.generated += n_below
            out.append(var)
    return out


def _interleave_ok(plan: Plan) -> bool:
    return plan.schedule != "interleaved" or (all(m % plan.pp == 0 for m in plan.mb_shares)
                                              and all(n >= plan.vpp for n in plan.layers))


def _dp_variants(core: Plan, tables: CostTables, space: SearchSpace, pr: _Pruner, uniform_ok: bool,
                 compress_margin: float) -> list:
    """Zero / compression / all-reduce variants of one core plan, pruned and estimated."""
    out = []
    rc_order = ("none", "selective", "full")
    for zero in space.zero:
        per_zero = len(space.compress) * len(space.allreduce)
        zplan = replace(core, zero=zero)
        for plan in _variants_of(zplan, tables, uniform_ok, pr, per_zero):
            ex = plan.to_string()
            if not _interleave_ok(plan):
                pr.add(R_IL_M, per_zero, ex)
                continue
            if plan.grad_degree == 1 and zero != 0:
                pr.add(R_NO_DP, per_zero, ex)
                continue
            if zero == 3 and len(tables.classes(plan)) > 1:
                pr.add(R_Z3_CLASSES, per_zero, ex)
                continue
            short = tables.memory_shortfall_gib(plan)
            if short > 0:
                pr.out_of_memory(plan, short, per_zero)
                continue
            less = rc_order[:rc_order.index(plan.recompute)]
            # Same split with less recompute fits: it is as fast or faster (less backward work).
            if any(r in space.recompute and tables.memory_shortfall_gib(replace(plan, recompute=r)) <= 0
                   for r in less):
                pr.add(R_RECOMPUTE, per_zero, ex)
                continue
            if zero == 2 and 1 in space.zero and tables.memory_shortfall_gib(replace(plan, zero=1)) <= 0:
                pr.add(R_ZERO2, per_zero, ex)
                continue
            for compress in space.compress:
                for algo in space.allreduce:
                    cand = replace(plan, compress=compress, allreduce=algo)
                    ex = cand.to_string()
                    if plan.grad_degree == 1 and (compress != "none" or algo != "ring"):
                        pr.add(R_NO_DP, 1, ex)
                        continue
                    if zero == 3 and compress != "none":
                        pr.add(R_COMPRESS_Z3, 1, ex)
                        continue
                    if algo != "ring" and (zero >= 1 or compress != "none"):
                        pr.add(R_ALGO_UNUSED, 1, ex)
                        continue
                    per_node = tables.dp_ranks_per_node(cand)
                    if algo == "hierarchical" and per_node == {1}:
                        pr.add(R_HIER_RING, 1, ex)
                        continue
                    algos = None
                    if algo == "auto":
                        algos = tables.resolve_auto(cand)
                    if "hierarchical" in (algos or (algo,)) and len(per_node) > 1:
                        pr.add(R_HIER_UNEVEN, 1, ex)
                        continue
                    if algo == "auto":
                        if len(set(algos)) == 1 and algos[0] in space.allreduce:
                            pr.add(R_AUTO, 1, ex)
                            continue
                    est = estimate_step(tables.pipelines(cand, algos))
                    key = est.step_s * (1 + compress_margin if compress != "none" else 1.0)
                    out.append((key, ex, cand, est))
    return out


class _NoBar:
    def update(self, n: int) -> None:
        pass


def best_estimated_plan(model: ModelSpec, cluster: Cluster, profile: Profile,
                        space: SearchSpace | None = None, compress_margin: float = 0.05) -> str | None:
    """The plan the analytic estimate ranks first, None when no plan fits (no simulation):
    what the command line uses to find the smallest cluster on which something fits."""
    tables = CostTables(model, cluster, profile)
    survivors, _ = _enumerate(model, cluster, tables, space or SearchSpace(), _Pruner(), compress_margin, _NoBar())
    return min(survivors, key=lambda x: (x[0], x[1]))[1] if survivors else None


# ---------------------------------------------------------------------------- simulation

def _sim_one(ctx: tuple, plan_str: str) -> StepResult:
    """One simulation task: ``ctx`` is (model, cluster, profile), shipped once per worker."""
    model, cluster, profile = ctx
    plan = resolve_plan(plan_str, model, cluster.num_devices)
    return simulate(model, plan, cluster, profile)


def simulate_plans(model: ModelSpec, cluster: Cluster, profile: Profile, plans: list[str],
                   workers: int = 1, progress: bool | None = True, desc: str = "simulate",
                   executor: ExecutorSpec | None = None) -> list[StepResult]:
    """Simulate plan strings, results in the same order: in this process, a local process
    pool when workers > 1, or on Ray (``executor``; search/executor.py)."""
    spec = executor or ExecutorSpec("local", jobs=workers)
    return run_tasks(_sim_one, (model, cluster, profile), plans, spec, progress, desc)


def _rank_key(res: StepResult, compress_margin: float) -> tuple:
    # Top-k compression and one-step-stale gradients change the optimisation: margin.
    lossy = "compress=topk" in res.plan or is_stale(res.plan)
    return (not res.fits_memory, res.step_time_s * (1 + compress_margin if lossy else 1.0), res.plan)


def search(model: ModelSpec, cluster: Cluster, profile: Profile, top: int = 10, workers: int = 1,
           progress: bool | None = None, space: SearchSpace | None = None,
           compress_margin: float = 0.05, record_best: bool = True,
           executor: ExecutorSpec | None = None) -> SearchResult:
    """Search parallel plans for ``model`` on ``cluster``; the best max(top, 10) by the
    analytic estimate are simulated and returned best first. ``record_best``: re-simulate
    the best two with their timelines recorded (for a report's Gantt charts; costs two
    more simulations, so callers that write no report pass False). The simulations run on
    ``executor`` (default: ``workers`` local processes)."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    tables = CostTables(model, cluster, profile)
    pr = _Pruner()
    n = cluster.num_devices
    gpn = min(len(node.ranks) for node in cluster.nodes)
    tps = space.tp or tuple(t for t in _divisors(n) if t <= 2 * gpn)
    n_cores = sum(len(space.pp or [p for p in _divisors(n // (t * c)) if p <= model.num_layers])
                  * (len(space.cp_comm) if c > 1 else 1)
                  for t in tps for c in cp_options(model, n // t, space, tables.heterogeneous))
    n_cores *= 2 if tables.heterogeneous else 1
    with tqdm(total=n_cores, desc="estimate", unit="family", disable=_bar_off(progress), leave=False) as bar:
        survivors, candidates = _enumerate(model, cluster, tables, space, pr, compress_margin, bar)
    survivors.sort(key=lambda x: (x[0], x[1]))
    pruned = dict(sorted(pr.counts.items(), key=lambda kv: (-kv[1], kv[0])))
    if not survivors:
        raise NoPlanFits(model, cluster, pruned, *(reversed(pr.closest) if pr.closest else (None, None)))
    k = max(top, MIN_SIMULATED)
    chosen = [s for s in survivors[:k]]
    if tables.heterogeneous:
        # Make sure the best uniform plans are simulated too: the report compares them.
        uniform = [s for s in survivors if not (s[2].explicit_layers or s[2].explicit_shares)]
        chosen += [s for s in uniform[:3] if s not in chosen]
    estimates: dict[str, StepEstimate] = {s[1]: s[3] for s in chosen}
    results = simulate_plans(model, cluster, profile, [s[1] for s in chosen], workers, progress,
                             executor=executor)
    results.sort(key=lambda r: _rank_key(r, compress_margin))
    if not results[0].fits_memory:  # the estimate's memory is the simulation's, so not expected
        best = min(results, key=lambda r: r.memory_shortfall_gib)
        raise NoPlanFits(model, cluster, pruned, best.plan, best.memory_shortfall_gib)

    notes = []
    if results:
        best = results[0]
        extra_plans, note_fn = compression_note(tables, best, space, compress_margin)
        have = {r.plan for r in results}
        todo = [p for p in extra_plans if p not in have]
        extra = simulate_plans(model, cluster, profile, todo, workers, progress, "compression",
                               executor) if todo else []
        by_plan = {r.plan: r for r in results + extra}
        variants = overlap_variants(results, model, n, space.overlap_step)
        todo = [p for p in variants if p not in by_plan]
        for r in simulate_plans(model, cluster, profile, todo, workers, progress, "overlap", executor) if todo else []:
            by_plan[r.plan] = r
        if tables.heterogeneous:
            notes.append(hetero_note(tables, results))
        notes.append(note_fn(by_plan))
        considered = sorted({c for t in tps for c in cp_options(model, n // t, space, tables.heterogeneous)})
        no_cp = [x for x in survivors if x[2].cp == 1]
        best_no_cp = (no_cp[0][2], no_cp[0][3].step_s) if no_cp else None  # survivors are sorted
        notes.append(cp_note(tables, results, tuple(considered), best_no_cp))
        notes.append(estimate_note(results, estimates))
        notes.append(overlap_note(by_plan, variants, compress_margin, model, n))
        results = sorted(by_plan.values(), key=lambda r: _rank_key(r, compress_margin))
        # Record the best two again with their segments, for the report's Gantt charts.
        for i in range(min(2, len(results)) if record_best else 0):
            plan = resolve_plan(results[i].plan, model, n)
            results[i] = simulate(model, plan, cluster, profile, record=True)
    return SearchResult(topology=cluster.name, model=model.name, num_devices=n, ranked=results,
                        pruned=pruned,
                        pruned_examples=dict(sorted(pr.examples.items())), candidates=candidates + pr.generated,
                        estimated=len(survivors), notes=[x for x in notes if x],
                        wall_s=time.perf_counter() - t0)
