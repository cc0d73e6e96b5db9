"""The analytic step estimate (costmodel/estimate.py) and its inputs (search/costs.py)
against independent computations: the list scheduler of sim/schedules.py, a brute-force
queue, the schedules' own activation walk, and the full SimPy simulation."""
from __future__ import annotations

import itertools

import pytest

from costmodel.estimate import (ChunkGrads, PipelineCost, StageCost, estimate_step, flush_time_s,
                                p2p_transfers_on_path, reduction_end_s)
from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from sim.metrics import simulate
from specs.plan import resolve_plan
from sim.schedules import list_schedule_makespan, make_schedule
from search.costs import CostTables
from specs.topology import load_topology

PROFILE = load_profile(None)
SMALL = ModelSpec("small", 16, 2048, 16, 2048, 51200, 128)


@pytest.mark.parametrize("schedule,p,m,v", [
    ("gpipe", 2, 4, 1), ("gpipe", 4, 8, 1), ("1f1b", 2, 6, 1), ("1f1b", 4, 4, 1), ("1f1b", 4, 16, 1),
    ("1f1b", 8, 32, 1), ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 3), ("interleaved", 8, 16, 2)])
def test_p2p_transfers_match_list_scheduler(schedule, p, m, v):
    """Transfers on the critical path: the list scheduler's makespan grows by exactly
    k * c when every cross-rank dependency costs c, with k from p2p_transfers_on_path."""
    sched = make_schedule(schedule, p, m, v)
    f, b, c = 1.0 / v, 2.0 / v, 0.01
    t0, _ = list_schedule_makespan(sched, p, v, f, b, 0.0)
    t1, _ = list_schedule_makespan(sched, p, v, f, b, c)
    assert (t1 - t0) / c == pytest.approx(p2p_transfers_on_path(schedule, p, m, v), abs=1e-6)


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 16, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3)])
def test_flush_time_equal_stages_is_exact(schedule, p, m, v):
    """Equal stages: m*t + (p-1)*t/v, the Narayanan et al. 2021 bubble, equals the list
    scheduler's makespan."""
    sched = make_schedule(schedule, p, m, v)
    ref, _ = list_schedule_makespan(sched, p, v, 0.3 / v, 0.7 / v)
    assert flush_time_s([1.0] * p, m, v) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_flush_time_unequal_stages_close(seed):
    """Unequal stages (a heterogeneous pipeline): (m-1)*max + sum (GPipe exact, 1F1B
    within 5 %) against the list scheduler."""
    import random
    rnd = random.Random(seed)
    p = rnd.choice([2, 4, 8])
    m = p * rnd.choice([1, 2, 4])
    ts = [rnd.uniform(1, 3) for _ in range(p)]
    f = [t / 3 for t in ts]
    for schedule, tol in (("gpipe", 1e-9), ("1f1b", 0.05)):
        ref, _ = list_schedule_makespan(make_schedule(schedule, p, m), p, 1,
                                        lambda r, a: f[r], lambda r, a: ts[r] - f[r])
        assert flush_time_s(ts, m) == pytest.approx(ref, rel=tol)


@pytest.mark.parametrize("k,interval,d,free", [(4, 1.0, 0.5, 0.0), (4, 1.0, 2.0, 0.0), (6, 0.3, 0.3, 0.0),
                                               (3, 1.0, 0.5, 5.0), (1, 0.0, 1.0, 0.0)])
def test_reduction_end_matches_queue(k, interval, d, free):
    """The closed form of a single-server queue with evenly spaced arrivals equals a
    bucket-by-bucket walk."""
    t = free
    for j in range(k):
        t = max(t, 1.0 + j * interval) + d
    assert reduction_end_s(1.0, interval, k, d, free) == pytest.approx(t, rel=1e-12)


def test_estimate_step_hand_numbers():
    """Two equal stages, 4 microbatches, f=1, b=2, p2p 0.1, one DP bucket of 0.5 s per
    stage and a 0.2 s optimizer: 1F1B takes (4+1)*3 + k*0.1 with k = 2*1*4/2 + 0 = 4;
    stage 0 finishes last, its bucket is ready at the end and adds 0.5 s, then 0.2 s."""
    st = StageCost(fwd_s=1.0, bwd_s=2.0, tp_s=0.0, p2p_s=0.1, grads=(ChunkGrads(1, 0.5),), optimizer_s=0.2)
    last = StageCost(fwd_s=1.0, bwd_s=2.0, tp_s=0.0, p2p_s=0.0, grads=(ChunkGrads(1, 0.5),), optimizer_s=0.2)
    est = estimate_step([PipelineCost((st, last), 4, 1, "1f1b")])
    assert est.pipeline_s == pytest.approx(15.0 + 0.4)
    assert est.step_s == pytest.approx(15.4 + 0.5 + 0.2)
    assert est.dp_s == pytest.approx(0.5)


def test_straggler_delays_only_the_last_bucket_by_hand():
    """One stage, 2 microbatches, f=1, b=2: the last backward runs 4..6 and its three DP
    buckets of 0.5 s are ready at 4+2/3, 4+4/3 and 6, served 4.667-5.167, 5.333-5.833 and
    6-6.5: step 6.5, 0.5 s exposed. With 1 s of straggle only the third arrives late, at
    7, and ends at 7.5: step 7.5, 1.5 s exposed."""
    base = StageCost(fwd_s=1.0, bwd_s=2.0, tp_s=0.0, p2p_s=0.0, grads=(ChunkGrads(3, 0.5),))
    lag = StageCost(fwd_s=1.0, bwd_s=2.0, tp_s=0.0, p2p_s=0.0, grads=(ChunkGrads(3, 0.5),), straggler_s=1.0)
    e0 = estimate_step([PipelineCost((base,), 2, 1, "1f1b")])
    e1 = estimate_step([PipelineCost((lag,), 2, 1, "1f1b")])
    assert e0.step_s == pytest.approx(6.5) and e0.dp_s == pytest.approx(0.5)
    assert e1.step_s == pytest.approx(7.5) and e1.dp_s == pytest.approx(1.5)


def _steps_with_straggle(text: str) -> list[tuple[float, float]]:
    """(estimate, simulation) step times of tiny on localhost-cpu's 2 processes under plan
    ``text``, without and with 3 ms of runtime.straggler_us."""
    from dataclasses import replace as _replace
    from specs.model import load_model
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    model = load_model("tiny")
    plan = resolve_plan(text, model, 2)
    got = []
    for lag in (0.0, 3000.0):
        prof = _replace(PROFILE, runtime=_replace(PROFILE.runtime, straggler_us=lag))
        got.append((estimate_step(CostTables(model, cluster, prof).pipelines(plan)).step_s,
                    simulate(model, plan, cluster, prof).step_time_s))
    return got


def test_straggler_estimate_matches_the_simulation():
    """runtime.straggler_us moves the analytic estimate and the discrete-event simulation
    by the same amount (two independent computations): tiny at dp=2 on localhost-cpu with
    3 ms of straggle, step +3 ms in both (the last bucket's reduction closes the step)."""
    got = _steps_with_straggle("dp=2,precision=fp32")
    assert got[1][0] - got[0][0] == pytest.approx(3e-3, rel=1e-6)
    assert got[1][1] - got[0][1] == pytest.approx(3e-3, rel=1e-6)


def test_zero3_has_no_closing_straggler_in_either_computation():
    """ZeRO-3 reduce-scatters each layer's gradients as its backward ends, so no bucket
    reduction closes the backward to wait for the last replica: with 3 ms of
    runtime.straggler_us the estimate and the simulation of tiny at dp=2, zero=3 keep
    their step times (one rule, costmodel/estimate.closing_straggler_s, for both), while
    dp=1 never waits: the helper gives 0 there and 3 ms at dp=2, zero=1."""
    from costmodel.estimate import closing_straggler_s
    assert closing_straggler_s(3000.0, 2, 1) == pytest.approx(3e-3)
    assert closing_straggler_s(3000.0, 1, 0) == 0.0 and closing_straggler_s(3000.0, 2, 3) == 0.0
    got = _steps_with_straggle("dp=2,zero=3,precision=fp32")
    assert got[1] == pytest.approx(got[0], rel=1e-12)


PLANS = [
    ("dgx-a100", 2, "tp=2,pp=2,dp=4,mbs=2"),
    ("dgx-a100", 2, "tp=1,pp=4,dp=4,mbs=1,schedule=gpipe,recompute=full"),
    ("dgx-a100", 2, "tp=2,pp=4,dp=2,mbs=1,vpp=2,sp=true,recompute=selective"),
    ("dgx-a100", 2, "tp=1,pp=1,dp=16,mbs=2,allreduce=tree"),
    ("dgx-a100", 2, "tp=4,pp=2,dp=2,mbs=2,zero=1"),
    ("pcie-l40s", 1, "tp=1,pp=2,dp=4,mbs=2,compress=topk:0.01"),
    ("pcie-l40s", 2, "tp=2,pp=1,dp=8,mbs=2,recompute=selective"),
    ("pcie-l40s", 1, "tp=1,pp=1,dp=8,mbs=16"),  # does not fit: 48 GB L40S
]


@pytest.mark.parametrize("topo,nodes,text", PLANS)
def test_estimate_within_15_percent_of_simulation(topo, nodes, text):
    """The estimate the search ranks by stays within 15 % of the discrete-event
    simulation, and its memory model agrees with the simulator's per-device peak (also
    for a plan that does not fit)."""
    cluster = load_topology(topo, nodes=nodes)
    plan = resolve_plan(text, SMALL, cluster.num_devices)
    tables = CostTables(SMALL, cluster, PROFILE)
    est = estimate_step(tables.pipelines(plan))
    res = simulate(SMALL, plan, cluster, PROFILE)
    assert est.step_s == pytest.approx(res.step_time_s, rel=0.15)
    shortfall = max(d.peak_memory_gib - d.capacity_gib for d in res.devices)
    assert tables.memory_shortfall_gib(plan) == pytest.approx(shortfall, abs=1e-6)


def test_estimate_orders_allreduce_like_simulation():
    """Ranking is what the estimate is for: on pure data parallelism over two nodes the
    estimate orders ring, tree and hierarchical the way the simulation does."""
    cluster = load_topology("dgx-a100", nodes=2)
    tables = CostTables(SMALL, cluster, PROFILE)
    est, sim = {}, {}
    for algo in ("ring", "tree", "hierarchical"):
        plan = resolve_plan(f"tp=1,pp=1,dp=16,mbs=1,allreduce={algo}", SMALL, 16)
        est[algo] = estimate_step(tables.pipelines(plan)).step_s
        sim[algo] = simulate(SMALL, plan, cluster, PROFILE).step_time_s
    assert sorted(est, key=est.get) == sorted(sim, key=sim.get)
    for a, b in itertools.combinations(est, 2):
        assert (est[a] < est[b]) == (sim[a] < sim[b])
