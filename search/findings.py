"""Sentences with figures that explain a search's findings (SearchResult.notes): the
heterogeneous win, the top-k compression decision, and how well the estimate ranked."""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Callable

from costmodel.efficiency import topk_compress_time_s, topk_decompress_time_s
from costmodel.estimate import StepEstimate, estimate_step
from search.hetero import describe_split, group_speeds
from specs.plan import Plan, resolve_plan
from costmodel.dtypes import topk_entry_bytes
from sim.program import n_buckets, stage_chunks
from sim.result import StepResult
from search.costs import CostTables

TOPK_FRACTIONS = ("topk:0.01", "topk:0.001")


def _plan(tables: CostTables, text: str) -> Plan:
    return resolve_plan(text, tables.model, tables.cluster.num_devices)


def _is_nonuniform(res: StepResult) -> bool:
    return "layers=" in res.plan or "mb_shares=" in res.plan


def hetero_note(tables: CostTables, results: list[StepResult]) -> str:
    """Best non-uniform vs best uniform simulated plan, with the split and the speeds behind it."""
    fits = [r for r in results if r.fits_memory]
    nonuni = [r for r in fits if _is_nonuniform(r)]
    uni = [r for r in fits if not _is_nonuniform(r)]
    if not nonuni or not uni:
        return ("Heterogeneous cluster: no comparison of non-uniform and uniform plans "
                f"({len(nonuni)} non-uniform and {len(uni)} uniform plans simulated and fitting).")
    bn = max(nonuni, key=lambda r: (r.tokens_per_s, r.plan))
    bu = max(uni, key=lambda r: (r.tokens_per_s, r.plan))
    gain = bn.tokens_per_s / bu.tokens_per_s - 1
    plan_n = _plan(tables, bn.plan)
    speeds = group_speeds(tables, plan_n)
    fastest = min(speeds.values(), key=lambda x: x[1])[1]
    sp = ", ".join(f"{g} ({gpu}) {1e3 * t:.2f} ms = {fastest / t:.2f}x" for g, (gpu, t) in speeds.items())
    waste_u = (bu.breakdown.get("idle", 0.0) + bu.breakdown.get("bubble", 0.0)) / bu.step_time_s
    waste_n = (bn.breakdown.get("idle", 0.0) + bn.breakdown.get("bubble", 0.0)) / bn.step_time_s
    verdict = "beats" if gain > 0 else "does not beat"
    return (f"Heterogeneous cluster: the best non-uniform plan {bn.plan} reaches {bn.tokens_per_s:,.0f} tokens/s "
            f"and {verdict} the best uniform plan {bu.plan} ({bu.tokens_per_s:,.0f} tokens/s) by "
            f"{100 * gain:+.1f} %. Why: one layer's forward + backward of one microbatch takes {sp} "
            f"(catalogued peak x profile efficiency), so the split gives the faster group more work: "
            f"{describe_split(tables, plan_n)}. Waiting (bubble + idle) falls from {100 * waste_u:.1f} % of the "
            f"uniform plan's step to {100 * waste_n:.1f} %.")


def _dense_twin(tables: CostTables, plan: Plan, algos: tuple[str, ...]) -> Plan:
    """``plan`` itself if dense; else its dense version with the explicit all-reduce
    algorithm the estimate likes best (ties to the plan string)."""
    if plan.compress == "none":
        return plan
    best = None
    even = len(tables.dp_ranks_per_node(plan)) == 1  # hierarchical needs it
    for algo in (a for a in algos if a != "auto" and (a != "hierarchical" or even)) if plan.zero == 0 else ("ring",):
        cand = replace(plan, compress="none", allreduce=algo)
        key = (estimate_step(tables.pipelines(cand)).step_s, cand.to_string())
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1] if best else replace(plan, compress="none", allreduce="ring")


def _dense_volume(tables: CostTables, plan: Plan, dense: Plan) -> tuple[float, float, list[float]]:
    """(dense GB per GPU per step, DP path GB/s per GPU, gradient elements per bucket) of
    stage 0, which stands for the data-parallel path."""
    buckets, elems = [], 0.0
    for ch in stage_chunks(plan, 0):
        nl = ch.layers
        prm = tables.chunk(plan, plan.rank(0, 0, 0), nl, ch.first, ch.last).params
        k = n_buckets(prm * tables.grad_bytes(plan.precision), nl)
        buckets += [prm / k] * k
        elems += prm
    n = plan.dp
    all_reduce = plan.zero == 0 or tables.runtime.zero1_grad_all_reduce
    factor = (2 if all_reduce else 1) * (n - 1) / n  # bytes each rank sends per byte (busbw factor)
    dense_gb = factor * elems * tables.grad_bytes(plan.precision) / 1e9
    algo = dense.allreduce if all_reduce and dense.allreduce != "auto" else "ring"
    _, per_byte = tables.dp_op(dense, 0, "all_reduce" if all_reduce else "reduce_scatter", algo)
    path_gbps = factor / per_byte / 1e9 if per_byte else float("inf")
    return dense_gb, path_gbps, buckets


def compression_note(tables: CostTables, best: StepResult, space,
                     margin: float = 0.05) -> tuple[list[str], Callable[[dict], str]]:
    """(plans to simulate, a function of {plan: result} giving the sentence) for the
    top-k decision on the best plan: dense against each top-k fraction."""
    plan = _plan(tables, best.plan)
    if plan.dp == 1:
        return [], lambda _r: ("Compression: not applicable; the best plan has no data parallelism (dp=1), "
                               "so there are no gradients to exchange.")
    if plan.zero == 3:
        return [], lambda _r: ("Compression: not applicable to the best plan; ZeRO-3 reduce-scatters gradients "
                               "per microbatch and the top-k path replaces only the end-of-step exchange.")
    dense = _dense_twin(tables, plan, tuple(space.allreduce))
    fracs = sorted(set(TOPK_FRACTIONS) | {c for c in space.compress if c != "none"}, key=lambda c: -float(c[5:]))
    variants = {c: replace(plan, compress=c, allreduce="ring") for c in fracs}
    wanted = [dense.to_string()] + [v.to_string() for v in variants.values()]

    def sentence(by_plan: dict[str, StepResult]) -> str:
        d = by_plan[dense.to_string()]
        n = plan.dp
        dense_gb, path_gbps, buckets = _dense_volume(tables, plan, dense)
        gpu = tables.cluster.devices[plan.rank(0, 0, 0)].gpu
        eff = tables.profile.gpu(gpu.name)
        entry = topk_entry_bytes(plan.precision, tables.profile.runtime)
        stats = []  # (gain, fraction, result, compression compute s, sparse GB per GPU)
        for c, v in variants.items():
            r = by_plan[v.to_string()]
            nnz = [max(1.0, float(c[5:]) * e) for e in buckets]
            comp_s = sum(topk_compress_time_s(e, gpu, eff, plan.grad_degree, z)
                         + topk_decompress_time_s(e, plan.grad_degree * z, entry, gpu, eff)
                         for e, z in zip(buckets, nnz))
            sparse_gb = sum((n - 1) * z * entry for z in nnz) / 1e9
            stats.append((1 - r.step_time_s / d.step_time_s, c, r, comp_s, sparse_gb))
        parts = [f"{c}: step {r.step_time_s:.3f} s ({100 * g:+.1f} %), exposed DP {r.exposed_comm_s['dp']:.3f} s, "
                 f"compression compute {1e3 * comp:.1f} ms per step, sparse all-gather {gb:.2f} GB per GPU"
                 for g, c, r, comp, gb in stats]
        gain, frac, _, comp, sparse = max(stats, key=lambda x: (x[0], x[1]))
        exposed = d.exposed_comm_s["dp"]
        if gain >= margin:
            verdict = f"top-k pays: {frac} shortens the step by {100 * gain:.1f} %"
        elif gain > 0:
            verdict = (f"top-k does not pay: the best fraction ({frac}) saves only {100 * gain:.1f} %, "
                       f"below the {100 * margin:.0f} % a lossy compression must buy")
        else:
            verdict = "top-k does not pay: every fraction makes the step longer"
        if exposed < 0.05 * d.step_time_s:
            why = (f"the dense exchange is already hidden behind the backward pass (exposed {exposed:.3f} s, "
                   f"{100 * exposed / d.step_time_s:.1f} % of the step), so there is little to win")
        elif sparse < dense_gb and gain > 0:
            why = (f"the dense exchange is exposed for {exposed:.3f} s on a {path_gbps:.1f} GB/s path; {frac} cuts "
                   f"the volume per GPU from {dense_gb:.2f} to {sparse:.2f} GB (it grows with dp-1 = {n - 1}) "
                   f"for {1e3 * comp:.0f} ms of compression compute")
        else:
            why = (f"the sparse all-gather ({sparse:.2f} GB per GPU, growing with dp-1 = {n - 1}) plus "
                   f"{1e3 * comp:.0f} ms of compression compute cost more than the {exposed:.3f} s of exposed dense "
                   f"exchange they replace")
        return (f"Compression on the best plan's shape (dp={n}): {verdict}. Dense {dense.to_string()}: step "
                f"{d.step_time_s:.3f} s, exposed DP {exposed:.3f} s, {dense_gb:.2f} GB per GPU over a DP path of "
                f"about {path_gbps:.1f} GB/s per GPU. " + "; ".join(parts) + f". Why: {why}. (Speed only: the "
                "effect of top-k with error feedback on convergence is not modelled; hence the margin.)")

    return wanted, sentence


def estimate_note(results: list[StepResult], estimates: dict[str, StepEstimate]) -> str:
    errs = [(abs(estimates[r.plan].step_s / r.step_time_s - 1), r.plan) for r in results if r.plan in estimates]
    if not errs:
        return ""
    med = statistics.median(e for e, _ in errs)
    worst = max(errs)
    return (f"Analytic estimate against the simulation on the {len(errs)} simulated plans: median error "
            f"{100 * med:.1f} %, worst {100 * worst[0]:.1f} % ({worst[1]}).")
