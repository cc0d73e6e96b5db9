"""The `cp` plan field: world size, rank order, round trip and the shape rules (contract C1)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel.errors import InputError
from specs.model import load_model
from specs.plan import plan_world_size, resolve_plan


def test_world_size_counts_cp():
    """plan_world_size multiplies all four degrees: 2*2*2*3 = 24 processes."""
    assert plan_world_size("tp=2,cp=2,pp=2,dp=3") == 24
    assert plan_world_size("tp=2,pp=2") == 4


def test_rank_order_tp_then_cp_then_pp_then_dp():
    """tp is fastest, then cp, then pp, then dp (Megatron-Core's tp-cp-...): with tp=2, cp=2,
    pp=2, dp=2, rank(dp=1, stage=1, tp=1, cp=1) = 1 + 2*(1 + 2*(1 + 2*1)) = 15, the CP
    group of (dp 0, stage 0, tp 1) is ranks 1 and 3, and dp is derived as 16/(2*2*2) = 2."""
    model = replace(load_model("tiny"), seq_length=64)
    plan = resolve_plan("tp=2,cp=2,pp=2", model, 16)
    assert plan.dp == 2 and plan.num_devices == 16
    assert plan.rank(1, 1, 1, 1) == 15
    assert plan.cp_group(0, 0, 1) == [1, 3]
    assert plan.tp_group(0, 1, cp_index=1) == [6, 7]
    assert plan.dp_group(0, 0, cp_index=1) == [2, 10]
    assert sorted(plan.rank(d, s, t, c) for d in range(2) for s in range(2)
                  for t in range(2) for c in range(2)) == list(range(16))


@pytest.mark.parametrize("text", ["tp=2,cp=4,pp=1,dp=2", "tp=1,cp=2,cp_comm=a2a,pp=2,dp=2"])
def test_round_trip(text):
    """A plan with cp prints cp= (and cp_comm= when not ring) and resolves to the same Plan."""
    model = load_model("tiny")
    plan = resolve_plan(text, model, 16 if "cp=4" in text else 8)
    assert f"cp={plan.cp}" in plan.to_string()
    assert resolve_plan(plan.to_string(), model, plan.num_devices) == plan


def test_cp_one_prints_nothing():
    """cp=1 (and a cp_comm that cp=1 makes meaningless) leaves the string as before."""
    plan = resolve_plan("tp=2,cp_comm=a2a", load_model("tiny"), 4)
    assert "cp" not in plan.to_string() and plan.cp_comm == "ring"


@pytest.mark.parametrize("text, devices, field", [
    ("cp=64", 64, "cp"),          # tiny has seq 64: 2*cp = 128 chunks do not split it
    ("cp=3", 3, "cp"),            # 64 % 6 != 0
    ("tp=4,cp=32", 128, "sp"),    # seq/cp = 2 tokens do not split over tp=4
    ("tp=2,cp=4,cp_comm=a2a", 8, "cp_comm"),  # tp*cp = 8 does not divide 4 heads
    ("tp=2,cp=2,dp=3", 8, "dp"),
])
def test_bad_cp_is_one_line_input_error(text, devices, field):
    """Each broken cp rule is an InputError that names the field."""
    text = text + (",sp=true" if field == "sp" else "")
    with pytest.raises(InputError) as e:
        resolve_plan(text, load_model("tiny"), devices)
    assert f"{field}" in str(e.value) and "\n" not in str(e.value)


def test_a2a_needs_cp_to_divide_kv_heads_per_rank():
    """Ulysses scatters K/V heads as well as Q heads (Transformer Engine asserts both per-rank
    head counts divisible by cp): a GQA model with 2 K/V groups and 8 heads takes cp=2 at
    tp=1 (2 K/V heads per rank) but not cp=4 (8 Q heads split, 2 K/V heads do not), and at
    tp=2 one K/V head per rank refuses cp=2; ring attention takes all of them."""
    from dataclasses import replace
    gqa = replace(load_model("tiny"), num_query_groups=2)
    assert resolve_plan("cp=2,cp_comm=a2a", gqa, 2).cp == 2
    for text, devices in (("cp=4,cp_comm=a2a", 4), ("tp=2,cp=2,cp_comm=a2a", 4)):
        with pytest.raises(InputError) as e:
            resolve_plan(text, gqa, devices)
        assert "K/V head" in str(e.value) and "\n" not in str(e.value)
        assert resolve_plan(text.replace("a2a", "ring"), gqa, devices).cp_comm == "ring"
