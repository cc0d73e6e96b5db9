"""The search's out-of-memory check and the simulator's program report the same memory
(and resolve allreduce=auto by the same rule).

Both now go through costmodel/device_memory.py; these tests compare what the two paths
report (the search's ``CostTables.memory_shortfall_gib`` against ``build_program``'s
per-device memory, as ``simulate`` prints it), so a path that drifts is caught.
"""
from __future__ import annotations

import functools
import types
from dataclasses import replace

import pytest

import sim.program as program
from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from search import search as search_mod
from search.costs import CostTables
from sim.metrics import simulate
from sim.schedules import inflight_peaks, make_schedule, peak_inflight_total
from specs.model import load_model
from specs.plan import resolve_plan
from specs.topology import load_topology

GIB = 2.0 ** 30
HETERO_13B = ("tp=2,pp=4,dp=8,mbs=1,vpp=3,schedule=interleaved,sp=true,allreduce=hierarchical,"
              "placement=tp-dp-pp,layers=14:15:6:5")


def _inputs(topology: str, model: str):
    cluster = load_topology(topology)
    return cluster, load_model(model), load_profile(None, bundled=cluster.profiles)


def _program_shortfall_gib(prog) -> float:
    """Largest (peak - capacity) over the program's simulated devices, GiB, as
    sim/metrics.summarize computes it from the program's memory."""
    return max((sum(mem.values()) - prog.cluster.devices[pipe.ranks[s]].gpu.mem_bytes) / GIB
               for pipe in prog.pipelines for s, mem in enumerate(pipe.memory))


def test_uneven_interleaved_plan_same_verdict_and_gib():
    """gpt3-13b on hetero-a100-v100 with 14 layers on stage 0 split 5:5:4 over three
    interleaved chunks: rank 0's worst moment holds 8, 7 and 0 microbatches of its chunks
    (8*5 + 7*5 = 75 layer-activations, not the 15 * 14/3 = 70 of a mean chunk), so it
    needs 81.05 GiB of 80. The search's check must say the same, to the byte."""
    cluster, model, profile = _inputs("hetero-a100-v100", "gpt3-13b")
    plan = resolve_plan(HETERO_13B, model, cluster.num_devices)
    res = simulate(model, plan, cluster, profile)
    searched = CostTables(model, cluster, profile).memory_shortfall_gib(plan)
    assert not res.fits_memory
    assert res.devices[0].peak_memory_gib == pytest.approx(81.05, abs=0.005)
    assert searched == pytest.approx(res.devices[0].peak_memory_gib - 80.0, abs=1e-9)
    assert searched == pytest.approx(res.memory_shortfall_gib, abs=1e-9)


def _enumerated_plans(cluster, model, profile) -> dict:
    """Every plan whose memory the search checks while enumerating its whole default
    space, with the shortfall it saw. The estimate is replaced by a constant (it plays
    no part in memory) to keep this quick."""
    tables = CostTables(model, cluster, profile)
    seen: dict = {}
    checked = tables.memory_shortfall_gib

    def record(plan):
        got = checked(plan)
        # Memory ignores the all-reduce algorithm and which top-k fraction is used.
        key = replace(plan, allreduce="ring", compress="none" if plan.topk_fraction is None else "topk:0.01")
        seen.setdefault(key, got)
        return got

    tables.memory_shortfall_gib = record
    tables.pipelines = lambda plan, algos=None: []
    estimate = search_mod.estimate_step
    search_mod.estimate_step = lambda pipelines: types.SimpleNamespace(step_s=0.0)
    try:
        search_mod._enumerate(model, cluster, tables, search_mod.SearchSpace(), search_mod._Pruner(),
                              0.05, types.SimpleNamespace(update=lambda n: None))
    finally:
        search_mod.estimate_step = estimate
    return seen


@pytest.mark.parametrize("topology", ["hetero-a100-v100", "pcie-l40s"])
def test_search_memory_equals_program_over_whole_space(topology, monkeypatch):
    """Over gpt3-2.7b's whole search space (heterogeneous: uneven layer splits, several
    replica classes; homogeneous), the memory the search checks equals the memory of the
    program the simulator would run, plan by plan, in GiB to 1e-9 (so no fits / does-not
    -fit verdict can differ). Programs are built without running the engine; schedules are
    memoised (build_program only reads them) to keep this affordable."""
    cluster, model, profile = _inputs(topology, "gpt3-2.7b")
    seen = _enumerated_plans(cluster, model, profile)
    assert len(seen) > 1000  # the whole space, not a corner of it
    monkeypatch.setattr(program, "make_schedule", functools.lru_cache(maxsize=None)(program.make_schedule))
    diffs = {}
    for plan, searched in seen.items():
        built = _program_shortfall_gib(program.build_program(model, plan, cluster, profile))
        if abs(built - searched) > 1e-9:
            diffs[plan.to_string()] = (searched, built)
    assert not diffs, f"{len(diffs)} plans differ, e.g. {sorted(diffs.items())[:3]}"
    assert any(v > 0 for v in seen.values()) and any(v <= 0 for v in seen.values())


@pytest.mark.parametrize("schedule,p,v", [("1f1b", 4, 1), ("1f1b", 3, 1), ("interleaved", 4, 2),
                                          ("interleaved", 2, 3), ("interleaved", 8, 4)])
def test_inflight_moments(schedule, p, v):
    """The per-chunk in-flight moments the memory model takes agree with the schedule:
    their largest total is peak_inflight_total (an independent walk), and they are the
    same for every m >= 3p (what lets sim.program.schedule_inflight walk 3p
    microbatches only)."""
    ref = None
    for m in range(p, 7 * p + 1, p):
        sched = make_schedule(schedule, p, m, v)
        got = [inflight_peaks(sched[r], v) for r in range(p)]
        for r in range(p):
            assert max(sum(c) for c in got[r]) == peak_inflight_total(sched[r])
        if m >= 3 * p:
            ref = ref or got
            assert got == ref
            assert program.schedule_inflight(schedule, p, m, v) == tuple(got)


def test_balancer_sizes_interleaved_memory_on_whole_groups():
    """The layer balancer sizes memory for microbatch shares that are not multiples of
    pp (the search prunes such interleaved plans only after balancing): with 5
    microbatches per replica on pp=4 it plans for 8 in flight instead of asking the
    interleaved schedule (whose in-flight counts the memory model walks) for an
    impossible 5, and still splits the layers by the stages' GPU types."""
    from search.hetero import nonuniform_variant

    cluster, model, profile = _inputs("hetero-a100-v100", "gpt3-2.7b")
    plan = resolve_plan("tp=1,pp=4,dp=16,mbs=1,vpp=2,schedule=interleaved,placement=tp-dp-pp",
                        model, cluster.num_devices)
    var, why = nonuniform_variant(CostTables(model, cluster, profile), replace(plan, mb_shares=(5,) * 16))
    assert var is not None, why
    assert sum(var.layers) == model.num_layers and var.explicit_layers
    assert var.layers[0] > var.layers[3]  # A100 stages first (tp-dp-pp), V100 stages last


def test_balanced_split_fits_in_the_program():
    """The balancer's layer caps come from the same memory model as the program: for
    gpt3-13b, tp=2, pp=4, vpp=3 interleaved on hetero-a100-v100 it must not hand stage 0
    (A100, 80 GiB) the 14 layers that need 81.05 GiB there (02c3a0b's balancer did: its
    linear mean-chunk cap gave 14:15:6:5). Every device of the balanced plan's program fits."""
    from search.hetero import nonuniform_variant

    cluster, model, profile = _inputs("hetero-a100-v100", "gpt3-13b")
    plan = resolve_plan("tp=2,pp=4,dp=8,mbs=1,vpp=3,schedule=interleaved,sp=true,placement=tp-dp-pp,"
                        "layers=10:10:10:10", model, cluster.num_devices)
    var, why = nonuniform_variant(CostTables(model, cluster, profile), plan)
    assert var is not None, why
    assert var.layers[0] <= 13
    assert _program_shortfall_gib(program.build_program(model, var, cluster, profile)) <= 0


def test_allreduce_auto_resolves_alike_in_search_and_program():
    """allreduce=auto has one rule (sim.program.choose_allreduce): hierarchical only where
    every node holds as many of the DP group's ranks. With placement=tp-dp-pp on three
    8-GPU nodes, stage 0's 12 DP ranks sit 8 + 4 on two nodes and stage 1's 4 + 8, so both
    stages resolve to ring in the program; the search must resolve the same (02c3a0b's
    search skipped the even-split check and said hierarchical)."""
    cluster = load_topology("dgx-a100", nodes=3)
    profile = load_profile(None, bundled=cluster.profiles)
    model = ModelSpec("m", 8, 1024, 16, 512, 32000, 24)
    plan = resolve_plan("tp=1,pp=2,dp=12,mbs=1,allreduce=auto,placement=tp-dp-pp", model, 24)
    built = program.build_program(model, plan, cluster, profile).dp_algorithm
    assert tuple(built) == ("ring", "ring")
    assert tuple(CostTables(model, cluster, profile).resolve_auto(plan)) == tuple(built)
