"""The search's sentence on context parallelism: why the best plan with cp > 1 beats (or
loses to) the same plan without it, with the figures behind it (SearchResult.notes)."""
from __future__ import annotations

from costmodel.errors import InputError
from costmodel.estimate import estimate_step
from search.costs import CostTables
from sim.program import stage_memory
from sim.result import StepResult
from specs.plan import Plan, parse_plan_string, resolve_plan

GIB = 2.0 ** 30


def _twin(plan: Plan, model, num_devices: int) -> Plan:
    """``plan`` without context parallelism on the same devices: cp=1, dp*cp replicas with
    the default microbatch shares; InputError when that is not a valid plan. Goes through
    the plan's own fields (Plan.to_string / parse_plan_string), not hand-edited text."""
    fields = parse_plan_string(plan.to_string())
    for key in ("cp", "cp_comm", "mb_shares"):
        fields.pop(key, None)
    fields["dp"] = plan.dp * plan.cp
    return resolve_plan(fields, model, num_devices)


def _activations_gib(tables: CostTables, plan: Plan) -> float:
    m = tables.model.global_batch_size // plan.mbs // plan.dp
    return stage_memory(tables.model, plan, tables.runtime, 0, m)["activations"] / GIB


def cp_note(tables: CostTables, results: list[StepResult], considered: tuple[int, ...],
            best_without_cp: tuple[Plan, float] | None = None) -> str:
    """One paragraph; empty when the search tried no cp > 1 (``considered`` = the cp
    degrees enumerated). ``best_without_cp``: the search's best-estimated fitting plan
    with cp=1 and its estimated step, None when no cp=1 plan fits."""
    if max(considered, default=1) == 1:
        return ""
    model, n = tables.model, tables.cluster.num_devices
    plans = [(r, resolve_plan(r.plan, model, n)) for r in results if r.fits_memory]
    with_cp = [(r, p) for r, p in plans if p.cp > 1]
    head = f"Context parallelism (cp tried: {', '.join(map(str, considered))}; seq {model.seq_length:,} tokens): "
    if not with_cp:
        return head + ("no simulated plan that fits uses cp > 1: at this sequence length splitting attention "
                       "over ranks costs more (K/V exchange, smaller GEMMs) than the memory it saves is worth.")
    res, plan = with_cp[0]
    best_is_cp = plans[0][1].cp > 1
    local = model.seq_length // plan.cp
    one = tables.work(plan, plan.rank(0, 0, 0), 1, False, False)
    c0, c1 = tables.cp_step(plan, 0, 0)
    x_ms = 1e3 * (c0 + c1 * one.cp_fwd_bytes)
    a_ms = 1e3 * one.cp_fwd_block_s
    exchange = (f"each ring step sends {one.cp_fwd_bytes / 1e6:.1f} MB of K/V per layer in about {x_ms:.2f} ms "
                f"against {a_ms:.2f} ms of block attention, so the exchange is "
                + ("hidden" if x_ms <= a_ms else f"exposed by {x_ms - a_ms:.2f} ms per step")
                + f" (exposed cp time {res.exposed_comm_s.get('cp', 0.0):.3f} s of the {res.step_time_s:.3f} s step)"
                if plan.cp_comm == "ring" else
                f"its all-to-alls are exposed for {res.exposed_comm_s.get('cp', 0.0):.3f} s of the "
                f"{res.step_time_s:.3f} s step")
    attn = (f"per microbatch a GPU attends {local:,} queries to all {model.seq_length:,} keys, 1/{plan.cp} of the "
            f"sequence's quadratic attention ({plan.cp} blocks of {a_ms:.2f} ms per layer instead of one pass over "
            f"the whole sequence)")
    text = (head + f"{'the best plan' if best_is_cp else 'the best plan with cp > 1'} {res.plan} "
            f"({res.tokens_per_s:,.0f} tokens/s) gives each rank {local:,} tokens of every sequence; {attn}; "
            f"{exchange}.")
    if best_without_cp is None:
        alt = " No plan without cp fits or is valid at all on these devices."
    else:
        p1, est1 = best_without_cp
        alt = (f" The best plan without cp, {p1.to_string()}, is estimated at {est1:.3f} s a step against "
               f"{res.step_time_s:.3f} s simulated here ({_act_sentence(tables, plan, p1)}).")
    try:
        twin = _twin(plan, model, n)
    except InputError as e:
        return (text + f" Its cp=1 twin (same tp/pp, {plan.dp * plan.cp} replicas) is not a valid plan "
                f"({e.message}): with {model.global_batch_size} sequences a step, cp is what lets more GPUs "
                f"share each sequence without deeper pipelines or wider TP." + alt)
    act, act_twin = _activations_gib(tables, plan), _activations_gib(tables, twin)
    short = tables.memory_shortfall_gib(twin)
    m, m_twin = res_mb(model, plan), res_mb(model, twin)
    why = (f" Its cp=1 twin {twin.to_string()} keeps {act_twin:.1f} GiB of activations on stage 0 against "
           f"{act:.1f} GiB (activations scale with the tokens a GPU holds, cut by cp), and runs {m_twin} "
           f"microbatch(es) per replica against {m}")
    if short > 0:
        return (text + why + f"; it does not fit (short by {short:.1f} GiB per GPU). Why cp wins: activation memory."
                + alt)
    est, est_twin = estimate_step(tables.pipelines(plan)), estimate_step(tables.pipelines(twin))
    verdict = "wins" if est.step_s < est_twin.step_s else "loses"
    return (text + why + f"; it fits, estimated at {est_twin.step_s:.3f} s a step (bubble {est_twin.bubble_s:.3f} s) "
            f"against {est.step_s:.3f} s (bubble {est.bubble_s:.3f} s) with cp, so cp {verdict} on speed: "
            + ("fewer, larger replicas keep more microbatches in each pipeline." if est.bubble_s < est_twin.bubble_s
               else "the cp exchange and smaller per-rank GEMMs cost more than they save."))


def res_mb(model, plan: Plan) -> int:
    """Microbatches per replica of a uniform plan."""
    return model.global_batch_size // plan.mbs // plan.dp


def _act_sentence(tables: CostTables, plan: Plan, other: Plan) -> str:
    return (f"stage-0 activations {_activations_gib(tables, other):.1f} GiB without cp against "
            f"{_activations_gib(tables, plan):.1f} GiB with it; {res_mb(tables.model, other)} against "
            f"{res_mb(tables.model, plan)} microbatches per replica")
