"""validate/saved_bytes.py counts what autograd keeps for backward, by hand."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from validate.saved_bytes import SavedBytes  # noqa: E402


def test_saved_tensors_counted_once_per_storage_and_released_by_backward():
    """x [4, 8] fp32 (128 B) times a parameter w [8, 8]: the GEMM keeps x and w (w left
    out: a parameter); h = x @ w (128 B) split into two column views q, k, whose product
    keeps both views: one storage, 128 B once. Peak 256 B, live 0 once backward has freed
    the graph."""
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    meter = SavedBytes([w])
    with meter.track():
        h = x @ w
        q, k = h[:, :4], h[:, 4:]
        loss = (q * k).sum()
        assert meter.live == 4 * 8 * 4 + 4 * 8 * 4
        loss.backward()
    assert meter.peak == 256 and meter.live == 0


def test_excluded_batch_and_a_saved_output():
    """A batch tensor named to the meter is not counted: the embedding lookup keeps only
    its token ids (ids [5] int64, excluded) and its table (a parameter); tanh keeps its
    own output, [5, 6] fp32 = 120 B: the peak."""
    emb = torch.nn.Parameter(torch.randn(10, 6))
    ids = torch.tensor([1, 2, 3, 4, 5])
    meter = SavedBytes([emb, ids])
    with meter.track():
        y = torch.tanh(torch.nn.functional.embedding(ids, emb))
        y.sum().backward()
    assert meter.peak == 5 * 6 * 4 and meter.live == 0
