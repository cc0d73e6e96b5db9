"""The plan search (search/search.py) and `plansim search`: pruning reasons checked against
the plan validator and the simulator, the ranking against re-simulation, the compression
decision on a bandwidth-starved and a well-connected cluster, determinism with workers."""
from __future__ import annotations

import json

import pytest

from costmodel.errors import InputError
from costmodel.profile import load_profile
from costmodel.shapes import ModelSpec
from plansim.cli import main
from search import search as S
from sim.metrics import simulate
from specs.plan import resolve_plan
from specs.topology import load_topology

PROFILE = load_profile(None)
SMALL = ModelSpec("small", 16, 2048, 16, 2048, 51200, 128)
# 12 heads: tp=8 does not divide them; 24 layers: pp=16 does not divide them; 2.7 B
# parameters: 43 GB of weights, gradients and Adam states without any sharding.
ODD = ModelSpec("odd", 24, 3072, 12, 2048, 51200, 96)


@pytest.fixture(scope="module")
def dgx():
    cluster = load_topology("dgx-a100", nodes=2)
    return cluster, S.search(SMALL, cluster, PROFILE, top=10, progress=False)


@pytest.fixture(scope="module")
def odd():
    cluster = load_topology("dgx-a100", nodes=2)
    return cluster, S.search(ODD, cluster, PROFILE, top=10, progress=False)


def test_every_candidate_is_pruned_or_estimated(dgx, odd):
    """Accounting: each enumerated plan is counted once, under one reason or as estimated."""
    for _, res in (dgx, odd):
        assert res.candidates == sum(res.pruned.values()) + res.estimated
        assert all(n > 0 for n in res.pruned.values())
    # SMALL's 16 heads allow tp=16, which would span the two 8-GPU nodes.
    assert dgx[1].pruned[S.R_TP_NODES] > 0


def test_pruning_reasons_present(odd):
    """The families a 12-head, 24-layer model cannot run on 16 A100s are pruned under
    their reasons, with counts and an example."""
    _, res = odd
    for reason in (S.R_TP_HEADS, S.R_LAYERS, S.R_BATCH, S.R_IL_PP, S.R_NO_DP,
                   S.R_OOM, S.R_RECOMPUTE, S.R_ALGO_UNUSED):
        assert res.pruned.get(reason, 0) > 0, reason
        assert reason in res.pruned_examples


@pytest.mark.parametrize("reason", [S.R_TP_HEADS, S.R_LAYERS, S.R_BATCH])
def test_structural_examples_are_rejected_by_the_plan_parser(odd, reason):
    """Independent check: the example of each structural reason is refused by
    resolve_plan, the same validation `plansim simulate --plan` applies."""
    cluster, res = odd
    with pytest.raises(InputError):
        resolve_plan(res.pruned_examples[reason], ODD, cluster.num_devices)


def test_out_of_memory_example_does_not_fit_in_simulation(odd):
    """Independent check: the simulator also finds the 'out of memory' example too big."""
    cluster, res = odd
    plan = resolve_plan(res.pruned_examples[S.R_OOM], ODD, cluster.num_devices)
    assert not simulate(ODD, plan, cluster, PROFILE).fits_memory


def test_ranked_plans_reproduce_and_are_ordered(dgx):
    """At least 10 plans are simulated; each plan string reproduces its step time with
    resolve_plan + simulate; the order is by step time (compressed ones with the margin)."""
    cluster, res = dgx
    assert len(res.ranked) >= 10
    keys = [S._rank_key(r, 0.05) for r in res.ranked]
    assert keys == sorted(keys)
    for r in res.ranked[:4]:
        again = simulate(SMALL, resolve_plan(r.plan, SMALL, cluster.num_devices), cluster, PROFILE)
        assert again.step_time_s == pytest.approx(r.step_time_s, rel=1e-12)
        assert r.fits_memory


def test_best_beats_hand_plans(dgx):
    """The search's best plan is at least as fast as plans a person would try first."""
    cluster, res = dgx
    for hand in ("tp=2,pp=2,dp=4,mbs=1", "tp=8,pp=1,dp=2,mbs=1,recompute=selective", "tp=1,pp=1,dp=16,mbs=1"):
        h = simulate(SMALL, resolve_plan(hand, SMALL, 16), cluster, PROFILE)
        assert res.ranked[0].tokens_per_s >= h.tokens_per_s, hand


def test_best_two_have_timelines(dgx):
    """The best plan and the runner-up carry recorded segments (the report's Gantt charts)."""
    _, res = dgx
    assert res.ranked[0].segments and res.ranked[1].segments
    assert not any(r.segments for r in res.ranked[2:])


def test_compression_pays_on_pcie_not_on_dgx(dgx):
    """Top-k with error feedback: on PCIe L40S servers with 2 x 100 GbE per 8 GPUs the
    dense gradient exchange is exposed and the best plan compresses; on DGX A100 the
    dense exchange hides behind backward and the best plan stays dense (with FSDP's
    per-layer prefetch that best plan may be ZeRO-3, whose per-microbatch reduce-scatters
    top-k does not replace: then the note says compression does not apply)."""
    _, res_dgx = dgx
    res_pcie = S.search(SMALL, load_topology("pcie-l40s"), PROFILE, progress=False)
    assert "compress=topk" in res_pcie.ranked[0].plan
    note = next(n for n in res_pcie.notes if n.startswith("Compression"))
    assert "top-k pays" in note
    assert "compress=" not in res_dgx.ranked[0].plan
    note = next(n for n in res_dgx.notes if n.startswith("Compression"))
    # The compression note is about the best synchronous plan (the search adds
    # cross-step-overlap variants of a ZeRO<3 plan beside it, sim/multistep.py).
    best_sync = next(r.plan for r in res_dgx.ranked if "overlap_step" not in r.plan)
    zero3 = "zero=3" in best_sync
    assert ("not applicable" in note) if zero3 else ("does not pay" in note)


def test_workers_give_the_same_ranking():
    """A process pool returns the same results in the same order as one process."""
    cluster = load_topology("dgx-a100", nodes=1)
    space = S.SearchSpace(mbs=(1, 2), schedules=("1f1b",), recompute=("none", "full"), zero=(0, 1),
                          compress=("none",), allreduce=("ring", "tree"))
    one = S.search(SMALL, cluster, PROFILE, progress=False, space=space)
    two = S.search(SMALL, cluster, PROFILE, progress=False, space=space, workers=2)
    assert [r.plan for r in one.ranked] == [r.plan for r in two.ranked]
    assert [r.step_time_s for r in one.ranked] == [r.step_time_s for r in two.ranked]
    assert one.pruned == two.pruned


def test_cli_json_contract(capsys):
    """`plansim search --json`: ranked results with plan strings and simulate's metrics,
    and pruned counts per reason."""
    assert main(["search", "dgx-a100", "--nodes", "1", "--model", "gpt3-125m", "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["ranked"]) == 3
    for r in out["ranked"]:
        assert {"plan", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "breakdown"} <= set(r)
    assert out["pruned"] and all(isinstance(v, int) for v in out["pruned"].values())


def test_cli_table_and_bad_input(capsys):
    """The text output is a ranked table with the columns the issue names; --top 0 is
    one line on stderr and exit status 2."""
    assert main(["search", "dgx-a100", "--nodes", "1", "--model", "gpt3-125m", "--top", "2"]) == 0
    text = capsys.readouterr().out
    for col in ("step s", "tokens/s", "MFU %", "mem GiB", "bottleneck", "plan"):
        assert col in text
    assert main(["search", "--top", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--top" in err[0]


def test_overlap_note_hand_worked():
    """The sentence on cross-step overlap for dp=2 on tiny: base 1.000 s, layerwise 0.9 s
    (1 - 0.9/1 = +10.0 %), delayed 0.97 s (+3.0 %, not above the 5 % stale-weights
    margin). The variants are the plan strings Plan.to_string writes, and the base is
    found from their fields, so a plan with layers=/mb_shares= after overlap_step works."""
    from types import SimpleNamespace as NS

    from search.overlap import overlap_note, overlap_variants
    from specs.model import load_model
    tiny = load_model("tiny")
    base = resolve_plan("dp=2,mbs=1", tiny, 2).to_string()
    variants = overlap_variants([NS(plan=base, fits_memory=True)], tiny, 2)
    assert variants == [base + ",overlap_step=layerwise", base + ",overlap_step=delayed"]
    by_plan = {base: NS(step_time_s=1.0), variants[0]: NS(step_time_s=0.9), variants[1]: NS(step_time_s=0.97)}
    assert overlap_note(by_plan, variants, 0.05, tiny, 2) == (
        "Cross-step overlap on the best synchronous plan (1.000 s/step): layerwise +10.0%, delayed +3.0% "
        "(stale weights: needs > 5% to rank above it; it does not).")
    shares = resolve_plan("dp=2,mbs=1,mb_shares=6:10", tiny, 2).to_string()
    assert shares.endswith("mb_shares=6:10")
    v = overlap_variants([NS(plan=shares, fits_memory=True)], tiny, 2, ("layerwise",))
    assert overlap_note({shares: NS(step_time_s=2.0), v[0]: NS(step_time_s=1.5)}, v, 0.05, tiny, 2) == \
        "Cross-step overlap on the best synchronous plan (2.000 s/step): layerwise +25.0%."
