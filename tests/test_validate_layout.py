"""The runner's bookkeeping, without processes: rank coordinates, layers per virtual
stage, and the Adam step against torch's own implementation."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specs.model import load_model  # noqa: E402
from specs.plan import resolve_plan  # noqa: E402
from validate.dp import ADAM_BETAS, ADAM_EPS, adam_update  # noqa: E402
from costmodel.shapes import ModelSpec  # noqa: E402
from validate.gpt import GPTChunk, all_params, full_weights, local_weight  # noqa: E402
from validate.runner import coords, vstage_layers  # noqa: E402

TINY = load_model("tiny")


@pytest.mark.parametrize("placement, expect", [
    # rank = t + tp*(s + pp*d) (tp-pp-dp) or t + tp*(d + dp*s) (tp-dp-pp), tp=pp=dp=2
    ("tp-pp-dp", {0: (0, 0, 0), 1: (0, 0, 1), 2: (0, 1, 0), 4: (1, 0, 0), 7: (1, 1, 1)}),
    ("tp-dp-pp", {0: (0, 0, 0), 1: (0, 0, 1), 2: (1, 0, 0), 4: (0, 1, 0), 7: (1, 1, 1)}),
])
def test_coords_invert_the_placement(placement, expect):
    """coords(rank) -> (dp_index, stage, tp_index) inverts Plan.rank for both placements
    (values worked out from the README formulas)."""
    plan = resolve_plan(f"tp=2,pp=2,dp=2,placement={placement}", TINY, 8)
    for rank, c in expect.items():
        assert coords(plan, rank) == c
    assert sorted(plan.rank(*coords(plan, r)) for r in range(8)) == list(range(8))


@pytest.mark.parametrize("plan, world, expect", [
    ("pp=2", 2, [[0, 1], [2, 3]]),
    ("pp=2,layers=1:3", 2, [[0], [1, 2, 3]]),
    # interleaved: virtual stage k = chunk*pp + stage; rank 0 holds stages 0 and 2
    ("pp=2,vpp=2", 2, [[0], [1], [2], [3]]),
    ("dp=4", 4, [[0, 1, 2, 3]]),
])
def test_layers_per_virtual_stage(plan, world, expect):
    """Layers go to virtual stages in model order, as many as Plan.chunk_layers says."""
    assert vstage_layers(resolve_plan(plan, TINY, world)) == expect


def test_tp_slices_reassemble_the_full_weights():
    """Every TP rank's slices, concatenated along the split dimension, are the full
    weights built from the seed; replicated weights are whole copies."""
    full = full_weights(TINY, 0)
    for spec in all_params(TINY):
        parts = [local_weight(full[spec.name], spec, 2, t) for t in range(2)]
        if spec.split_dim is None:
            assert all(torch.equal(p, full[spec.name]) for p in parts)
        else:
            assert torch.equal(torch.cat(parts, dim=spec.split_dim), full[spec.name])
    assert torch.equal(full_weights(TINY, 0)["l1.qkv.w"], full["l1.qkv.w"])  # seed decides
    assert not torch.equal(full_weights(TINY, 1)["l1.qkv.w"], full["l1.qkv.w"])


@pytest.mark.parametrize("groups", [None, 2])
def test_fused_qkv_rows_are_per_group_heads(groups):
    """The fused projection's rows are, per K/V group, its query heads, its key head, its
    value head (Megatron-Core's linear_qkv layout): the runner's attention output equals a
    head-by-head softmax(q k^T / sqrt(d) + causal mask) v written from that definition,
    with query head j using K/V group j // (heads / groups). MHA and GQA (4 heads, 2 groups)."""
    m = ModelSpec("t", 1, 16, 4, 6, 8, 1, num_query_groups=groups)
    w = full_weights(m, 3)
    w["l0.qkv.b"] = torch.randn(w["l0.qkv.b"].shape, generator=torch.Generator().manual_seed(1))
    chunk = GPTChunk(m, [0], True, True, w, None, False, "none", torch.device("cpu"))
    x = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(2))
    got = chunk._attention("l0.", x).detach()
    d, heads, g = 4, 4, m.kv_groups
    rep = heads // g
    y = x[0] @ w["l0.qkv.w"].t() + w["l0.qkv.b"]  # [s, groups x (rep + 2) x d]
    block = (rep + 2) * d
    outs = []
    for j in range(heads):
        grp = j // rep
        q = y[:, grp * block + (j % rep) * d: grp * block + (j % rep + 1) * d]
        k = y[:, grp * block + rep * d: grp * block + (rep + 1) * d]
        v = y[:, grp * block + (rep + 1) * d: grp * block + (rep + 2) * d]
        scores = q @ k.t() / d ** 0.5 + torch.triu(torch.full((6, 6), float("-inf")), 1)
        outs.append(torch.softmax(scores, -1) @ v)
    want = torch.cat(outs, -1) @ w["l0.o.w"].t() + w["l0.o.b"]
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)


def test_adam_matches_torch_optim_adam():
    """Our Adam step (one definition for runner and reference) equals torch.optim.Adam
    with the same hyper-parameters over 5 steps of changing gradients."""
    gen = torch.Generator().manual_seed(3)
    p0 = torch.randn(1000, generator=gen)
    ours, m, v = p0.clone(), torch.zeros(1000), torch.zeros(1000)
    theirs = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([theirs], lr=1e-3, betas=ADAM_BETAS, eps=ADAM_EPS)
    for step in range(1, 6):
        g = torch.randn(1000, generator=gen)
        adam_update(ours, g, m, v, step, lr=1e-3)
        theirs.grad = g.clone()
        opt.step()
    assert torch.allclose(ours, theirs.detach(), rtol=1e-6, atol=1e-9)
    assert not torch.allclose(ours, p0)


def test_adam_clamp_changes_no_update_where_v_is_zero():
    """Sparse gradients as top-k leaves them (9 of 10 entries exactly 0, some squaring to
    0 or to a subnormal), so v holds exact zeros and subnormals: the runner's Adam, which
    clamps v at FLT_MIN before its root (validate/dp.adam_update), gives parameters equal
    bit for bit to the same steps written here with the plain root (torch.optim.Adam's
    sqrt(v) / sqrt(1 - b2^t) + eps), within 1e-6 of torch.optim.Adam itself (whose own
    rounding differs by an ulp on a few entries), and the clamp did act (v < FLT_MIN on
    more than half the entries)."""
    from validate.dp import FLT_MIN
    gen = torch.Generator().manual_seed(5)
    n, lr = 4000, 1e-3
    b1, b2 = ADAM_BETAS
    p0 = torch.randn(n, generator=gen)
    ours, m, v = p0.clone(), torch.zeros(n), torch.zeros(n)
    plain, pm, pv = p0.clone(), torch.zeros(n), torch.zeros(n)
    theirs = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([theirs], lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=False)
    for step in range(1, 7):
        g = torch.randn(n, generator=gen) * (torch.rand(n, generator=gen) < 0.1)
        g[:20] = 1e-25  # squares to 1e-50: v underflows to 0 there
        g[20:40] = 1e-19  # (1 - b2) x 1e-38: a subnormal v
        adam_update(ours, g, m, v, step, lr=lr)
        pm = pm * b1 + (1 - b1) * g
        pv = torch.addcmul(pv * b2, g, g, value=1 - b2)
        plain = torch.addcdiv(plain, pm, pv.sqrt() / (1 - b2 ** step) ** 0.5 + ADAM_EPS,
                              value=-lr / (1 - b1 ** step))
        theirs.grad = g.clone()
        opt.step()
    assert (v < FLT_MIN).sum() > n // 2
    assert torch.equal(v, pv)
    assert torch.equal(ours, plain)
    assert torch.allclose(ours, theirs.detach(), rtol=1e-6, atol=1e-9)
    assert not torch.equal(ours, p0)


def test_topk_select_reuses_its_buffers_and_matches_plain_error_feedback():
    """validate/topk.select with one bucket's SelectBuffers over 4 steps of error feedback
    equals the plain definition written here with fresh tensors (acc = grad + residual;
    keep the k largest |acc|; the residual is acc with those zeroed): same kept indices,
    values and residual bit for bit; and every step writes into the same buffers
    (indices and values are views of one packed buffer; the residual is updated in place)."""
    from validate.topk import SelectBuffers, select
    gen = torch.Generator().manual_seed(11)
    n, k = 5000, 500
    bufs = SelectBuffers.like(torch.empty(n), k)
    ours, plain = None, torch.zeros(n)
    ptrs = set()
    for _ in range(4):
        g = torch.randn(n, generator=gen)
        idx, vals, ours = select(g, ours, k, bufs)
        ptrs.add((idx.data_ptr(), vals.data_ptr(), ours.data_ptr()))
        acc = g + plain
        keep = acc.abs().topk(k).indices
        plain = acc.clone()
        plain[keep] = 0.0
        assert torch.equal(torch.sort(idx.long()).values, torch.sort(keep).values)
        order = torch.argsort(idx.long())
        assert torch.equal(vals[order], acc[torch.sort(idx.long()).values])
        assert torch.equal(ours, plain)
    assert len(ptrs) == 1
    assert idx.data_ptr() == bufs.packed.data_ptr() and vals.data_ptr() == bufs.packed[k:].data_ptr()


def test_topk_select_lap_marks_each_step_and_changes_nothing():
    """select's ``lap`` callback (benchmarks/topk_gap.py times the steps with it) is called
    once after each of SELECT_STEPS, and a selection with it returns the same indices,
    values and residual, bit for bit, as the same selection without it."""
    from validate.topk import SELECT_STEPS, SelectBuffers, select
    gen = torch.Generator().manual_seed(5)
    n, k = 3000, 300
    g, r = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    calls = []
    a = select(g, r.clone(), k, SelectBuffers.like(g, k), lap=lambda: calls.append(1))
    b = select(g, r.clone(), k, SelectBuffers.like(g, k))
    assert len(calls) == len(SELECT_STEPS) == 5
    for x, y in zip(a, b):
        assert torch.equal(x, y)
