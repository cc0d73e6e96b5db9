"""Context parallelism for real (validate/cp.py): ring attention over gloo processes.

The ring module is checked against torch's own causal attention on the whole sequence
in one process (F.scaled_dot_product_attention): outputs and the gradients of q, k and
v on each rank's load-balanced chunks must equal the matching rows of the whole-sequence
result. fp32; the only difference is summation order (blockwise softmax combined with
log-sum-exp), so the tolerance is ATTN_TOL = 1e-5 x the largest reference entry.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from validate.cp import cp_positions, cp_split  # noqa: E402
from validate.launch import launch  # noqa: E402

ATTN_TOL = 1e-5
# [batch, query heads, sequence, head dim]; 2 K/V groups (grouped-query attention).
B, H, G, S, D = 2, 4, 2, 32, 16


def test_load_balanced_split_by_hand():
    """seq 8 in 2*cp = 4 chunks of 2: rank 0 holds chunks 0 and 3 (positions 0,1,6,7),
    rank 1 chunks 1 and 2 (2,3,4,5) (Megatron-Core's split); every position is held by
    exactly one rank, and cp_split picks those positions' rows."""
    assert cp_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = sorted(p for r in range(4) for p in cp_positions(16, 4, r).tolist())
    assert held == list(range(16))
    x = torch.arange(16).view(1, 16)
    assert cp_split(x, 4, 1, dim=1).tolist() == [cp_positions(16, 4, 1).tolist()]


def test_cp_ranks_invert_plan_rank():
    """coords_cp inverts Plan.rank with cp (tp fastest, then cp, then pp, then dp;
    contract C1): for tp=2,cp=2,dp=2 rank 5 = tp 1 + 2 x (cp 0 + 2 x dp 1), and every
    rank of 8 maps back to itself; a cp group is tp apart (ranks 1 and 3)."""
    from specs.model import load_model
    from specs.plan import resolve_plan
    from validate.runner import coords_cp
    tiny = load_model("tiny")
    plan = resolve_plan("tp=2,cp=2,dp=2", tiny, 8)
    assert coords_cp(plan, 5) == (1, 0, 1, 0)
    assert [plan.rank(*coords_cp(plan, r)) for r in range(8)] == list(range(8))
    assert plan.cp_group(0, 0, 1) == [1, 3]


def _coords_by_search(plan, rank):
    """The old enumeration: every (dp, stage, tp, cp) until Plan.rank hits ``rank``."""
    for d in range(plan.dp):
        for s in range(plan.pp):
            for c in range(plan.cp):
                for t in range(plan.tp):
                    if plan.rank(d, s, t, c) == rank:
                        return d, s, t, c
    return None


def test_coords_cp_arithmetic_equals_enumeration():
    """coords_cp's digit arithmetic gives the coordinates the brute-force search over every
    coordinate finds, for every rank of every tp x cp x pp x dp layout of up to 16 devices
    under both placements (an independent computation), and refuses ranks outside the world.
    By hand, tp=2,cp=2,pp=2,dp=2 with placement tp-dp-pp: rank 13 = 1 + 2 x (0 + 2 x (1 + 2 x 1))
    is tp 1, cp 0, dp 1, stage 1."""
    from costmodel.shapes import ModelSpec
    from specs.plan import resolve_plan
    from validate.runner import coords_cp
    model = ModelSpec("m", 8, 64, 4, 64, 128, 16)
    checked = 0
    for tp in (1, 2, 4):
        for cp in (1, 2, 4):
            for pp in (1, 2, 4):
                for dp in (1, 2, 4):
                    n = tp * cp * pp * dp
                    if n > 16:
                        continue
                    for placement in ("tp-pp-dp", "tp-dp-pp"):
                        plan = resolve_plan(f"tp={tp},cp={cp},pp={pp},dp={dp},placement={placement}", model, n)
                        for r in range(n):
                            assert coords_cp(plan, r) == _coords_by_search(plan, r), (plan.to_string(), r)
                            checked += 1
                        for bad in (-1, n):
                            with pytest.raises(ValueError, match="outside"):
                                coords_cp(plan, bad)
    assert checked > 300
    plan = resolve_plan("tp=2,cp=2,pp=2,dp=2,placement=tp-dp-pp", model, 16)
    assert coords_cp(plan, 13) == (1, 1, 1, 0)


def _ring_vs_sdpa(rank, world):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from validate.cp import Ring
    from validate.timeline import Recorder
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, S, D, generator=gen).requires_grad_() for n in (H, G, G))
    up = torch.randn(B, H, S, D, generator=gen)  # upstream gradient
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1),
                                         is_causal=True)
    ref.backward(up)
    rec = Recorder()
    ring = Ring(list(range(world)), rank, rec, dist.new_group(list(range(world))))
    ql, kl, vl = (ring.split(t.detach(), dim=2).requires_grad_() for t in (q, k, v))
    rec.begin_step()
    out = ring.attend(ql, kl, vl, H // G)
    out.backward(ring.split(up, dim=2))
    meas = rec.end_step()

    def err(a, b):
        return float((a - b).abs().max() / b.abs().max())
    return {"out": err(out.detach(), ring.split(ref.detach(), dim=2)),
            "dq": err(ql.grad, ring.split(q.grad, dim=2)), "dk": err(kl.grad, ring.split(k.grad, dim=2)),
            "dv": err(vl.grad, ring.split(v.grad, dim=2)), "bytes": meas["bytes_sent"].get("cp", 0.0),
            "cp_s": meas["phases_s"]["cp"]}


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_matches_whole_sequence_attention(launched, cp):
    """cp ranks each holding 2 of 2*cp chunks reproduce causal attention over the whole
    sequence: output and q/k/v gradients within ATTN_TOL of SDPA's, with grouped-query
    attention (4 heads, 2 K/V groups). Each rank sends, forward and backward, cp-1 blocks
    of its stacked K/V (2 x B x G x S/cp x D fp32 values): 2 (cp-1) x that many bytes,
    with B=2, G=2, S=32, D=16: cp=2: 2 x 1 x (2 x 2 x 2 x 16 x 16 x 4 = 8,192) = 16,384 B;
    cp=4: 2 x 3 x (2 x 2 x 2 x 8 x 16 x 4 = 4,096) = 24,576 B."""
    res = launched[f"ring{cp}"]
    kv_bytes = {2: 8_192, 4: 4_096}[cp]
    assert kv_bytes == 2 * B * G * (S // cp) * D * 4
    for r in res:
        for key in ("out", "dq", "dk", "dv"):
            assert r[key] <= ATTN_TOL, (cp, key, r)
        assert r["bytes"] == {2: 16_384, 4: 24_576}[cp]
        assert r["cp_s"] > 0


def test_merge_equals_softmax_over_union():
    """Two pieces' (output, log-sum-exp) merged give softmax attention over the union of
    their keys (the online-softmax identity), checked against a direct softmax."""
    from validate.cp import _piece, merge
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 5, 8, generator=gen) for _ in range(3))
    o1, l1 = _piece(q, k[:, :2], v[:, :2], False)
    o2, l2 = _piece(q, k[:, 2:], v[:, 2:], False)
    o, lse = merge(o1, l1, o2, l2)
    direct = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1) @ v
    np.testing.assert_allclose(o.numpy(), direct.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(q @ k.transpose(-1, -2) / 8 ** 0.5, -1).numpy(),
                               rtol=1e-6)


# -- the runner: cp plans against the single-process reference ---------------------------
# Tolerances and the comparison are the correctness suite's (tests/test_validate_correctness.py:
# losses rtol 1e-5, first-step gradients 1e-4 x the reference's largest entry, weights
# after 3 Adam steps normwise 1e-3 of the update). mbs=4 keeps the microbatches few.
from test_validate_correctness import GQA, MODEL, _cfg, _check, one_thread  # noqa: E402,F401
from specs.plan import resolve_plan  # noqa: E402
from validate.runner import check_supported  # noqa: E402

PLANS_CP_2 = ["cp=2,mbs=4"]
PLANS_CP_4 = ["cp=2,dp=2,mbs=4", "tp=2,cp=2,sp=true,mbs=4"]


def _ring_then_runs(rank, world, runs):
    """One launch for the ring check and the runner's plans (process start-up costs
    seconds here)."""
    from validate.runner import _worker_many
    return {"ring": _ring_vs_sdpa(rank, world), "runs": _worker_many(rank, world, runs)}


@pytest.fixture(scope="module")
def launched(one_thread):
    out = {}
    for world, plans in ((2, PLANS_CP_2), (4, PLANS_CP_4)):
        runs = [(MODEL, resolve_plan(p, MODEL, world), _cfg()) for p in plans]
        keys = list(plans)
        if world == 2:  # the Llama-style model: RoPE at the ring's own positions, GQA
            runs.append((GQA, resolve_plan(PLANS_CP_2[0], GQA, 2), _cfg()))
            keys.append("gqa-cp")
        for model, plan, cfg in runs:
            check_supported(model, plan)
        per_rank = launch(_ring_then_runs, world, (runs,), timeout_s=240)
        out[f"ring{world}"] = [r["ring"] for r in per_rank]
        out.update({k: [r["runs"][i] for r in per_rank] for i, k in enumerate(keys)})
    return out


@pytest.mark.parametrize("plan", PLANS_CP_2 + PLANS_CP_4)
def test_cp_plans_match_reference(launched, plan):
    """cp=2 alone (world 2), with dp=2 and with tp=2 plus sequence parallelism (world 4):
    every rank embeds, attends (around the ring) and scores only its 2 of 2*cp chunks,
    yet losses, first-step gradients (summed over the dp-cp group) and weights after 3
    steps equal the whole-model reference's within the correctness suite's tolerances."""
    _check(launched[plan], plan)


def test_cp_llama_style_matches_reference(launched):
    """cp=2 on the Llama-style model (GQA, RoPE, RMSNorm, no biases, untied output): each
    rank rotates its Q and K by the positions of its own two chunks (load-balanced, not
    contiguous), so a wrong position would show as a different loss from the reference."""
    _check(launched["gqa-cp"], PLANS_CP_2[0], model=GQA)


def test_cp_bytes_and_time_recorded(launched):
    """Each cp=2 rank sends, per layer and microbatch, its K/V block once forward and
    its gradient once backward. tiny: seq 64 (32 positions per rank), K/V width 128 (4
    heads of 32, no GQA), 4 layers; block = 2 (K and V) x 4 (mbs) x 32 x 128 x 4 B =
    131,072 B, so a step sends 2 x 131,072 x 4 layers x 4 microbatches = 4,194,304 B
    (4 MiB) for cp=2 with mbs=4 (16 sequences / 4), half that, 2,097,152 B, with dp=2
    (2 microbatches per replica); the exchange's time is in the record's ``cp`` phase
    and its in-flight segments on the ``cp`` stream."""
    m = MODEL
    assert (m.seq_length, m.kv_hidden, m.num_layers, m.global_batch_size) == (64, 128, 4, 16)
    assert 2 * 4 * 32 * 128 * 4 == 131_072
    for plan, step_bytes in (("cp=2,mbs=4", 4_194_304), ("cp=2,dp=2,mbs=4", 2_097_152)):
        for w in launched[plan]:
            assert w["steps"][-1]["bytes_sent"]["cp"] == step_bytes
            assert w["steps"][-1]["phases_s"]["cp"] > 0
            assert any(s["stream"] == "cp" for s in w["segments"])


def test_cp_in_run_record_and_trace(launched):
    """The run record of a cp=2 run carries the exchange as its own phase and bytes kind,
    and its Chrome trace (the simulator's layout, reports/trace.py) puts the in-flight
    exchanges on each rank's 'cp' thread and the posting/waiting spans in category cp."""
    from reports.trace import STREAM_TID, trace_events
    from validate.record import RunRecord, timeline
    rec = RunRecord.from_workers(launched["cp=2,mbs=4"], model="tiny", plan="cp=2,mbs=4", backend="gloo", device="cpu",
                                 steps=3, warmup=0, seed=0)
    assert rec.phases_s["cp"] > 0 and all(r["bytes_sent"]["cp"] > 0 for r in rec.per_rank)
    assert [r["cp_rank"] for r in rec.per_rank] == [0, 1]
    ev = trace_events(timeline(rec))
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(0, "cp"), (1, "cp")} <= names
    on_cp = [e for e in ev if e["ph"] == "X" and e["tid"] == STREAM_TID["cp"]]
    assert {e["pid"] for e in on_cp} == {0, 1} and all(e["name"].startswith("cp ") for e in on_cp)
    assert any(e["cat"] == "cp" and e["tid"] == STREAM_TID["compute"] for e in ev if e["ph"] == "X")
