"""Context parallelism in memory, the fast costs and the search: activations follow the
tokens a rank holds, the estimate prices the ring's exchange as the engine runs it, and a
long-sequence search picks cp > 1 and says why."""
from __future__ import annotations

import pytest

from costmodel.device_memory import ChunkSpec, MemoryConfig, device_memory
from costmodel.estimate import estimate_step
from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from search.costs import CostTables
from search.search import SearchSpace, cp_options, search
from sim.metrics import simulate
from specs.model import load_model, with_overrides
from specs.plan import resolve_plan
from specs.topology import load_topology


def test_activations_divide_by_cp():
    """A GPT-shaped layer (MHA, gelu, ffn 4h) with tp=2, SP and cp=4 keeps the activations
    of seq/cp = 2048 tokens: Korthikanti Table 2's s*b*h*34/t with the s x s score terms
    replaced by fused attention's fp32 log-sum-exp, 4*a*s*b/t (context-parallel attention
    runs fused), i.e. 2048*1024*34/2 + 4*16*2048/2 bytes."""
    model = ModelSpec("m", 4, 1024, 16, 8192, 32000, 8)
    cfg = MemoryConfig(tp=2, sp=True, mbs=1, recompute="none", precision="bf16", dp=1, zero=0,
                       grad_bytes=4, topk=False, flash_attention=False, cp=4)
    got = device_memory(model, cfg, (ChunkSpec(1, False, False),), ((1,),))["activations"]
    assert got == 2048 * 1024 * 34 / 2 + 4 * 16 * 2048 / 2


def test_cp_options():
    """Powers of two leaving >= 4096 tokens per rank and dividing the devices: seq 131072
    on 64 devices per TP group gives 1..32; seq 8192 only 1, 2; seq 2048 only 1."""
    space = SearchSpace()
    big = with_overrides(load_model("llama3-8b"), 131072)
    assert cp_options(big, 64, space, False) == [1, 2, 4, 8, 16, 32]
    assert cp_options(load_model("llama3-8b"), 64, space, False) == [1, 2]
    assert cp_options(load_model("gpt3-1.3b"), 64, space, False) == [1]
    assert cp_options(big, 64, space, True) == [1]  # heterogeneous: only when asked


@pytest.fixture(scope="module")
def long_context():
    cluster = load_topology("dgx-h100", nodes=2)
    model = with_overrides(load_model("llama3-8b"), 32768, 16)
    return model, cluster, load_profile(None, cluster.profiles)


@pytest.mark.parametrize("plan_text", ["tp=4,cp=4,mbs=1,sp=true", "tp=2,cp=8,mbs=1,sp=true,zero=1"])
def test_estimate_prices_cp_like_the_engine(long_context, plan_text):
    """The search's analytic estimate of a cp plan (costs.py's ring closed form on static
    link shares) is within 3 % of the discrete-event simulation's step."""
    model, cluster, profile = long_context
    plan = resolve_plan(plan_text, model, cluster.num_devices)
    est = estimate_step(CostTables(model, cluster, profile).pipelines(plan)).step_s
    assert est == pytest.approx(simulate(model, plan, cluster, profile).step_time_s, rel=0.03)


def test_long_sequence_search_picks_cp(long_context):
    """Llama 3 8B at 32k tokens, 16 sequences, on 16 H100s: with unfused attention
    (the default profile) a cp=1 plan keeps s x s scores and no plan fits without cp, so
    the search's best plan has cp > 1 and its finding names the memory of the cp=1 twin."""
    model, cluster, profile = long_context
    space = SearchSpace(mbs=(1,), schedules=("1f1b",), recompute=("none",), zero=(0, 1),
                        compress=("none",), allreduce=("ring",), tp=(4, 8))
    res = search(model, cluster, profile, space=space, record_best=False)
    best = resolve_plan(res.ranked[0].plan, model, cluster.num_devices)
    assert best.cp > 1
    note = next(n for n in res.notes if n.startswith("Context parallelism"))
    assert "does not fit" in note and "activation memory" in note


def test_cp_twin_from_the_plans_fields():
    """The cp=1 twin the cp note compares with: cp=2 x dp=2 on 4 devices becomes dp=4 with
    the default shares (an explicit 3:5 split of the cp plan's replicas does not carry
    over), the Ulysses cp_comm is dropped, every other field kept."""
    from search.cp_findings import _twin
    from specs.model import load_model
    tiny = load_model("tiny")
    for text in ("cp=2,cp_comm=a2a,mbs=2", "cp=2,dp=2,mbs=2,mb_shares=3:5", "cp=2,mbs=2,recompute=full"):
        twin = _twin(resolve_plan(text, tiny, 4), tiny, 4)
        assert (twin.cp, twin.dp, twin.mbs, twin.mb_shares) == (1, 4, 2, (2, 2, 2, 2)), text
    assert _twin(resolve_plan("cp=2,mbs=2,recompute=full", tiny, 4), tiny, 4).recompute == "full"
