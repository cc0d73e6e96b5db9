"""The validator's ring attention as the cost model lists it (costmodel/context_parallel.
ring_piece_ops, runtime cp_attention_pieces): the op counts against the runner's own code,
counted by a torch dispatch mode."""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from costmodel.context_parallel import recomputed_piece_ops, ring_piece_ops  # noqa: E402
from costmodel.flops import matmul_flops  # noqa: E402
from costmodel.shapes import ModelSpec  # noqa: E402
from validate.cp import attend_block, cp_chunk_ids  # noqa: E402

# Operations that only make a view of their input: no work of their own.
VIEWS = {"view", "_unsafe_view", "transpose", "t", "unsqueeze", "squeeze", "slice", "select", "expand",
         "alias", "detach", "as_strided", "unbind"}


def _runner_ops(cp: int, index: int, heads: int, tokens: int, d: int, ckpt=None) -> tuple[int, int, int]:
    """(forward ops, backward ops, bmm calls) of one layer's ring attention on rank
    ``index`` of a cp group, run through validate/cp.attend_block step by step as
    Ring.attend does (the K/V exchange left out: it computes nothing); ``ckpt``: each
    piece checkpointed, as under selective recompute."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.c = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.c[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    q, k, v = (torch.randn(1, heads, tokens, d, requires_grad=True) for _ in range(3))
    half = tokens // 2
    mine = cp_chunk_ids(cp, index)
    acc = [(None, None), (None, None)]
    with Count() as f:
        qs = (q[:, :, :half], q[:, :, half:])
        for step in range(cp):
            attend_block(qs, k, v, mine, cp_chunk_ids(cp, (index - step) % cp), acc, ckpt)
        out = torch.cat([acc[0][0], acc[1][0]], dim=2)
    grad = torch.ones_like(out)
    with Count() as b:
        out.backward(grad)
    work = lambda c: sum(n for name, n in c.items() if name not in VIEWS)  # noqa: E731
    return work(f.c), work(b.c), f.c["bmm"] + b.c["bmm"]


@pytest.mark.parametrize("cp", [2, 3, 4])
@pytest.mark.parametrize("index", [0, 1])
def test_piece_ops_count_what_the_runner_runs(cp, index):
    """Two independent counts agree: the cost model's list for one layer (forward 28cp + 5
    ops, backward 80cp - 5, of which 2(2cp + 1) and 4(2cp + 1) batched matmuls) and a torch
    dispatch mode's count of the runner's own attend_block over the cp steps (views left
    out), on every rank of the group (the load-balanced chunks give each the same work)."""
    model = ModelSpec("m", 1, 4 * 32, 4, 16 * cp, 512, 8)  # 4 heads of 32, 8 tokens a chunk
    local_tokens = model.seq_length // cp
    fwd, bwd = ring_piece_ops(ModelSpec("m", 1, 128, 4, local_tokens, 512, 8), 1, 1, cp, 4)
    got_f, got_b, got_mm = _runner_ops(cp, index, 4, local_tokens, 32)
    assert (len(fwd), len(bwd)) == (got_f, got_b) == (28 * cp + 5, 80 * cp - 5)
    assert sum(o.kind == "attention" for o in fwd + bwd) == got_mm == 6 * (2 * cp + 1)


def test_piece_flops_by_hand():
    """cp=2, one query head group of 4 heads of 32, 8-token chunks: each of the 2cp+1 = 5
    pieces does two 8x8x32 batched matmuls forward (2 x 4 x 8 x 8 x 32 FLOPs each) and four
    backward: 5 x 2 x 16,384 = 163,840 forward, twice that backward."""
    fwd, bwd = ring_piece_ops(ModelSpec("m", 1, 128, 4, 16, 512, 8), 1, 1, 2, 4)
    assert matmul_flops(fwd) == 5 * 2 * (2 * 4 * 8 * 8 * 32) == 163_840
    assert matmul_flops(bwd) == 2 * 163_840


@pytest.mark.parametrize("cp", [2, 3])
def test_checkpointed_pieces_recompute_their_forward(cp):
    """Selective recompute with the runner's pieces (validate/cp.Ring.attend checkpoints
    each piece): backward runs every piece's forward again up to the tensors its backward
    saved, the merges excepted. By hand, a piece's forward is Q K^T, the scale,
    log-sum-exp, the subtraction, exp and the product with V, and the two diagonal pieces
    also build and apply a mask (3 ops each); torch's non-reentrant checkpoint stops before
    the last product (its inputs, exp's output and V, are all it needs), so 5(2cp + 1) + 6
    = 31 ops at cp=2, 41 at cp=3. The runner's backward grows by exactly that many, and
    the cost model's recomputed list (recomputed_piece_ops, which cp_layer_work adds to
    each block's backward) has as many."""
    from torch.utils.checkpoint import checkpoint

    def ckpt(fn, *args, **kw):
        return checkpoint(fn, *args, **kw)
    _, plain_b, _ = _runner_ops(cp, 0, 4, 16, 8)
    _, ckpt_b, _ = _runner_ops(cp, 0, 4, 16, 8, ckpt)
    fwd, _ = ring_piece_ops(ModelSpec("m", 1, 32, 4, 16 * cp, 512, 8), 1, 1, cp, 4)
    redo = recomputed_piece_ops(fwd)
    assert len(redo) == 5 * (2 * cp + 1) + 6 == {2: 31, 3: 41}[cp]
    assert ckpt_b - plain_b == len(redo)


def test_checkpointed_pieces_pay_a_region_each():
    """Under selective recompute with pieces, the host cost of a checkpointed region is paid
    2cp + 1 times a layer and microbatch (once per piece) and not again for the layer's
    core attention: tiny at cp=2, a 4-layer chunk, 500 us a region: its backward grows by
    4 x 5 x 500 us = 10 ms against the same profile with no region cost, by hand."""
    from dataclasses import replace as _replace

    from engine_fixtures import worker_profile
    from sim.program import chunk_work
    from specs.plan import resolve_plan
    from specs.topology import load_topology
    tiny = ModelSpec("tiny", 4, 128, 4, 64, 512, 16)
    base = worker_profile(cp_attention_pieces=True)
    costly = _replace(base, runtime=_replace(base.runtime, checkpoint_selective_region_us=500.0))
    cluster = load_topology("localhost-cpu", gpus_per_node=2)
    plan = resolve_plan("cp=2,recompute=selective,precision=fp32", tiny, 2)
    a = chunk_work(tiny, plan, cluster, base, 0, 4, True, True)
    b = chunk_work(tiny, plan, cluster, costly, 0, 4, True, True)
    assert b.bwd_s - a.bwd_s == pytest.approx(4 * 5 * 500e-6, rel=1e-9)
    assert b.fwd_s == a.fwd_s
