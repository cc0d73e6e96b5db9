"""Heterogeneous splits (search/hetero.py): water-filling against brute force, the balanced
plans against the simulator, and the search's heterogeneous win on hetero-a100-v100."""
from __future__ import annotations

import itertools

import pytest

from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from search.hetero import group_speeds, nonuniform_variant, water_fill
from sim.metrics import simulate
from specs.plan import resolve_plan
from search.search import SearchSpace, search
from search.costs import CostTables
from specs.topology import load_topology

PROFILE = load_profile(None)
SMALL = ModelSpec("small", 16, 2048, 16, 2048, 51200, 128)


@pytest.fixture(scope="module")
def hetero():
    cluster = load_topology("hetero-a100-v100")
    return cluster, CostTables(SMALL, cluster, PROFILE)


@pytest.mark.parametrize("total,cost,fixed,lo,hi,step", [
    (16, [1.0, 2.5], [0.3, 0.0], [1, 1], [16, 16], 1),
    (24, [1.0, 1.0, 2.0, 2.0], [0.5, 0.0, 0.0, 0.7], [1, 1, 1, 1], [24, 24, 24, 24], 1),
    (12, [1.0, 3.0, 2.0], [0.0, 0.0, 0.0], [2, 2, 2], [12, 3, 12], 1),
    (32, [1.0, 2.2], [0.0, 1.0], [4, 4], [32, 32], 4),
])
def test_water_fill_is_minmax_optimal(total, cost, fixed, lo, hi, step):
    """Water-filling reaches the smallest possible max(fixed_i + n_i * cost_i) over every
    split that respects the bounds (brute force over all of them)."""
    got = water_fill(total, cost, fixed, lo, hi, step)
    assert got is not None and sum(got) == total
    assert all(a <= n <= b and n % step == 0 for n, a, b in zip(got, lo, hi))
    value = lambda ns: max(f + n * c for f, n, c in zip(fixed, ns, cost))
    ranges = [range(a, b + 1, step) for a, b in zip(lo, hi)]
    best = min(value(ns) for ns in itertools.product(*ranges) if sum(ns) == total)
    assert value(got) == pytest.approx(best, rel=1e-12)


def test_water_fill_infeasible():
    """No split when the bounds cannot add up to the total."""
    assert water_fill(10, [1.0, 1.0], [0.0, 0.0], [1, 1], [4, 4]) is None
    assert water_fill(10, [1.0, 1.0], [0.0, 0.0], [6, 6]) is None


def test_faster_group_gets_more_work(hetero):
    """A100 runs a layer faster than V100 (catalogued peaks x profile efficiency), so
    A100 stages get more layers and A100 replicas more microbatches."""
    cluster, tables = hetero
    stages = resolve_plan("tp=8,pp=2,dp=4,mbs=1,placement=tp-dp-pp", SMALL, 64)
    speeds = group_speeds(tables, stages)
    assert speeds["a100"][1] < speeds["v100"][1]
    var, _ = nonuniform_variant(tables, stages)
    assert var.explicit_layers and var.layers[0] > var.layers[1] and sum(var.layers) == SMALL.num_layers
    replicas = resolve_plan("tp=8,pp=4,dp=2,mbs=1", SMALL, 64)  # replica 0 on A100, 1 on V100
    var2, _ = nonuniform_variant(tables, replicas)
    a, v = var2.mb_shares
    assert var2.explicit_shares and a > v and a + v == 128
    # Close to proportional: per-microbatch pipeline time ratio, within two microbatches.
    ratio = speeds["v100"][1] / speeds["a100"][1]
    assert abs(a - 128 * ratio / (1 + ratio)) <= 2 + 0.1 * a


def test_one_replica_over_both_groups_gets_layers_not_shares(hetero):
    """A single replica spanning both groups is rebalanced by layers only (there is no
    other replica to share microbatches with)."""
    cluster, tables = hetero
    plan = resolve_plan("tp=8,pp=8,dp=1,mbs=1", SMALL, 64)
    var, _ = nonuniform_variant(tables, plan)
    assert var is not None and var.explicit_layers and not var.explicit_shares
    assert sum(var.layers[:4]) > sum(var.layers[4:])  # stages 0-3 on A100, 4-7 on V100


def test_homogeneous_cluster_has_nothing_to_balance():
    """On one GPU type every stage and replica runs at the same speed: no variant."""
    cluster = load_topology("dgx-a100", nodes=2)
    tables = CostTables(SMALL, cluster, PROFILE)
    assert not tables.heterogeneous
    var, why = nonuniform_variant(tables, resolve_plan("tp=2,pp=2,dp=4,mbs=1", SMALL, 16))
    assert var is None and "balanced" in why


@pytest.mark.parametrize("text", ["tp=8,pp=2,dp=4,mbs=1,placement=tp-dp-pp", "tp=8,pp=4,dp=2,mbs=1",
                                  "tp=4,pp=2,dp=8,mbs=2,placement=tp-dp-pp,recompute=selective"])
def test_balanced_plan_beats_uniform_in_simulation(hetero, text):
    """The balanced plan simulates faster than its uniform twin, and its plan string
    round-trips through the --plan parser."""
    cluster, tables = hetero
    plan = resolve_plan(text, SMALL, 64)
    var, _ = nonuniform_variant(tables, plan)
    assert resolve_plan(var.to_string(), SMALL, 64) == var
    uni = simulate(SMALL, plan, cluster, PROFILE)
    bal = simulate(SMALL, var, cluster, PROFILE)
    assert bal.fits_memory
    assert bal.tokens_per_s > 1.05 * uni.tokens_per_s


def test_search_heterogeneous_win(hetero):
    """The search on hetero-a100-v100 ranks a non-uniform plan first, it beats the best
    simulated uniform plan, and the note says by how much and which group got what."""
    cluster, _ = hetero
    space = SearchSpace(mbs=(1, 2), schedules=("1f1b",), recompute=("none", "selective"), zero=(0,),
                        compress=("none",), allreduce=("ring",), tp=(2, 8))
    res = search(SMALL, cluster, PROFILE, top=10, progress=False, space=space)
    nonuni = [r for r in res.ranked if "layers=" in r.plan or "mb_shares=" in r.plan]
    uni = [r for r in res.ranked if r not in nonuni]
    assert nonuni and uni
    assert res.ranked[0] in nonuni
    assert max(r.tokens_per_s for r in nonuni) > max(r.tokens_per_s for r in uni)
    note = next(n for n in res.notes if n.startswith("Heterogeneous"))
    assert "beats the best uniform plan" in note and "a100" in note and "v100" in note
