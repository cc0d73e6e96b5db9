"""The validator's ring attention as the cost model lists it (costmodel/context_parallel.
ring_piece_ops, runtime cp_attention_pieces): the op counts against the runner's own code,
counted by a torch dispatch mode."""
from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from costmodel.context_parallel import ring_piece_ops  # noqa: E402
from costmodel.flops import matmul_flops  # noqa: E402
from costmodel.shapes import ModelSpec  # noqa: E402
from validate.cp import attend_block, cp_chunk_ids  # noqa: E402

# Operations that only make a view of their input: no work of their own.
VIEWS = {"view", "_unsafe_view", "transpose", "t", "unsqueeze", "squeeze", "slice", "select", "expand",
         "alias", "detach", "as_strided", "unbind"}


def _runner_ops(cp: int, index: int, heads: int, tokens: int, d: int) -> tuple[int, int, int]:
    """(forward ops, backward ops, bmm calls) of one layer's ring attention on rank
    ``index`` of a cp group, run through validate/cp.attend_block step by step as
    Ring.attend does (the K/V exchange left out: it computes nothing)."""
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
            attend_block(qs, k, v, mine, cp_chunk_ids(cp, (index - step) % cp), acc)
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
